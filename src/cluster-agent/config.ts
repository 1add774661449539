/**
 * The cluster agent's configuration: every flag and environment variable in one table, merged
 * (flag over env over default) and validated once at boot.
 */
import { z } from "zod";
import { ClusterId, Dns1123Label } from "../control-plane/api.js";
import { SYSTEM_NAMESPACE } from "../common/kube.js";
import { boolOption, defineOptions, intOption, type OptionDef } from "../common/options.js";
import { durationMs, parseDurationMs } from "../common/units.js";
import { parseSelector, type Requirement } from "./selector.js";

export const CREDENTIALS_SECRET = "warmstart-cluster-agent-credentials";
export const GPU_TYPE_OVERRIDE_LABEL = "warmstart.dev/gpu-type";

/** Milliseconds of a duration ("250ms", "30s", "5m", "1h", "1m30s"; a bare number is seconds). */
export const parseDuration = parseDurationMs;

const positive = (d: z.ZodType<number, string | number>, what: string): z.ZodType<number, string | number> =>
  d.refine((ms) => ms > 0, { message: `${what} must be greater than zero` });

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

const opt = <S extends z.ZodType>(d: OptionDef<S>): OptionDef<S> => d;

/** Every setting of the cluster agent: flag, env, default, help and schema. */
export const CLUSTER_AGENT_OPTIONS = {
  controlPlaneUrl: opt({
    flag: "--control-plane-url <url>",
    env: "WARMSTART_CONTROL_PLANE_URL",
    doc: "control plane base URL",
    schema: z.url({ protocol: /^https?$/, message: "must be an http(s) URL" }),
  }),
  /** PEM CA to trust for an https control plane. */
  controlPlaneCaFile: opt({
    flag: "--control-plane-ca-file <file>",
    env: "WARMSTART_CONTROL_PLANE_CA_FILE",
    doc: "PEM CA to trust for an https control plane",
    schema: z.string().min(1).optional(),
  }),
  clusterToken: opt({
    flag: "--cluster-token <token>",
    env: "WARMSTART_CLUSTER_TOKEN",
    doc: "token for registration (prefer the env var)",
    schema: z.string().min(1, { message: "is required" }),
  }),
  clusterId: opt({
    flag: "--cluster-id <id>",
    env: "WARMSTART_CLUSTER_ID",
    doc: "this cluster's id at the control plane",
    schema: ClusterId,
  }),
  clusterName: opt({
    flag: "--cluster-name <name>",
    env: "WARMSTART_CLUSTER_NAME",
    doc: "display name",
    schema: z.string().min(1).max(253).optional(),
  }),
  kubeconfig: opt({
    flag: "--kubeconfig <path>",
    env: "KUBECONFIG",
    doc: "kubeconfig",
    defaultText: "in-cluster",
    schema: z.string().min(1).optional(),
  }),
  namespace: opt({
    flag: "--namespace <ns>",
    env: "WARMSTART_NAMESPACE",
    default: SYSTEM_NAMESPACE,
    doc: "the agent's namespace (request records)",
    schema: Dns1123Label,
  }),
  workloadNamespace: opt({
    flag: "--workload-namespace <ns>",
    env: "WARMSTART_WORKLOAD_NAMESPACE",
    doc: "put every workload here instead of the request's namespace",
    schema: Dns1123Label.optional(),
  }),
  /** The only namespaces workloads are created in (the agent's RBAC covers these). */
  namespaces: opt({
    flag: "--namespaces <list>",
    env: "WARMSTART_WORKLOAD_NAMESPACES",
    defaultText: "--workload-namespace, else default",
    doc: "comma-separated namespaces workloads may be created in; requests for others are refused",
    schema: NamespaceList.optional(),
  }),
  secretName: opt({
    flag: "--secret-name <name>",
    env: "WARMSTART_SECRET_NAME",
    default: CREDENTIALS_SECRET,
    doc: "Secret holding the queue credentials",
    schema: Dns1123Label,
  }),
  secretNamespace: opt({
    flag: "--secret-namespace <ns>",
    env: "WARMSTART_SECRET_NAMESPACE",
    defaultText: "--namespace",
    doc: "namespace of that Secret",
    schema: Dns1123Label.optional(),
  }),
  nodeSelector: opt({
    flag: "--node-selector <selector>",
    env: "WARMSTART_NODE_SELECTOR",
    default: "",
    defaultText: "every node",
    doc: "count only nodes matching this label selector (a node pool)",
    schema: Selector,
  }),
  gpuTypeLabel: opt({
    flag: "--gpu-type-label <label>",
    env: "WARMSTART_GPU_TYPE_LABEL",
    default: GPU_TYPE_OVERRIDE_LABEL,
    doc: "node label that overrides nvidia.com/gpu.product",
    schema: z.string().min(1),
  }),
  gpuPollInterval: opt({
    flag: "--gpu-poll-interval <duration>",
    env: "WARMSTART_GPU_POLL_INTERVAL",
    default: "60s",
    doc: "GPU poll period; also the first registration retry wait",
    schema: positive(durationMs, "gpu poll interval"),
  }),
  debounce: opt({
    flag: "--debounce <duration>",
    env: "WARMSTART_DEBOUNCE",
    default: "30s",
    doc: "how long a GPU change must hold before it counts",
    schema: durationMs,
  }),
  backoffCap: opt({
    flag: "--backoff-cap <duration>",
    env: "WARMSTART_BACKOFF_CAP",
    default: "5m",
    doc: "longest registration retry wait",
    schema: positive(durationMs, "backoff cap"),
  }),
  refreshInterval: opt({
    flag: "--refresh-interval <duration>",
    env: "WARMSTART_REFRESH_INTERVAL",
    default: "10m",
    doc: "periodic re-registration",
    schema: positive(durationMs, "refresh interval"),
  }),
  renewBefore: opt({
    flag: "--renew-before <duration>",
    env: "WARMSTART_RENEW_BEFORE",
    defaultText: "the control plane's",
    doc: "renew credentials this long before expiry",
    schema: positive(durationMs, "renew-before").optional(),
  }),
  heartbeatInterval: opt({
    flag: "--heartbeat-interval <duration>",
    env: "WARMSTART_HEARTBEAT_INTERVAL",
    defaultText: "the control plane's",
    doc: "heartbeat period",
    schema: positive(durationMs, "heartbeat interval").optional(),
  }),
  queueWait: opt({
    flag: "--queue-wait <duration>",
    env: "WARMSTART_QUEUE_WAIT",
    default: "20s",
    doc: "long-poll wait per receive (max 20s)",
    schema: durationMs.refine((ms) => ms <= 20_000, { message: "queue wait is at most 20s" }),
  }),
  queueBatch: opt({
    flag: "--queue-batch <n>",
    env: "WARMSTART_QUEUE_BATCH",
    default: 5,
    doc: "messages per receive (1-10)",
    schema: intOption(1, 10),
  }),
  visibilityTimeout: opt({
    flag: "--visibility-timeout <duration>",
    env: "WARMSTART_VISIBILITY_TIMEOUT",
    default: "5m",
    doc: "how long a received message stays invisible",
    schema: positive(durationMs, "visibility timeout").refine((ms) => ms <= 43_200_000, {
      message: "visibility timeout is at most 12h",
    }),
  }),
  statusInterval: opt({
    flag: "--status-interval <duration>",
    env: "WARMSTART_STATUS_INTERVAL",
    default: "15s",
    doc: "resync period of workload status reports",
    schema: positive(durationMs, "status interval"),
  }),
  gracefulNoGpu: opt({
    flag: "--graceful-no-gpu <bool>",
    env: "WARMSTART_GRACEFUL_NO_GPU",
    default: true,
    doc: "with no GPUs stay alive and not ready (false: exit 1)",
    schema: boolOption,
  }),
  listenHost: opt({
    flag: "--listen-host <host>",
    env: "WARMSTART_LISTEN_HOST",
    default: "0.0.0.0",
    doc: "HTTP listen address",
    schema: z.string().min(1),
  }),
  port: opt({
    flag: "--port <port>",
    env: "WARMSTART_PORT",
    default: 8080,
    doc: "HTTP port (0: any free port)",
    schema: intOption(0, 65535),
  }),
};

export const clusterAgentOptions = defineOptions("cluster-agent", CLUSTER_AGENT_OPTIONS, (schema) =>
  schema
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
    })),
);

export type AgentConfig = ReturnType<typeof clusterAgentOptions.load>;
/** What a caller may set: each option by its key, as a flag or variable would write it, or parsed. */
export type AgentConfigInput = Partial<Record<keyof typeof CLUSTER_AGENT_OPTIONS, unknown>>;
export type { Requirement };

/**
 * Merge flags over environment over defaults and validate. Throws one error listing every bad
 * setting by its flag and variable name.
 */
export function loadConfig(
  flags: Partial<Record<string, unknown>>,
  env: NodeJS.ProcessEnv = process.env,
): AgentConfig {
  return clusterAgentOptions.load(flags, env);
}
