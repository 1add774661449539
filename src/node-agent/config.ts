import { isAbsolute } from "node:path";
import { z } from "zod";
import { SYSTEM_NAMESPACE } from "../common/kube.js";
import { defineOptions, type OptionsOutput } from "../common/options.js";
import { byteSize, durationMs } from "../common/units.js";

export { byteSize };

const absolute = (what: string): z.ZodString =>
  z
    .string({ error: `is required (${what})` })
    .min(1)
    .refine(isAbsolute, { message: "must be an absolute path" });

const bool = z
  .union([z.boolean(), z.enum(["true", "false", "1", "0"])])
  .transform((v) => v === true || v === "true" || v === "1");

/** Every setting of the node agent: flag, env, default, help and schema. */
export const NODE_AGENT_OPTIONS = {
  node: {
    flag: "--node <name>",
    env: "NODE_NAME",
    doc: "this node's name",
    schema: z.string({ error: "is required (or env NODE_NAME)" }).min(1),
  },
  kubeletRoot: {
    flag: "--kubelet-root <dir>",
    env: "WARMSTART_KUBELET_ROOT",
    doc: "the kubelet's root directory as mounted here (holds pods/<uid>/volumes)",
    schema: absolute("the kubelet's root directory as mounted here"),
  },
  store: {
    flag: "--store <dir>",
    env: "WARMSTART_STORE",
    doc: "the node's cache store: committed trees go to <store>/<short>",
    schema: absolute("the node's cache store directory"),
  },
  /** `namespace/name` of the claim the store directory is mounted from (shared-volume, snapshot-clone). */
  storeClaim: {
    flag: "--store-claim <ns/name>",
    env: "WARMSTART_STORE_CLAIM",
    doc: "the claim the store is mounted from (shared-volume, snapshot-clone)",
    schema: z
      .string()
      .regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?\/[a-z0-9]([-.a-z0-9]*[a-z0-9])?$/, "must be namespace/name")
      .optional(),
  },
  /** The storage profile key of the store; by default the store claim's provisioner, or host-path. */
  storeProvisioner: {
    flag: "--store-provisioner <name>",
    env: "WARMSTART_STORE_PROVISIONER",
    doc: "storage profile key of the store",
    defaultText: "the claim's provisioner, or host-path",
    schema: z.string().min(1).optional(),
  },
  storeVolumeType: {
    flag: "--store-volume-type <type>",
    doc: "volume type of the store, for per-type profile overrides",
    schema: z.string().min(1).optional(),
  },
  /** snapshot-clone: each committed tree is written into a volume of its own of this class. */
  treeVolumeClass: {
    flag: "--tree-volume-class <class>",
    env: "WARMSTART_TREE_VOLUME_CLASS",
    doc: "snapshot-clone: the StorageClass of the volume each tree is written into before its snapshot",
    schema: z.string().min(1).optional(),
  },
  /** The Warmstart image, for the pods the node agent starts (the tree volume's writer). */
  image: {
    flag: "--image <image>",
    env: "WARMSTART_IMAGE",
    doc: "the Warmstart image, for the tree volume's writer pod (snapshot-clone)",
    schema: z.string().min(1).optional(),
  },
  imagePullSecrets: {
    flag: "--image-pull-secret <names>",
    env: "WARMSTART_IMAGE_PULL_SECRETS",
    doc: "comma-separated pull secrets of the Warmstart image, in the system namespace",
    schema: z
      .string()
      .transform((v) =>
        v
          .split(",")
          .map((n) => n.trim())
          .filter(Boolean),
      )
      .optional(),
  },
  podLogsDir: {
    flag: "--pod-logs-dir <dir>",
    env: "WARMSTART_POD_LOGS_DIR",
    default: "/var/log/pods",
    doc: "the kubelet's container logs (read-only): each restored or leading pod's start is read from its engine's own log lines",
    schema: absolute("the pod logs directory"),
  },
  /**
   * Serving committed trees to the other nodes' agents (SPEC 1.5): HTTPS with client
   * certificates of the node agents' CA. Off unless the three files are given.
   */
  peerCert: {
    flag: "--peer-cert <file>",
    env: "WARMSTART_PEER_CERT",
    doc: "this node agent's certificate (PEM) for serving and fetching trees between nodes",
    schema: absolute("the peer certificate file").optional(),
  },
  peerKey: {
    flag: "--peer-key <file>",
    env: "WARMSTART_PEER_KEY",
    doc: "its private key (PEM)",
    schema: absolute("the peer key file").optional(),
  },
  peerCa: {
    flag: "--peer-ca <file>",
    env: "WARMSTART_PEER_CA",
    doc: "the node agents' CA (PEM): only its certificates are served",
    schema: absolute("the peer CA file").optional(),
  },
  peerPort: {
    flag: "--peer-port <port>",
    env: "WARMSTART_PEER_PORT",
    default: 9465,
    doc: "port trees are served on to other nodes (0 = any free port)",
    schema: z.coerce.number().int().min(0).max(65535),
  },
  /**
   * Which node a peer is (SPEC 1.5): each request carries the node agent's ServiceAccount token,
   * bound to its pod (audience warmstart.dev/peers), and a tree is served only to the node that
   * token names, for a pod there in the cache's scope. Without an account, every peer with a
   * certificate of the CA is served (a warning at start).
   */
  peerTokenFile: {
    flag: "--peer-token-file <file>",
    env: "WARMSTART_PEER_TOKEN_FILE",
    doc: "this node agent's bound ServiceAccount token (audience warmstart.dev/peers), sent to peers to prove its node",
    schema: absolute("the peer token file").optional(),
  },
  peerServiceAccount: {
    flag: "--peer-service-account <user>",
    env: "WARMSTART_PEER_SERVICE_ACCOUNT",
    doc: "the node agents' account (system:serviceaccount:<ns>:<name>): trees go only to a node whose agent's token is of it",
    schema: z
      .string()
      .regex(/^system:serviceaccount:[a-z0-9-]+:[a-z0-9.-]+$/, "system:serviceaccount:<namespace>:<name>")
      .optional(),
  },
  /** How other nodes reach this one (the chart gives the node's IP); default: the listen host. */
  peerAddress: {
    flag: "--peer-address <host>",
    env: "WARMSTART_PEER_ADDRESS",
    doc: "the host other nodes reach this node's trees at",
    defaultText: "the listen host",
    schema: z.string().min(1).optional(),
  },
  /**
   * The `store.warmstart.dev` CSI driver (node-store, SPEC 1.5): served on `<dir>/csi.sock` and
   * registered with the kubelet. Off unless given. The path must be the one the kubelet sees.
   */
  csiPluginDir: {
    flag: "--csi-plugin-dir <dir>",
    env: "WARMSTART_CSI_PLUGIN_DIR",
    doc: "serve the store.warmstart.dev CSI driver on <dir>/csi.sock (e.g. <kubelet-root>/plugins/store.warmstart.dev); off when not given",
    schema: absolute("the CSI driver's socket folder").optional(),
  },
  csiRegistrationDir: {
    flag: "--csi-registration-dir <dir>",
    env: "WARMSTART_CSI_REGISTRATION_DIR",
    doc: "the kubelet's plugin registration folder the CSI driver registers in",
    defaultText: "<kubelet-root>/plugins_registry",
    schema: absolute("the kubelet's plugin registration folder").optional(),
  },
  /** How long a leader must stay Ready before its cache is captured. */
  warmupMs: {
    flag: "--warmup <duration>",
    env: "WARMSTART_WARMUP",
    default: "30s",
    doc: "how long a leader stays Ready before capture",
    schema: durationMs,
  },
  /** Captures at once on this node. */
  concurrency: {
    flag: "--concurrency <n>",
    env: "WARMSTART_CAPTURE_CONCURRENCY",
    default: 2,
    doc: "captures at once on this node",
    schema: z.coerce.number().int().min(1).max(64),
  },
  /** Files copied at once within one capture. */
  captureParallel: {
    flag: "--capture-parallel <n>",
    default: 8,
    doc: "files copied at once within one capture",
    schema: z.coerce.number().int().min(1).max(256),
  },
  /** A capture taking longer than this fails cleanly (nothing committed); 0: no limit. */
  captureDeadlineMs: {
    flag: "--capture-deadline <duration>",
    env: "WARMSTART_CAPTURE_DEADLINE",
    default: "30m",
    doc: "a capture taking longer fails cleanly (0: none)",
    schema: durationMs,
  },
  /**
   * Bytes the store may hold (0: no limit). A capture that needs room removes caches no pod
   * mounts, least recently restored first; a cache in use is never removed.
   */
  storeBudget: {
    flag: "--store-budget <size>",
    env: "WARMSTART_STORE_BUDGET",
    default: 0,
    defaultText: "no limit",
    doc: "bytes the store may hold, e.g. 500Gi; unused caches make room, least recently restored first",
    schema: byteSize,
  },
  /**
   * The fair share of one sharing scope, a fraction of the budget (fair-share.ts): past it a
   * scope's capture or fill makes room only from its own unused trees.
   */
  storeScopeShare: {
    flag: "--store-scope-share <fraction>",
    env: "WARMSTART_STORE_SCOPE_SHARE",
    default: 0.5,
    doc: "the share of the store budget one sharing scope may hold before it makes room only from its own unused caches (0 < fraction <= 1)",
    schema: z.coerce.number().gt(0).lte(1),
  },
  /** Flush captured data to disk before committing (off only for throwaway stores). */
  durable: {
    flag: "--no-durable",
    default: true,
    doc: "do not flush captured data to disk before committing (throwaway stores only)",
    schema: bool,
  },
  /** Write big files of a capture past the page cache (capture.ts, ADR 0006). */
  directIo: {
    flag: "--no-direct-io",
    default: true,
    doc: "write captured big files through the page cache, so the store's copy stays in memory for restores on this node (more CPU, a second copy in memory)",
    schema: bool,
  },
  resyncMs: {
    flag: "--resync <duration>",
    default: "60s",
    doc: "how often pods and promoted claims are looked at again",
    schema: durationMs,
  },
  snapshotTimeoutMs: {
    flag: "--snapshot-timeout <duration>",
    default: "10m",
    doc: "snapshot-clone: how long a snapshot may take to be ready",
    schema: durationMs,
  },
  host: {
    flag: "--host <host>",
    default: "0.0.0.0",
    doc: "metrics and health listen address",
    schema: z.string(),
  },
  port: {
    flag: "--port <port>",
    env: "WARMSTART_NODE_AGENT_PORT",
    default: 9464,
    doc: "metrics and health port (0 = any free port)",
    schema: z.coerce.number().int().min(0).max(65535),
  },
  /**
   * /metrics beyond loopback. Off, it answers only clients on the pod's (or, with the host network,
   * the node's) loopback: the port stays open for the kubelet's probes, and its series name this
   * node's caches and what it does with them.
   */
  metricsRemote: {
    flag: "--metrics-remote",
    env: "WARMSTART_METRICS_REMOTE",
    default: false,
    doc: "serve /metrics to every address, not only loopback (restrict who reaches the port)",
    schema: bool,
  },
  systemNamespace: { default: SYSTEM_NAMESPACE, doc: "the system namespace", schema: z.string() },
  claimAttempts: {
    default: 5,
    doc: "attempts to ensure a claim",
    schema: z.coerce.number().int().min(1).max(20),
  },
  claimBackoffMs: { default: "200ms", doc: "first wait between claim attempts", schema: durationMs },
};

export const nodeAgentOptions = defineOptions("node-agent", NODE_AGENT_OPTIONS);

/** Every setting of the node agent, validated once at boot (flags, then env, then defaults). */
export const NodeAgentConfig = {
  /** The config from explicit values over the defaults (no environment). */
  parse: (input: Record<string, unknown>): NodeAgentConfig => nodeAgentOptions.load(input, {}),
};
export type NodeAgentConfig = OptionsOutput<typeof NODE_AGENT_OPTIONS>;

/** Flag over env over default, keyed by the table's keys; throws one error naming every problem. */
export function loadNodeAgentConfig(flags: Record<string, unknown>, env = process.env): NodeAgentConfig {
  return nodeAgentOptions.load(flags, env);
}
