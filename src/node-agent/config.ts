import { isAbsolute } from "node:path";
import { z } from "zod";
import { durationMs } from "../common/duration.js";
import { SYSTEM_NAMESPACE } from "../common/kube.js";

const UNITS: Record<string, number> = {
  "": 1,
  k: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  Ki: 2 ** 10,
  Mi: 2 ** 20,
  Gi: 2 ** 30,
  Ti: 2 ** 40,
};

/** Byte sizes like "500Gi", "2T", "1.5Gi" or plain bytes (Kubernetes quantity suffixes). */
export const byteSize = z.union([z.number(), z.string()]).transform((v, ctx) => {
  if (typeof v === "number") return Math.round(v);
  const m = /^(\d+(?:\.\d+)?)\s*(k|M|G|T|Ki|Mi|Gi|Ti)?B?$/.exec(v.trim());
  if (!m) {
    ctx.addIssue({ code: "custom", message: `not a size: "${v}" (use e.g. 500Gi, 2T or bytes)` });
    return z.NEVER;
  }
  return Math.round(Number(m[1]) * UNITS[m[2] ?? ""]!);
});

const absolute = (what: string): z.ZodString =>
  z
    .string({ error: `is required (${what})` })
    .min(1)
    .refine(isAbsolute, { message: "must be an absolute path" });

const bool = z
  .union([z.boolean(), z.enum(["true", "false", "1", "0"])])
  .transform((v) => v === true || v === "true" || v === "1");

/** Every setting of the node agent, validated once at boot (flags, then env, then defaults). */
export const NodeAgentConfig = z.object({
  node: z.string({ error: "is required (or env NODE_NAME)" }).min(1),
  kubeletRoot: absolute("the kubelet's root directory as mounted here"),
  store: absolute("the node's cache store directory"),
  /** `namespace/name` of the claim the store directory is mounted from (shared-volume, snapshot-clone). */
  storeClaim: z
    .string()
    .regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?\/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$/, "must be namespace/name")
    .optional(),
  /** The storage profile key of the store; by default the store claim's provisioner, or host-path. */
  storeProvisioner: z.string().min(1).optional(),
  storeVolumeType: z.string().min(1).optional(),
  /** How long a leader must stay Ready before its cache is captured. */
  warmupMs: durationMs.default(30_000),
  /** Captures at once on this node. */
  concurrency: z.coerce.number().int().min(1).max(64).default(2),
  /** Files copied at once within one capture. */
  captureParallel: z.coerce.number().int().min(1).max(256).default(8),
  /** A capture taking longer than this fails cleanly (nothing committed); 0: no limit. */
  captureDeadlineMs: durationMs.default(30 * 60_000),
  /**
   * Bytes the store may hold (0: no limit). A capture that needs room removes caches no pod
   * mounts, least recently restored first; a cache in use is never removed.
   */
  storeBudget: byteSize.default(0),
  /** Flush captured data to disk before committing (off only for throwaway stores). */
  durable: bool.default(true),
  host: z.string().default("0.0.0.0"),
  port: z.coerce.number().int().min(0).max(65535).default(9464),
  systemNamespace: z.string().default(SYSTEM_NAMESPACE),
  /** How often everything is looked at again: pods on the node, and the claims of the caches promoted here. */
  resyncMs: durationMs.default(60_000),
  claimAttempts: z.coerce.number().int().min(1).max(20).default(5),
  claimBackoffMs: durationMs.default(200),
  snapshotTimeoutMs: durationMs.default(600_000),
});
export type NodeAgentConfig = z.infer<typeof NodeAgentConfig>;

export function loadNodeAgentConfig(flags: Record<string, unknown>, env = process.env): NodeAgentConfig {
  const fromEnv = {
    node: env.NODE_NAME,
    kubeletRoot: env.WARMSTART_KUBELET_ROOT,
    store: env.WARMSTART_STORE,
    storeClaim: env.WARMSTART_STORE_CLAIM,
    storeProvisioner: env.WARMSTART_STORE_PROVISIONER,
    warmupMs: env.WARMSTART_WARMUP,
    concurrency: env.WARMSTART_CAPTURE_CONCURRENCY,
    captureDeadlineMs: env.WARMSTART_CAPTURE_DEADLINE,
    storeBudget: env.WARMSTART_STORE_BUDGET,
    port: env.WARMSTART_NODE_AGENT_PORT,
  };
  const merged: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(fromEnv)) if (v !== undefined && v !== "") merged[k] = v;
  for (const [k, v] of Object.entries(flags)) if (v !== undefined) merged[k] = v;
  const parsed = NodeAgentConfig.safeParse(merged);
  if (!parsed.success) {
    const first = parsed.error.issues[0]!;
    const flag = first.path
      .join(".")
      .replace(/[A-Z]/g, (c) => `-${c.toLowerCase()}`)
      .replace(/-ms$/, "");
    throw new Error(`invalid node-agent config: --${flag || "value"}: ${first.message}`);
  }
  return parsed.data;
}
