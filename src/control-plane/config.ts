/** The control plane's configuration: every flag and env var, validated once at boot. */
import { z } from "zod";
import {
  ConfigError,
  collect,
  defineOptions,
  intOption,
  listOption,
  optionName,
  type OptionDef,
} from "../common/options.js";
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

/**
 * The `control-plane` command's options: flag, env, default, help and schema. The cluster tokens
 * and the operator token file are resolved after this (`serveConfig` in cli.ts), then the whole
 * config is checked once more by `ControlPlaneConfig`, with problems named by flag and variable.
 */
export const CONTROL_PLANE_OPTIONS = {
  dbPath: {
    flag: "--db <file>",
    env: "WARMSTART_CONTROL_PLANE_DB",
    default: "warmstart-control-plane.db",
    doc: "SQLite database file, created owner-only",
    schema: z.string().min(1),
  },
  port: {
    flag: "--port <n>",
    default: 8090,
    doc: "port to listen on (0: any free port)",
    schema: intOption(0, 65535),
  },
  host: {
    flag: "--host <addr>",
    default: "127.0.0.1",
    doc: "address to listen on",
    schema: z.string().min(1),
  },
  clusterTokens: {
    flag: "--cluster-token <id=token>",
    env: "WARMSTART_CLUSTER_TOKENS",
    doc: "registration token of one cluster, as CLUSTER_ID=TOKEN; repeatable (env: comma-separated)",
    argParser: collect,
    schema: listOption.optional(),
  },
  clusterId: {
    flag: "--cluster-id <id>",
    env: "WARMSTART_CLUSTER_ID",
    doc: "the cluster a bare --cluster-token TOKEN belongs to",
    schema: z.string().min(1).optional(),
  },
  clusterTokenFile: {
    flag: "--cluster-token-file <file>",
    env: "WARMSTART_CLUSTER_TOKEN_FILE",
    doc: "CLUSTER_ID=TOKEN lines, re-read when the file changes; manage with `control-plane cluster-token`",
    schema: z.string().min(1).optional(),
  },
  operatorToken: {
    flag: "--operator-token <token>",
    env: "WARMSTART_OPERATOR_TOKEN",
    doc: "operator token",
    schema: z.string().optional(),
  },
  operatorTokenFile: {
    flag: "--operator-token-file <file>",
    doc: "read the operator token here; minted and written (owner-only) on first start",
    schema: z.string().min(1).optional(),
  },
  allowedNamespaces: {
    flag: "--allowed-namespaces <list>",
    env: "WARMSTART_ALLOWED_NAMESPACES",
    default: "default",
    doc: "comma-separated namespaces deployment requests may target, * for any",
    schema: listOption.pipe(z.array(NamespacePattern).min(1)),
  },
  tlsCertFile: {
    flag: "--tls-cert-file <file>",
    env: "WARMSTART_TLS_CERT_FILE",
    doc: "serve HTTPS with this PEM certificate",
    schema: z.string().min(1).optional(),
  },
  tlsKeyFile: {
    flag: "--tls-key-file <file>",
    env: "WARMSTART_TLS_KEY_FILE",
    doc: "and this PEM key",
    schema: z.string().min(1).optional(),
  },
  credentialTtlSeconds: {
    flag: "--credential-ttl <seconds>",
    default: 3600,
    doc: "lifetime of queue credentials",
    schema: intOption(1, 7 * 24 * 3600),
  },
  visibilityTimeoutSeconds: {
    flag: "--visibility-timeout <seconds>",
    default: 30,
    doc: "default visibility timeout of received messages",
    schema: intOption(0, 43_200),
  },
  heartbeatIntervalSeconds: {
    flag: "--heartbeat-interval <seconds>",
    default: 30,
    doc: "heartbeat interval told to agents",
    schema: intOption(1, 3600),
  },
};

export const controlPlaneOptions = defineOptions("control-plane", CONTROL_PLANE_OPTIONS);
export type ControlPlaneOptions = ReturnType<typeof controlPlaneOptions.load>;

/** Like `parseConfig`, with every problem named by the flag and variable that set it. */
export function checkServeConfig(input: ControlPlaneConfigInput): ControlPlaneConfig {
  const r = ControlPlaneConfig.safeParse(input);
  if (r.success) return r.data;
  const table: Record<string, OptionDef> = CONTROL_PLANE_OPTIONS;
  throw new ConfigError(
    "control-plane",
    r.error.issues.map((i) => {
      const key = String(i.path[0] ?? "");
      const given = (input as Record<string, unknown>)[key] !== undefined;
      return `${optionName(key, table[key])}: ${i.code === "invalid_type" && !given ? "is required" : i.message}`;
    }),
  );
}
