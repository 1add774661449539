/**
 * The public names of Warmstart (SPEC section 0). Tests, the chart and operators rely on these;
 * keep them stable.
 */
export { GROUP, MODELCACHE, CACHE_PHASES, type CachePhase } from "../api/names.js";

export const ANN_HASH = "warmstart.dev/hash"; // annotation: full sha256 hex
export const LABEL_HASH = "warmstart.dev/hash"; // label: first 16 hex chars
export const ANN_ROLE = "warmstart.dev/role"; // leader | follower | restore | cold
export const ANN_REASON = "warmstart.dev/reason"; // why the webhook decided so
export const ANN_ELECTION_ID = "warmstart.dev/election-id";
export const ANN_DEADLINE = "warmstart.dev/deadline"; // on the election Lease: when it is retired
export const ANN_LEADER_NAMESPACE = "warmstart.dev/leader-namespace"; // on the election Lease
export const LABEL_CAPTURE = "warmstart.dev/capture"; // "true" on the leader
export const LABEL_GATED = "warmstart.dev/gated"; // "true" on gated followers
export const LABEL_WAITING = "warmstart.dev/waiting"; // "true" on followers that wait running (not gated)
export const LABEL_NAMESPACE = "warmstart.dev/namespace";
export const SCHEDULING_GATE = "warmstart.dev/cache-ready";
export const ANN_RESTORE_FROM = "warmstart.dev/restore-from";
export const SKIP = "warmstart.dev/skip"; // "true": pod annotation or namespace label
export const ENV_PREWARM = "WARMSTART_PREWARM";

export const CACHE_VOLUME = "warmstart-cache";
export const INIT_SEED = "warmstart-seed-cache";
export const INIT_PREWARM = "warmstart-prewarm";
/** Restores made before the seed container waited for the ready marker had this one first. */
export const LEGACY_INIT_WAIT_READY = "warmstart-wait-ready";

export const STORAGE_PROFILES_CONFIGMAP = "warmstart-storage-profiles";

export type Role = "leader" | "follower" | "restore" | "cold";

export const shortHash = (hash: string): string => hash.slice(0, 16);
export const leaseName = (hash: string): string => `warmstart-capture-${shortHash(hash)}`;
export const claimName = (hash: string): string => `rox-${shortHash(hash)}`;

/** The file whose presence on a cache volume says the tree is complete (written last). */
export const READY_MARKER = ".warmstart-ready";
export const MANIFEST_FILE = ".warmstart-manifest.json";

/**
 * A stamp older versions wrote to list the env names they injected. Nothing reads it now (the
 * injected env is known from the webhook's own template, never from the pod); like every other
 * stamp, the webhook removes it when a pod's author sets it.
 */
export const ANN_INJECTED_ENV = "warmstart.dev/injected-env";
export const RO_VOLUME = "warmstart-ro"; // the read-only rox-<short> claim, on restores and followers
export const SHADOW_VOLUME = "warmstart-shadow"; // the writable per-pod cache root of a restore
/**
 * Annotation on a restoring pod: the captured tree's folder inside its read-only volume ("." when
 * the volume is the tree). Written by Warmstart (the webhook on a restore, the release controller
 * when it lifts a follower's gate); the pod's mounts read it through ENV_TREE so that every
 * backend shows the tree itself at the mount point.
 */
export const ANN_TREE = "warmstart.dev/tree";
export const ENV_TREE = "WARMSTART_CACHE_TREE";

/** Annotation on a ModelCache: where its promoted tree lives and how to claim it (JSON, written before Ready). */
export const ANN_CACHE_SOURCE = "warmstart.dev/source";
/** The storage profile key of a node-local cache store (the host-path backend). */
export const HOST_PATH_PROVISIONER = "warmstart.dev/host-path";

/** User annotation: the capture volume's size limit for this pod (a quantity, capped by the cluster's maximum). */
export const ANN_CACHE_SIZE_LIMIT = "warmstart.dev/cache-size-limit";
/** On a leader, written by the webhook: the size limit its capture volume got (what eviction for size is measured against). */
export const ANN_CAPTURE_SIZE_LIMIT = "warmstart.dev/capture-size-limit";
/** The `warmstart.dev/*` annotations a pod's author may set; the webhook removes every other stamp (SPEC 1.3). */
export const USER_ANNOTATIONS: readonly string[] = [ANN_RESTORE_FROM, SKIP, ANN_CACHE_SIZE_LIMIT];
/**
 * Namespaces the webhook is never sent (its registration's namespaceSelector): a pod there keeps
 * whatever stamps its author wrote, so no cache is ever shared into them.
 */
export const UNADMITTED_NAMESPACES: readonly string[] = ["kube-system"];
/** Namespace label: namespaces with the same value share caches under `sharing.scope=group` (SPEC 1.9). */
export const LABEL_SHARE_GROUP = "warmstart.dev/share-group";
export type SharingScope = "cluster" | "namespace" | "group";
/** ConfigMap in the system namespace: the cache env the webhook points into the cache root (SPEC 1.3). */
export const CACHE_ENV_CONFIGMAP = "warmstart-cache-env";
/** Annotation on a ModelCache: the cache env template its leader was decorated with (JSON), replayed on restore. */
export const ANN_CACHE_ENV = "warmstart.dev/cache-env";
/** Label the webhook puts on pods it posts an Event about, so it finds them once they exist. */
export const LABEL_ADMISSION_ID = "warmstart.dev/admission-id";

/** ModelCache finalizer: claims, PVs and snapshots of the cache are removed before the record goes. */
export const FINALIZER_CLEANUP = "warmstart.dev/cleanup";
/** ModelCache finalizer per node whose store holds (or is writing) the cache's tree: `warmstart.dev/store-<node>`. */
export const FINALIZER_STORE_PREFIX = "warmstart.dev/store-";
/** Annotation on a restored pod once its benefit is counted on its cache's record (never counted twice). */
export const ANN_RESTORE_RECORDED = "warmstart.dev/restore-recorded";
/** Label on the per-node store Lease (`warmstart-store-<node>`), whose annotations say the store's use and budget. */
export const LABEL_STORE = "warmstart.dev/store";
export const ANN_STORE_BUDGET = "warmstart.dev/store-budget";
export const ANN_STORE_USED = "warmstart.dev/store-used";
/** On the per-node store Lease: the node it describes, and the caches its store holds (comma-separated short hashes). */
export const ANN_STORE_NODE = "warmstart.dev/node";
export const ANN_STORE_CACHES = "warmstart.dev/store-caches";

/**
 * Waiting followers (SPEC 1.3 "Groups and gangs: never deadlock"): followers that something waits
 * for (a gang, the other ranks of a group) are never gated. They run at once with the fill volume
 * (an emptyDir their node's agent fills with the tree once the cache is Ready) and start cold past
 * the time in ANN_WAIT_UNTIL, or when the agent writes COLD_MARKER into the volume.
 */
export const ANN_WAIT_UNTIL = "warmstart.dev/wait-until";
export const FILL_VOLUME = "warmstart-fill";
/** Inside the fill volume: the filled tree's folder, and the file that says to start cold (its text: why). */
export const FILL_TREE = "tree";
export const COLD_MARKER = ".warmstart-cold";
/** On a gang member or a rank of a multi-node group: which one (kind and name), and the rank's ordinal. */
export const ANN_GANG = "warmstart.dev/gang";
export const ANN_GROUP = "warmstart.dev/group";
export const ANN_RANK = "warmstart.dev/rank";

/** What the seed init container reports as its termination message (one line of JSON). */
export interface SeedOutcome {
  outcome: "restored" | "cold";
  reason?: string;
  waitedMs: number;
}
