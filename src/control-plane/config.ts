/** The control plane's configuration: every flag and env var, validated once at boot. */
import { z } from "zod";
import { ClusterId, Dns1123Label } from "./api.js";
import { Token, duplicates } from "./tokens.js";

export { Token };

/** A namespace deployment requests may name, or `*` for any. */
export const NamespacePattern = z.union([z.literal("*"), Dns1123Label]);

export const ControlPlaneConfig = z
  .object({
    dbPath: z.string().min(1),
    port: z.int().min(0).max(65535).default(8090),
    host: z.string().min(1).default("127.0.0.1"),
    /** Registration tokens given directly, each bound to one cluster id. */
    clusterTokens: z.array(z.object({ clusterId: ClusterId, token: Token })).default([]),
    /** A file of `ID=TOKEN` lines, re-read when it changes. */
    clusterTokenFile: z.string().min(1).optional(),
    operatorToken: Token,
    /** Namespaces deployment requests may target (`*`: any). */
    allowedNamespaces: z.array(NamespacePattern).min(1).default(["default"]),
    /** Serve HTTPS with this certificate and key (PEM files, reloaded when they change). */
    tlsCertFile: z.string().min(1).optional(),
    tlsKeyFile: z.string().min(1).optional(),
    credentialTtlSeconds: z
      .int()
      .min(1)
      .max(7 * 24 * 3600)
      .default(3600),
    visibilityTimeoutSeconds: z.int().min(0).max(43_200).default(30),
    heartbeatIntervalSeconds: z.int().min(1).max(3600).default(30),
    /** Largest request body accepted; bigger ones get 413. */
    maxBodyBytes: z
      .int()
      .min(1024)
      .max(64 * 1024 * 1024)
      .default(1024 * 1024),
  })
  .superRefine((c, ctx) => {
    if (c.clusterTokens.length === 0 && !c.clusterTokenFile) {
      ctx.addIssue({
        code: "custom",
        path: ["clusterTokens"],
        message:
          "at least one cluster token is needed (--cluster-token ID=TOKEN, WARMSTART_CLUSTER_TOKENS or --cluster-token-file)",
      });
    }
    for (const problem of duplicates(c.clusterTokens))
      ctx.addIssue({ code: "custom", path: ["clusterTokens"], message: problem });
    if (c.clusterTokens.some((e) => e.token === c.operatorToken)) {
      ctx.addIssue({
        code: "custom",
        path: ["operatorToken"],
        message: "the operator token must differ from every cluster token",
      });
    }
    if ((c.tlsCertFile === undefined) !== (c.tlsKeyFile === undefined)) {
      ctx.addIssue({
        code: "custom",
        path: ["tlsCertFile"],
        message: "TLS needs both a certificate file and a key file",
      });
    }
  });

export type ControlPlaneConfigInput = z.input<typeof ControlPlaneConfig>;
export type ControlPlaneConfig = z.output<typeof ControlPlaneConfig>;

/** Parses the config or throws one readable error naming each bad setting. */
export function parseConfig(input: unknown): ControlPlaneConfig {
  const r = ControlPlaneConfig.safeParse(input);
  if (r.success) return r.data;
  const lines = r.error.issues.map((i) => `${i.path.length ? i.path.join(".") : "config"}: ${i.message}`);
  throw new Error(`invalid control plane configuration: ${lines.join("; ")}`);
}

/** Whether deployment requests may target `namespace`. */
export function namespaceAllowed(allowed: readonly string[], namespace: string): boolean {
  return allowed.includes("*") || allowed.includes(namespace);
}

/** Renew a credential when a quarter of its life is left (at least one second before expiry). */
export function renewBeforeSeconds(ttlSeconds: number): number {
  return Math.max(1, Math.floor(ttlSeconds / 4));
}
