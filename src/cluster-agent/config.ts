/**
 * The cluster agent's configuration: every flag and environment variable in one table, merged
 * (flag over env over default) and validated once at boot.
 */
import { z } from "zod";
import { ClusterId, Dns1123Label } from "../control-plane/api.js";
import { SYSTEM_NAMESPACE } from "../common/kube.js";
import { parseSelector, type Requirement } from "./selector.js";

export const CREDENTIALS_SECRET = "warmstart-cluster-agent-credentials";
export const GPU_TYPE_OVERRIDE_LABEL = "warmstart.dev/gpu-type";

/** `250ms`, `30s`, `5m`, `1h`, `1m30s`; a bare number is seconds. */
export function parseDuration(input: string | number): number {
  if (typeof input === "number") {
    if (!Number.isFinite(input) || input < 0) throw new Error(`invalid duration ${input}`);
    return input * 1000;
  }
  const s = input.trim();
  if (/^\d+(\.\d+)?$/.test(s)) return Number(s) * 1000;
  const unit: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };
  let total = 0;
  let rest = s;
  while (rest !== "") {
    const m = rest.match(/^(\d+(?:\.\d+)?)(ms|s|m|h)/);
    if (!m) throw new Error(`invalid duration "${input}" (use e.g. 500ms, 30s, 5m, 1h)`);
    total += Number(m[1]) * unit[m[2]!]!;
    rest = rest.slice(m[0].length);
  }
  if (s === "") throw new Error("empty duration");
  return Math.round(total);
}

const Duration = z.union([z.string(), z.number()]).transform((v, ctx) => {
  try {
    return parseDuration(v);
  } catch (err) {
    ctx.addIssue({ code: "custom", message: (err as Error).message });
    return z.NEVER;
  }
});

const positive = (d: z.ZodType<number>, what: string): z.ZodType<number> =>
  d.refine((ms) => ms > 0, { message: `${what} must be greater than zero` });

const Bool = z.union([z.boolean(), z.string()]).transform((v, ctx) => {
  if (typeof v === "boolean") return v;
  const s = v.trim().toLowerCase();
  if (["1", "true", "yes", "on"].includes(s)) return true;
  if (["0", "false", "no", "off"].includes(s)) return false;
  ctx.addIssue({ code: "custom", message: `expected true or false, got "${v}"` });
  return z.NEVER;
});

const Int = (min: number, max: number): z.ZodType<number, string | number> =>
  z
    .union([
      z.number(),
      z
        .string()
        .regex(/^\s*-?\d+\s*$/, { message: "expected a whole number" })
        .transform(Number),
    ])
    .pipe(z.int().min(min).max(max));

/** A comma-separated list of namespaces (or an array of them). */
const NamespaceList = z
  .union([z.string(), z.array(z.string())])
  .transform((v) => (Array.isArray(v) ? v : v.split(",")).map((s) => s.trim()).filter(Boolean))
  .pipe(
    z
      .array(Dns1123Label)
      .min(1, { message: "name at least one namespace" })
      .max(256)
      .refine((ns) => new Set(ns).size === ns.length, { message: "each namespace may appear once" }),
  );

const Selector = z.string().transform((v, ctx) => {
  try {
    return { text: v.trim(), requirements: parseSelector(v) };
  } catch (err) {
    ctx.addIssue({ code: "custom", message: (err as Error).message });
    return z.NEVER;
  }
});

export const AgentConfigSchema = z
  .object({
    controlPlaneUrl: z.url({ protocol: /^https?$/, message: "must be an http(s) URL" }),
    /** PEM CA to trust for an https control plane. */
    controlPlaneCaFile: z.string().min(1).optional(),
    clusterToken: z.string().min(1, { message: "is required" }),
    clusterId: ClusterId,
    clusterName: z.string().min(1).max(253).optional(),
    kubeconfig: z.string().min(1).optional(),
    namespace: Dns1123Label.default(SYSTEM_NAMESPACE),
    workloadNamespace: Dns1123Label.optional(),
    /** The only namespaces workloads are created in (the agent's RBAC covers these). */
    namespaces: NamespaceList.optional(),
    secretName: Dns1123Label.default(CREDENTIALS_SECRET),
    secretNamespace: Dns1123Label.optional(),
    nodeSelector: Selector.default({ text: "", requirements: [] }),
    gpuTypeLabel: z.string().min(1).default(GPU_TYPE_OVERRIDE_LABEL),
    gpuPollInterval: positive(Duration, "gpu poll interval").default(60_000),
    debounce: Duration.default(30_000),
    backoffCap: positive(Duration, "backoff cap").default(300_000),
    refreshInterval: positive(Duration, "refresh interval").default(600_000),
    renewBefore: positive(Duration, "renew-before").optional(),
    heartbeatInterval: positive(Duration, "heartbeat interval").optional(),
    queueWait: Duration.refine((ms) => ms <= 20_000, { message: "queue wait is at most 20s" }).default(
      20_000,
    ),
    queueBatch: Int(1, 10).default(5),
    visibilityTimeout: positive(Duration, "visibility timeout")
      .refine((ms) => ms <= 43_200_000, { message: "visibility timeout is at most 12h" })
      .default(300_000),
    statusInterval: positive(Duration, "status interval").default(15_000),
    gracefulNoGpu: Bool.default(true),
    listenHost: z.string().min(1).default("0.0.0.0"),
    port: Int(0, 65535).default(8080),
  })
  .superRefine((c, ctx) => {
    if (c.workloadNamespace && c.namespaces && !c.namespaces.includes(c.workloadNamespace)) {
      ctx.addIssue({
        code: "custom",
        path: ["workloadNamespace"],
        message: `is not one of the namespaces (${c.namespaces.join(", ")})`,
      });
    }
  })
  .transform((c) => ({
    ...c,
    secretNamespace: c.secretNamespace ?? c.namespace,
    namespaces: c.namespaces ?? [c.workloadNamespace ?? "default"],
  }));

export type AgentConfig = z.output<typeof AgentConfigSchema>;
export type AgentConfigInput = z.input<typeof AgentConfigSchema>;
export type { Requirement };

/** One row per setting: its flag, its environment variable and its help. */
export interface OptionSpec {
  key: keyof AgentConfigInput;
  flag: string;
  env: string;
  help: string;
  defaultText?: string;
}

export const OPTIONS: readonly OptionSpec[] = [
  {
    key: "controlPlaneUrl",
    flag: "--control-plane-url <url>",
    env: "WARMSTART_CONTROL_PLANE_URL",
    help: "control plane base URL",
  },
  {
    key: "controlPlaneCaFile",
    flag: "--control-plane-ca-file <file>",
    env: "WARMSTART_CONTROL_PLANE_CA_FILE",
    help: "PEM CA to trust for an https control plane",
  },
  {
    key: "clusterToken",
    flag: "--cluster-token <token>",
    env: "WARMSTART_CLUSTER_TOKEN",
    help: "token for registration (prefer the env var)",
  },
  {
    key: "clusterId",
    flag: "--cluster-id <id>",
    env: "WARMSTART_CLUSTER_ID",
    help: "this cluster's id at the control plane",
  },
  { key: "clusterName", flag: "--cluster-name <name>", env: "WARMSTART_CLUSTER_NAME", help: "display name" },
  {
    key: "kubeconfig",
    flag: "--kubeconfig <path>",
    env: "KUBECONFIG",
    help: "kubeconfig (default: in-cluster)",
  },
  {
    key: "namespace",
    flag: "--namespace <ns>",
    env: "WARMSTART_NAMESPACE",
    help: "the agent's namespace (request records)",
    defaultText: SYSTEM_NAMESPACE,
  },
  {
    key: "workloadNamespace",
    flag: "--workload-namespace <ns>",
    env: "WARMSTART_WORKLOAD_NAMESPACE",
    help: "put every workload here instead of the request's namespace",
  },
  {
    key: "namespaces",
    flag: "--namespaces <list>",
    env: "WARMSTART_WORKLOAD_NAMESPACES",
    help: "comma-separated namespaces workloads may be created in; requests for others are refused",
    defaultText: "--workload-namespace, else default",
  },
  {
    key: "secretName",
    flag: "--secret-name <name>",
    env: "WARMSTART_SECRET_NAME",
    help: "Secret holding the queue credentials",
    defaultText: CREDENTIALS_SECRET,
  },
  {
    key: "secretNamespace",
    flag: "--secret-namespace <ns>",
    env: "WARMSTART_SECRET_NAMESPACE",
    help: "namespace of that Secret",
    defaultText: "--namespace",
  },
  {
    key: "nodeSelector",
    flag: "--node-selector <selector>",
    env: "WARMSTART_NODE_SELECTOR",
    help: "count only nodes matching this label selector (a node pool)",
  },
  {
    key: "gpuTypeLabel",
    flag: "--gpu-type-label <label>",
    env: "WARMSTART_GPU_TYPE_LABEL",
    help: "node label that overrides nvidia.com/gpu.product",
    defaultText: GPU_TYPE_OVERRIDE_LABEL,
  },
  {
    key: "gpuPollInterval",
    flag: "--gpu-poll-interval <duration>",
    env: "WARMSTART_GPU_POLL_INTERVAL",
    help: "GPU poll period; also the first registration retry wait",
    defaultText: "60s",
  },
  {
    key: "debounce",
    flag: "--debounce <duration>",
    env: "WARMSTART_DEBOUNCE",
    help: "how long a GPU change must hold before it counts",
    defaultText: "30s",
  },
  {
    key: "backoffCap",
    flag: "--backoff-cap <duration>",
    env: "WARMSTART_BACKOFF_CAP",
    help: "longest registration retry wait",
    defaultText: "5m",
  },
  {
    key: "refreshInterval",
    flag: "--refresh-interval <duration>",
    env: "WARMSTART_REFRESH_INTERVAL",
    help: "periodic re-registration",
    defaultText: "10m",
  },
  {
    key: "renewBefore",
    flag: "--renew-before <duration>",
    env: "WARMSTART_RENEW_BEFORE",
    help: "renew credentials this long before expiry",
    defaultText: "the control plane's",
  },
  {
    key: "heartbeatInterval",
    flag: "--heartbeat-interval <duration>",
    env: "WARMSTART_HEARTBEAT_INTERVAL",
    help: "heartbeat period",
    defaultText: "the control plane's",
  },
  {
    key: "queueWait",
    flag: "--queue-wait <duration>",
    env: "WARMSTART_QUEUE_WAIT",
    help: "long-poll wait per receive (max 20s)",
    defaultText: "20s",
  },
  {
    key: "queueBatch",
    flag: "--queue-batch <n>",
    env: "WARMSTART_QUEUE_BATCH",
    help: "messages per receive (1-10)",
    defaultText: "5",
  },
  {
    key: "visibilityTimeout",
    flag: "--visibility-timeout <duration>",
    env: "WARMSTART_VISIBILITY_TIMEOUT",
    help: "how long a received message stays invisible",
    defaultText: "5m",
  },
  {
    key: "statusInterval",
    flag: "--status-interval <duration>",
    env: "WARMSTART_STATUS_INTERVAL",
    help: "resync period of workload status reports",
    defaultText: "15s",
  },
  {
    key: "gracefulNoGpu",
    flag: "--graceful-no-gpu <bool>",
    env: "WARMSTART_GRACEFUL_NO_GPU",
    help: "with no GPUs stay alive and not ready (false: exit 1)",
    defaultText: "true",
  },
  {
    key: "listenHost",
    flag: "--listen-host <host>",
    env: "WARMSTART_LISTEN_HOST",
    help: "HTTP listen address",
    defaultText: "0.0.0.0",
  },
  {
    key: "port",
    flag: "--port <port>",
    env: "WARMSTART_PORT",
    help: "HTTP port (0: any free port)",
    defaultText: "8080",
  },
];

/**
 * Merge flags over environment and validate. Throws one error listing every bad setting by its
 * flag and variable name.
 */
export function loadConfig(
  flags: Partial<Record<string, unknown>>,
  env: NodeJS.ProcessEnv = process.env,
): AgentConfig {
  const raw: Record<string, unknown> = {};
  for (const o of OPTIONS) {
    const v = flags[o.key] ?? env[o.env];
    if (v !== undefined && v !== "") raw[o.key] = v;
  }
  const parsed = AgentConfigSchema.safeParse(raw);
  if (parsed.success) return parsed.data;
  const lines = parsed.error.issues.map((i) => {
    const spec = OPTIONS.find((o) => o.key === i.path[0]);
    const name = spec ? `${spec.flag.split(" ")[0]} (${spec.env})` : i.path.join(".");
    const message =
      i.code === "invalid_type" && raw[String(i.path[0])] === undefined ? "is required" : i.message;
    return `  ${name}: ${message}`;
  });
  throw new Error(`invalid cluster-agent configuration:\n${lines.join("\n")}`);
}
