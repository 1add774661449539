/** The control plane's configuration: every flag and env var, validated once at boot. */
import { z } from "zod";

/** Bearer tokens: token68 characters (so they travel in a header and in a comma-separated env). */
const Token = z
  .string()
  .min(16, { message: "must be at least 16 characters" })
  .max(512)
  .regex(/^[A-Za-z0-9._~+/=-]+$/, { message: "may only hold letters, digits and . _ ~ + / = -" });

export const ControlPlaneConfig = z
  .object({
    dbPath: z.string().min(1),
    port: z.int().min(0).max(65535).default(8090),
    host: z.string().min(1).default("127.0.0.1"),
    clusterTokens: z.array(Token).min(1, {
      message: "at least one cluster token is needed (--cluster-token or WARMSTART_CLUSTER_TOKENS)",
    }),
    operatorToken: Token,
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
  .refine((c) => !c.clusterTokens.includes(c.operatorToken), {
    message: "the operator token must differ from every cluster token",
    path: ["operatorToken"],
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

/** Renew a credential when a quarter of its life is left (at least one second before expiry). */
export function renewBeforeSeconds(ttlSeconds: number): number {
  return Math.max(1, Math.floor(ttlSeconds / 4));
}
