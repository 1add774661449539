import { z } from "zod";
import { SYSTEM_NAMESPACE } from "../common/kube.js";
import { HOST_PATH_PROVISIONER } from "../core/contract.js";
import { SHARING_SCOPES } from "../core/scope.js";
import { quantityBytes } from "../core/size.js";

const bool = z
  .union([z.boolean(), z.enum(["true", "false", "1", "0"])])
  .transform((v) => v === true || v === "true" || v === "1");

/** Durations like "60m", "90s", "2h" (or plain seconds). */
export const duration = z.union([z.number(), z.string()]).transform((v, ctx) => {
  if (typeof v === "number") return v;
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(v.trim());
  if (!m) {
    ctx.addIssue({ code: "custom", message: `not a duration: "${v}" (use e.g. 90s, 60m, 2h)` });
    return z.NEVER;
  }
  const n = Number(m[1]);
  return n * { ms: 0.001, s: 1, m: 60, h: 3600 }[(m[2] ?? "s") as "ms" | "s" | "m" | "h"];
});

const quantity = z
  .string()
  .trim()
  .refine((q) => quantityBytes(q) !== undefined, { message: "not a size (use e.g. 200Gi, 1Ti)" });

const names = z
  .union([z.array(z.string()), z.string()])
  .transform((v) => (Array.isArray(v) ? v : v.split(",")).map((s) => s.trim()).filter(Boolean));

/** Every setting of the webhook, validated once at boot (flags first, then env, then defaults). */
export const WebhookConfig = z
  .object({
    host: z.string().default("0.0.0.0"),
    port: z.coerce.number().int().min(0).max(65535).default(8443),
    certFile: z.string().optional(),
    keyFile: z.string().optional(),
    /** CA bundle the API server uses to trust us (defaults to the generated CA, or the cert itself). */
    caFile: z.string().optional(),
    /**
     * CA that signs the API server's client certificate: with it, /mutate answers only callers that
     * present a certificate it signed; without it, anyone who reaches the port.
     */
    clientCaFile: z.string().optional(),
    /** Accepted client certificate names (CN or DNS SAN); empty: any certificate the CA signed. */
    clientNames: names.default([]),
    /** Where the API server reaches us; with it, the webhook registers itself (local clusters, dev). */
    registerUrl: z.url().optional(),
    configurationName: z.string().default("warmstart"),
    timeoutSeconds: z.coerce.number().int().min(1).max(30).default(5),
    electionEnabled: bool.default(false),
    electionDeadline: duration.default(3600),
    /**
     * Failed captures of one hash (the record's `status.failedCaptures`) after which its pods are
     * admitted cold, until `warmstart cache retry` clears the count.
     */
    maxFailedCaptures: z.coerce.number().int().min(1).default(3),
    /**
     * Who shares a cache (a cache is never seen outside its scope): the whole cluster, each
     * namespace, or namespaces of one share-group.
     */
    sharingScope: z.enum(SHARING_SCOPES as ["cluster", "namespace", "group"]).default("cluster"),
    systemNamespace: z.string().default(SYSTEM_NAMESPACE),
    image: z.string().default("ghcr.io/warmstart/warmstart:0.1.0"),
    cacheRoot: z.string().default("/warmstart/cache-root"),
    /** The leader's capture volume limit, unless the pod asks otherwise (`warmstart.dev/cache-size-limit`). */
    cacheSizeLimit: quantity.default("200Gi"),
    /** The most a pod may ask for. */
    maxCacheSizeLimit: quantity.default("1Ti"),
    /** The storage profile key of the node agents' cache stores (as their --store-provisioner): followers prewarm by it. */
    storeProvisioner: z.string().min(1).default(HOST_PATH_PROVISIONER),
    storeVolumeType: z.string().min(1).optional(),
    maxBodyBytes: z.coerce
      .number()
      .int()
      .min(1024)
      .default(3 * 1024 * 1024),
    /** Event posting is asynchronous; this bounds the backlog so a slow API server cannot grow memory. */
    maxPendingEvents: z.coerce.number().int().min(0).default(1000),
    /** How long a namespace's labels and the cache-env ConfigMap are reused before being read again. */
    lookupTtlSeconds: z.coerce.number().min(0).default(5),
  })
  .refine((c) => quantityBytes(c.cacheSizeLimit)! <= quantityBytes(c.maxCacheSizeLimit)!, {
    message: "the default cache size limit is above the maximum",
    path: ["cacheSizeLimit"],
  });
export type WebhookConfig = z.infer<typeof WebhookConfig>;

export function loadWebhookConfig(flags: Record<string, unknown>, env = process.env): WebhookConfig {
  const fromEnv = {
    port: env.WARMSTART_WEBHOOK_PORT,
    certFile: env.WARMSTART_WEBHOOK_CERT,
    keyFile: env.WARMSTART_WEBHOOK_KEY,
    registerUrl: env.WARMSTART_WEBHOOK_REGISTER_URL,
    clientCaFile: env.WARMSTART_WEBHOOK_CLIENT_CA,
    clientNames: env.WARMSTART_WEBHOOK_CLIENT_NAMES,
    sharingScope: env.WARMSTART_SHARING_SCOPE,
    maxFailedCaptures: env.WARMSTART_MAX_FAILED_CAPTURES,
    cacheSizeLimit: env.WARMSTART_CACHE_SIZE_LIMIT,
    maxCacheSizeLimit: env.WARMSTART_MAX_CACHE_SIZE_LIMIT,
    electionEnabled: env.WARMSTART_ELECTION_ENABLED,
    electionDeadline: env.WARMSTART_ELECTION_DEADLINE,
    image: env.WARMSTART_IMAGE,
    storeProvisioner: env.WARMSTART_STORE_PROVISIONER,
    storeVolumeType: env.WARMSTART_STORE_VOLUME_TYPE,
  };
  const merged: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(fromEnv)) if (v !== undefined && v !== "") merged[k] = v;
  for (const [k, v] of Object.entries(flags)) if (v !== undefined) merged[k] = v;
  const parsed = WebhookConfig.safeParse(merged);
  if (!parsed.success) {
    const first = parsed.error.issues[0]!;
    throw new Error(`invalid webhook config: ${first.path.join(".") || "value"}: ${first.message}`);
  }
  return parsed.data;
}
