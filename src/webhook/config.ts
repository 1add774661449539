import { z } from "zod";
import { SYSTEM_NAMESPACE } from "../common/kube.js";
import { defineOptions, listOption, type OptionDef } from "../common/options.js";
import { cpuQuantity, durationSeconds, kubeQuantity, quantityBytes } from "../common/units.js";
import { HOST_PATH_PROVISIONER } from "../core/contract.js";
import { SHARING_SCOPES } from "../core/scope.js";
import { FOLLOWER_MODES } from "../core/gangs.js";

const bool = z
  .union([z.boolean(), z.enum(["true", "false", "1", "0"])])
  .transform((v) => v === true || v === "true" || v === "1");

const opt = <S extends z.ZodType>(d: OptionDef<S>): OptionDef<S> => d;

/** Every setting of the webhook: flag, env, default, help and schema. Those without a flag are set by the program. */
export const WEBHOOK_OPTIONS = {
  host: opt({ flag: "--host <host>", default: "0.0.0.0", doc: "listen address", schema: z.string() }),
  port: opt({
    flag: "--port <port>",
    env: "WARMSTART_WEBHOOK_PORT",
    default: 8443,
    doc: "listen port (0 = any free port)",
    schema: z.coerce.number().int().min(0).max(65535),
  }),
  certFile: opt({
    flag: "--cert-file <file>",
    env: "WARMSTART_WEBHOOK_CERT",
    doc: "serving certificate (PEM); reloaded when it changes",
    schema: z.string().optional(),
  }),
  keyFile: opt({
    flag: "--key-file <file>",
    env: "WARMSTART_WEBHOOK_KEY",
    doc: "serving key (PEM)",
    schema: z.string().optional(),
  }),
  /** CA bundle the API server uses to trust us (defaults to the generated CA, or the cert itself). */
  caFile: opt({
    flag: "--ca-file <file>",
    doc: "CA bundle for the registration",
    defaultText: "the certificate",
    schema: z.string().optional(),
  }),
  /**
   * CA that signs the API server's client certificate: with it, /mutate answers only callers that
   * present a certificate it signed; without it, anyone who reaches the port.
   */
  clientCaFile: opt({
    flag: "--client-ca-file <file>",
    env: "WARMSTART_WEBHOOK_CLIENT_CA",
    doc: "answer only callers whose client certificate this CA signed (the API server's webhook client)",
    schema: z.string().optional(),
  }),
  /** Accepted client certificate names (CN or DNS SAN); empty: any certificate the CA signed. */
  clientNames: opt({
    flag: "--client-name <names>",
    env: "WARMSTART_WEBHOOK_CLIENT_NAMES",
    default: [],
    defaultText: "any the CA signed",
    doc: "accepted client certificate names, comma-separated (CN or DNS)",
    schema: listOption,
  }),
  /** Where the API server reaches us; with it, the webhook registers itself (local clusters, dev). */
  registerUrl: opt({
    flag: "--register-url <url>",
    env: "WARMSTART_WEBHOOK_REGISTER_URL",
    doc: "register a MutatingWebhookConfiguration pointing at this URL",
    schema: z.url().optional(),
  }),
  configurationName: opt({
    default: "warmstart",
    doc: "the MutatingWebhookConfiguration's name (and, with -records, the ValidatingWebhookConfiguration's)",
    schema: z.string(),
  }),
  /** Whose writes to cache records are reviewed (records-review.ts): the node agents' account. */
  nodeAgentAccount: opt({
    flag: "--node-agent-account <user>",
    env: "WARMSTART_NODE_AGENT_ACCOUNT",
    default: `system:serviceaccount:${SYSTEM_NAMESPACE}:warmstart-node-agent`,
    doc: "the node agents' ServiceAccount (system:serviceaccount:<ns>:<name>), whose record writes claiming a capture are reviewed",
    schema: z.string().regex(/^system:serviceaccount:[a-z0-9-]+:[a-z0-9.-]+$/),
  }),
  timeoutSeconds: opt({
    flag: "--timeout-seconds <n>",
    default: 5,
    doc: "the API server's webhook timeout",
    schema: z.coerce.number().int().min(1).max(30),
  }),
  electionEnabled: opt({
    flag: "--election-enabled [bool]",
    env: "WARMSTART_ELECTION_ENABLED",
    default: false,
    doc: "elect one downloader per hash (false: admit cold)",
    schema: bool,
  }),
  electionDeadline: opt({
    flag: "--election-deadline <duration>",
    env: "WARMSTART_ELECTION_DEADLINE",
    default: "60m",
    doc: "how long an election may take before it is retired",
    schema: durationSeconds,
  }),
  /**
   * How followers wait (SPEC 1.3 "Groups and gangs"): `auto` gates them where nothing waits for
   * them and lets gang members and ranks of multi-node groups wait running; `wait` lets every
   * follower wait running (storage that refuses a read-only attach while a writer holds it);
   * `gate` gates every follower but gang members.
   */
  followerMode: opt({
    flag: "--follower-mode <mode>",
    env: "WARMSTART_FOLLOWER_MODE",
    default: "auto",
    doc: "how followers wait: auto (gated unless something waits for them), wait (never gated), gate (gated, but gang members)",
    schema: z.enum(FOLLOWER_MODES as unknown as ["auto", "gate", "wait"]),
  }),
  waitDeadline: opt({
    flag: "--wait-deadline <duration>",
    env: "WARMSTART_WAIT_DEADLINE",
    default: "20m",
    doc: "how long a follower that waits running waits for the cache before it starts cold",
    schema: durationSeconds,
  }),
  /**
   * Failed captures of one hash (the record's `status.failedCaptures`) after which its pods are
   * admitted cold, until `warmstart cache retry` clears the count.
   */
  maxFailedCaptures: opt({
    flag: "--max-failed-captures <n>",
    env: "WARMSTART_MAX_FAILED_CAPTURES",
    default: 3,
    doc: "failed captures of a hash after which its pods start cold",
    schema: z.coerce.number().int().min(1),
  }),
  /**
   * Who shares a cache (a cache is never seen outside its scope): the whole cluster, each
   * namespace, or namespaces of one share-group.
   */
  sharingScope: opt({
    flag: "--sharing-scope <scope>",
    env: "WARMSTART_SHARING_SCOPE",
    // The safe default: a cache holds code its restores execute, so sharing it across namespaces
    // is a trust decision the operator makes (SPEC 1.9).
    default: "namespace",
    doc: "who shares a cache: namespace (the default), group, or cluster",
    schema: z.enum(SHARING_SCOPES as ["cluster", "namespace", "group"]),
  }),
  systemNamespace: opt({ default: SYSTEM_NAMESPACE, doc: "the system namespace", schema: z.string() }),
  image: opt({
    flag: "--image <image>",
    env: "WARMSTART_IMAGE",
    default: "ghcr.io/warmstart/warmstart:0.1.0",
    doc: "the warmstart image for init containers",
    schema: z.string(),
  }),
  /**
   * The pull secrets the init containers' image needs (a private registry). A Secret is its
   * namespace's and none is copied or read there: a pod is restored only when it names one of
   * them itself or through its ServiceAccount, and is admitted cold otherwise. None: the image
   * is pullable without a secret (a public registry, or credentials the nodes hold).
   */
  imagePullSecrets: opt({
    flag: "--image-pull-secret <names>",
    env: "WARMSTART_IMAGE_PULL_SECRETS",
    default: [],
    defaultText: "none",
    doc: "pull secrets the init image needs, comma-separated: a pod that names none of them starts cold",
    schema: listOption,
  }),
  /**
   * The init containers' resources: requests by default (a namespace with a compute quota
   * refuses containers without them). No memory limit by default: prewarm fills the page cache,
   * which is charged to the container, so a small limit would evict what it just read.
   */
  initCpuRequest: opt({
    flag: "--init-cpu-request <cpu>",
    env: "WARMSTART_INIT_CPU_REQUEST",
    default: "50m",
    doc: "CPU request of the init containers",
    schema: cpuQuantity,
  }),
  initMemoryRequest: opt({
    flag: "--init-memory-request <memory>",
    env: "WARMSTART_INIT_MEMORY_REQUEST",
    default: "64Mi",
    doc: "memory request of the init containers",
    schema: kubeQuantity,
  }),
  initCpuLimit: opt({
    flag: "--init-cpu-limit <cpu>",
    env: "WARMSTART_INIT_CPU_LIMIT",
    doc: "CPU limit of the init containers (none by default)",
    schema: cpuQuantity.optional(),
  }),
  initMemoryLimit: opt({
    flag: "--init-memory-limit <memory>",
    env: "WARMSTART_INIT_MEMORY_LIMIT",
    doc: "memory limit of the init containers (none by default; prewarm's page cache counts in it)",
    schema: kubeQuantity.optional(),
  }),
  cacheRoot: opt({
    default: "/warmstart/cache-root",
    doc: "where capture volumes mount",
    schema: z.string(),
  }),
  /** The leader's capture volume limit, unless the pod asks otherwise (`warmstart.dev/cache-size-limit`). */
  cacheSizeLimit: opt({
    flag: "--cache-size-limit <size>",
    env: "WARMSTART_CACHE_SIZE_LIMIT",
    default: "200Gi",
    doc: "the leader's capture volume size limit",
    schema: kubeQuantity,
  }),
  /** The most a pod may ask for. */
  maxCacheSizeLimit: opt({
    flag: "--max-cache-size-limit <size>",
    env: "WARMSTART_MAX_CACHE_SIZE_LIMIT",
    default: "1Ti",
    doc: "the most a pod may ask for with warmstart.dev/cache-size-limit",
    schema: kubeQuantity,
  }),
  /** The storage profile key of the node agents' cache stores (as their --store-provisioner): followers prewarm by it. */
  storeProvisioner: opt({
    flag: "--store-provisioner <name>",
    env: "WARMSTART_STORE_PROVISIONER",
    default: HOST_PATH_PROVISIONER,
    doc: "storage profile key of the node agents' cache stores (followers prewarm by it)",
    schema: z.string().min(1),
  }),
  storeVolumeType: opt({
    flag: "--store-volume-type <type>",
    env: "WARMSTART_STORE_VOLUME_TYPE",
    doc: "volume type of the node agents' cache stores",
    schema: z.string().min(1).optional(),
  }),
  maxBodyBytes: opt({
    default: 3 * 1024 * 1024,
    doc: "largest admission request body",
    schema: z.coerce.number().int().min(1024),
  }),
  /** Event posting is asynchronous; this bounds the backlog so a slow API server cannot grow memory. */
  maxPendingEvents: opt({
    default: 1000,
    doc: "events waiting to be posted, at most",
    schema: z.coerce.number().int().min(0),
  }),
  /** How long a namespace's labels and the cache-env ConfigMap are reused before being read again. */
  lookupTtlSeconds: opt({
    default: 5,
    doc: "how long lookups are reused",
    schema: z.coerce.number().min(0),
  }),
};

export const webhookOptions = defineOptions("webhook", WEBHOOK_OPTIONS, (schema) =>
  schema.refine((c) => quantityBytes(c.cacheSizeLimit)! <= quantityBytes(c.maxCacheSizeLimit)!, {
    message: "the default cache size limit is above the maximum",
    path: ["cacheSizeLimit"],
  }),
);

/** Every setting of the webhook, validated once at boot (flags first, then env, then defaults). */
export type WebhookConfig = ReturnType<typeof webhookOptions.load>;

/** Flag over env over default, keyed by the table's keys; throws one error naming every problem. */
export function loadWebhookConfig(flags: Record<string, unknown>, env = process.env): WebhookConfig {
  return webhookOptions.load(flags, env);
}
