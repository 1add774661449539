import { randomBytes } from "node:crypto";
import type { V1Pod } from "@kubernetes/client-node";
import {
  classifyPod,
  REASON_NO_CONTAINERS,
  REASON_NO_GPU,
  type ClaimRef,
  type DeviceClassLookup,
} from "../core/classify.js";
import { claimKey, podClaimRefs } from "../core/gpu.js";
import { cacheHash, scopeOfInputs, type HashInputs } from "../core/hash.js";
import {
  decorateCold,
  decorateFollower,
  decorateLeader,
  decorateRestore,
  decorateWaitingFollower,
  type CacheEnvTemplate,
  type RestoreOptions,
} from "../core/decorate.js";
import {
  ANN_CACHE_ENV,
  ANN_CACHE_SIZE_LIMIT,
  ANN_GANG,
  ANN_GROUP,
  ANN_RANK,
  LABEL_ADMISSION_ID,
  SKIP,
  claimName,
  shortHash,
  type Role,
} from "../core/contract.js";
import { listOf, redactUrlCredentials } from "../core/env.js";
import { stripStamps } from "../core/stamps.js";
import { scopeKey } from "../core/scope.js";
import { captureSizeLimit } from "../core/size.js";
import { templateFromJson } from "../core/cacheenv.js";
import { isRecord } from "../core/guards.js";
import { PHASE } from "../api/names.js";
import { REASON } from "../api/reasons.js";
import { followerWait, groupKey, membershipOf, type Membership } from "../core/gangs.js";
import { HASH_REF, restoreFromOf } from "../core/refs.js";
import type { Logger } from "../common/log.js";
import type { AdmissionReview } from "./server.js";
import type { WebhookConfig } from "./config.js";
import type { Backend } from "../promote/profiles.js";
import type { WebhookMetrics } from "./metrics.js";
import type { ElectionResult } from "./election.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import type { PendingEvent } from "./events.js";

/** What the decision needs from the cluster; each call is bounded by the admission deadline. */
export interface ClusterView {
  getModelCache(hashOrShort: string): Promise<ModelCacheObject | undefined>;
  /** `group`: the pod's multi-node group, recorded on the Lease it wins and compared with the one it meets. */
  tryAcquire(hash: string, electionId: string, podNamespace: string, group?: string): Promise<ElectionResult>;
  /** Returns the cache instead when it is already Ready (the caller then restores). */
  recordElection(opts: {
    hash: string;
    model?: string;
    inputs?: HashInputs;
    electionId: string;
    namespace: string;
    name?: string;
    cacheEnv?: CacheEnvTemplate;
  }): Promise<ModelCacheObject | undefined>;
  releaseLease(hash: string, leaseUid: string): Promise<void>;
  /** The storage profile's restore settings for a cache (backend-specific prewarm policy). */
  restoreProfile(
    cache: ModelCacheObject,
  ): Promise<{ prewarm: boolean; prewarmParallelism: number; treePath: string }>;
  /**
   * The cluster's cache stores' profile (by their provisioner): the prewarm policy for followers
   * (their cache is not made yet), and whether the storage can be shared at all.
   */
  followerProfile(): Promise<{
    prewarm: boolean;
    prewarmParallelism: number;
    backend?: Backend;
    why?: string;
    /** Why this storage cannot back a shared read-only claim (every pod starts cold). */
    unshareable?: string;
  }>;
  /** A restore in a namespace that has no claim yet gets one at admission. */
  ensureClaim?(cache: ModelCacheObject, namespace: string): Promise<void>;
  /** A namespace's labels (opt-out, share-group), from a short cache. */
  namespaceLabels(namespace: string): Promise<Record<string, string>>;
  /** The cache-env template in force (the ConfigMap's, or the built-in one), from a short cache. */
  cacheEnvTemplate(): Promise<CacheEnvTemplate>;
  /**
   * The NVIDIA GPU device classes of a pod's DRA claims, by `claimKey`, read from the claims and
   * the cluster's DeviceClasses (a short cache). Without it, classify goes by the claims' names.
   */
  claimGpuClasses?(
    namespace: string,
    refs: readonly ClaimRef[],
  ): Promise<ReadonlyMap<string, readonly string[]>>;
}

export interface AdmissionDeps {
  cfg: WebhookConfig;
  cluster: ClusterView;
  log: Logger;
  metrics: WebhookMetrics;
  recordEvent(ev: PendingEvent): void;
}

export interface Decision {
  role: Role | "pass";
  reason: string;
  /** The pod to admit: stamps removed, maybe decorated. Absent when the request holds no pod. */
  pod?: V1Pod;
  hash?: string;
  /** Set when the pod gets an Event (decorated pods and GPU pods left alone): it finds the pod later. */
  admissionId?: string;
}

export const mintId = (): string => randomBytes(8).toString("hex");

export const isPodCreate = (req: AdmissionReview["request"]): boolean =>
  req.operation === "CREATE" && req.resource?.resource === "pods" && !req.subResource;

/** The pod with the label its Event is found by (a pod whose metadata is not a map gets none). */
export function withAdmissionId(pod: V1Pod, admissionId: string): V1Pod {
  if (!isRecord(pod.metadata)) return pod;
  const labels = isRecord(pod.metadata.labels) ? pod.metadata.labels : {};
  return { ...pod, metadata: { ...pod.metadata, labels: { ...labels, [LABEL_ADMISSION_ID]: admissionId } } };
}

/**
 * In order: remove the author's stamps (always), leave alone, stamp, restore-from, restore, elect,
 * cold. Returns the pod to admit. Throws on cluster errors and on a pod the decoration cannot take;
 * the caller turns either into a fail-open admit (that still removes the stamps).
 */
export async function decide(
  review: AdmissionReview,
  deps: AdmissionDeps,
  /** True once the caller has stopped waiting (it already admitted the pod unchanged). */
  expired?: () => boolean,
): Promise<Decision> {
  const req = review.request;
  if (!isPodCreate(req)) return { role: "pass", reason: "not a pod creation" };
  if (!isRecord(req.object)) return { role: "pass", reason: "no pod in the request" };
  const { pod, removed } = stripStamps(req.object);
  if (removed.length) {
    for (const r of removed) deps.metrics.stampsRemoved.inc({ kind: r.slice(0, r.indexOf(":")) });
    deps.log.info(
      { namespace: req.namespace, pod: podName(pod), removed },
      "removed warmstart.dev stamps the pod's author set",
    );
  }
  const namespace = req.namespace ?? pod.metadata?.namespace ?? "default";
  const c = classifyPod(pod, { deviceClasses: await deviceClassLookup(pod, namespace, deps.cluster) });
  const gpu = c.reason !== REASON_NO_GPU && c.reason !== REASON_NO_CONTAINERS;
  // Only GPU pods get an Event for being left alone: frontends and routers are the common case.
  const leftAlone = (reason: string): Decision => {
    if (!gpu) return { role: "pass", reason, pod };
    const admissionId = mintId();
    return { role: "pass", reason, pod: withAdmissionId(pod, admissionId), admissionId };
  };
  if (!isRecord(pod.spec)) return leftAlone("no pod spec");
  // Stamps need maps to go in; a pod whose metadata maps are not maps cannot carry them.
  const meta: unknown = pod.metadata;
  const notMap = (m: unknown): boolean => m !== undefined && m !== null && !isRecord(m);
  if (notMap(meta) || (isRecord(meta) && (notMap(meta.labels) || notMap(meta.annotations))))
    return leftAlone("pod metadata is not a map");
  if (namespace === deps.cfg.systemNamespace) return leftAlone("system namespace");
  if (pod.metadata?.annotations?.[SKIP] === "true") return leftAlone(`opted out (${SKIP} annotation)`);
  if (!c.downloader) return leftAlone(c.reason);
  const nsLabels = await deps.cluster.namespaceLabels(namespace);
  if (nsLabels[SKIP] === "true") return leftAlone(`opted out (${SKIP} namespace label)`);

  const scope = scopeKey(deps.cfg.sharingScope, namespace, nsLabels);
  const { hash, inputs } = cacheHash(pod, c, { scope });
  const admissionId = mintId();
  // What waits for this pod (its gang, its group's other ranks): it is never gated behind a leader.
  const membership = membershipOf(pod, pod.spec.containers?.[c.containerIndex ?? 0]);
  const group = membership.group && groupKey(namespace, membership.group);
  const stamped = stampMembership(withAdmissionId(pod, admissionId), membership, group);
  const cold = (why: string): Decision => {
    const reason = redactUrlCredentials(why);
    return { role: "cold", reason, hash, admissionId, pod: decorateCold(stamped, { hash, reason }) };
  };
  // Where this pod's engine writes, for the decorations: the same for every pod of the hash.
  const placement = { containerIndex: c.containerIndex, locations: c.locations?.locations ?? [] };
  // What the init containers of a restore need to be admitted under a quota, and pulled.
  const initContainers = initContainerOptions(deps.cfg);
  const unpullable = initImageUnpullable(pod, deps.cfg);
  const restore = async (cache: ModelCacheObject, reason: string): Promise<Decision> => {
    if (unpullable) return cold(unpullable);
    const cacheHashFull = cache.spec.hash;
    // A dry run must not create the claim (the webhook declares no side effects on dry runs).
    if (!req.dryRun) await deps.cluster.ensureClaim?.(cache, namespace);
    const profile = await deps.cluster.restoreProfile(cache);
    // The leader's cache env is replayed, so the engine looks where the tree was written.
    const template =
      templateFromJson(cache.metadata?.annotations?.[ANN_CACHE_ENV]) ??
      (await deps.cluster.cacheEnvTemplate());
    return {
      role: "restore",
      reason,
      hash,
      admissionId,
      pod: decorateRestore(stamped, {
        ...placement,
        hash,
        reason,
        claimName: claimName(cacheHashFull),
        sourceHash: cacheHashFull,
        ...(sameTree(cache) ? { manifestDigest: cache.status!.manifestDigest } : {}),
        image: deps.cfg.image,
        ...initContainers,
        cacheRoot: deps.cfg.cacheRoot,
        cacheEnvTemplate: template,
        prewarm: profile.prewarm,
        prewarmParallelism: profile.prewarmParallelism,
        treePath: profile.treePath,
      }),
    };
  };

  // The user's own volume holds the model (pre-populated, or shared by design): theirs to manage.
  if (c.cold) return cold(c.cold);

  const restoreFrom = restoreFromOf(pod.metadata?.annotations);
  if (restoreFrom) {
    if (!HASH_REF.test(restoreFrom)) return cold(`restore-from is not a cache hash (16 or 64 hex digits)`);
    const cache = await deps.cluster.getModelCache(restoreFrom);
    // One answer for "no such cache" and "another scope's cache": no oracle across scopes.
    const reachable =
      cache !== undefined &&
      (restoreFrom.length === 16 || cache.spec.hash === restoreFrom) &&
      scopeOfInputs(cache.spec.inputs) === scope;
    if (!reachable)
      return cold(
        `restore-from ${shortHash(restoreFrom)}: no cache of that hash in this pod's sharing scope`,
      );
    if (isDeleting(cache)) return cold(`restore-from ${shortHash(restoreFrom)}: the cache is being deleted`);
    if (cache.status?.phase !== PHASE.Ready)
      return cold(`restore-from ${shortHash(restoreFrom)} has no Ready cache`);
    return restore(cache, `restore from ${shortHash(restoreFrom)} (requested)`);
  }

  // A record being deleted is as good as gone (`kubectl delete modelcache` leaves it Ready while
  // its finalizers roll the cache back): nothing restores from it, its failures no longer count,
  // and the pod is elected as if there were none. The node agent holds such a leader until the
  // record is gone, then records the new election.
  const found = await deps.cluster.getModelCache(hash);
  const deleting = isDeleting(found);
  const cache = deleting ? undefined : found;
  const whileDeleting = (why: string): string =>
    deleting ? `${why} (cache ${shortHash(hash)} is being deleted)` : why;
  if (cache?.status?.phase === PHASE.Ready) return restore(cache, "cache Ready");
  if (cache?.status?.phase === PHASE.Failed && cache.status.reason === REASON.Unsupported) {
    return cold(`cache backend unsupported: ${cache.status.message ?? ""}`.trim());
  }
  // Only captures that failed count: a leader deleted or an election past its deadline is
  // re-elected, and `warmstart cache retry` clears the count.
  const failed = Number(cache?.status?.failedCaptures ?? 0);
  if (Number.isFinite(failed) && failed >= deps.cfg.maxFailedCaptures) {
    return cold(
      `capture failed ${failed} times (last: ${cache?.status?.message ?? cache?.status?.reason ?? "?"}); ` +
        `warmstart cache retry ${shortHash(hash)} elects again`,
    );
  }

  if (!deps.cfg.electionEnabled) return cold(whileDeleting("election disabled"));
  // A dry run must not leave a Lease behind (the webhook declares no side effects on dry runs).
  if (req.dryRun) return cold(whileDeleting("dry run: no election"));

  // Read before the election: an error here must not cost a Lease.
  const template = await deps.cluster.cacheEnvTemplate();
  const profile = await deps.cluster.followerProfile();
  // Storage that clones a volume per pod cannot name a claim ahead, and a volume that would
  // show the whole store must not be shared: no leader would ever be promoted, so nobody is
  // gated behind one.
  if (profile.unshareable) return cold(profile.unshareable);
  const electionId = admissionId;
  const result = await deps.cluster.tryAcquire(hash, electionId, namespace, group);
  if (result.role === "leader") {
    // A Lease won by a pod that is then admitted unchanged (an error below, or the answer
    // already given up on) would gate every other replica behind a leader that never comes:
    // give it back.
    try {
      if (expired?.()) throw new Error("admission deadline passed after the election");
      const ready = await deps.cluster.recordElection({
        hash,
        // Never a credential in a record: the inputs' model is already redacted.
        model: inputs.model ?? undefined,
        inputs,
        electionId,
        namespace,
        name: pod.metadata?.name,
        cacheEnv: template,
      });
      if (ready) {
        await deps.cluster.releaseLease(hash, result.leaseUid);
        return await restore(ready, "cache Ready (turned Ready during admission)");
      }
      if (expired?.()) throw new Error("admission deadline passed after the election");
      // Decorated inside: a pod that cannot be decorated is admitted unchanged, so it gives the Lease back.
      const size = captureSizeLimit(pod.metadata?.annotations?.[ANN_CACHE_SIZE_LIMIT], {
        defaultLimit: deps.cfg.cacheSizeLimit,
        maxLimit: deps.cfg.maxCacheSizeLimit,
      });
      const won = whileDeleting("won the election");
      const reason = size.note ? `${won}; ${size.note}` : won;
      return {
        role: "leader",
        reason,
        hash,
        admissionId,
        pod: decorateLeader(stamped, {
          ...placement,
          hash,
          reason,
          electionId,
          cacheRoot: deps.cfg.cacheRoot,
          cacheEnvTemplate: template,
          sizeLimit: size.limit,
        }),
      };
    } catch (err) {
      await deps.cluster
        .releaseLease(hash, result.leaseUid)
        .catch((releaseErr: unknown) =>
          deps.log.warn({ err: releaseErr, hash: shortHash(hash) }, "could not give back the election Lease"),
        );
      throw err;
    }
  }
  // The ranks of one group never lead and follow each other: the first group is elected as a
  // whole, each rank capturing what it wrote (ranks the pod cannot tell apart share a hash).
  if (group && result.leaderGroup === group)
    return cold(
      `another rank of its own group (${membership.group!.kind} ${membership.group!.name}) is capturing this cache`,
    );
  // The leader's template, when its record already says it (a Failed record is the previous
  // election's, about to be reset by the new leader): the follower restores the tree it writes.
  const recorded =
    cache && cache.status?.phase !== PHASE.Failed
      ? templateFromJson(cache.metadata?.annotations?.[ANN_CACHE_ENV])
      : undefined;
  if (unpullable) return cold(unpullable);
  const wait = followerWait(membership, deps.cfg.followerMode);
  const reason = `another pod is downloading; ${wait.mode === "gate" ? "gated" : "waits running"}: ${wait.why}`;
  const follower = {
    ...placement,
    hash,
    reason,
    image: deps.cfg.image,
    ...initContainers,
    cacheRoot: deps.cfg.cacheRoot,
    cacheEnvTemplate: recorded ?? template,
    prewarm: profile.prewarm,
    prewarmParallelism: profile.prewarmParallelism,
  };
  if (wait.mode === "gate")
    return { role: "follower", reason, hash, admissionId, pod: decorateFollower(stamped, follower) };
  return {
    role: "follower",
    reason,
    hash,
    admissionId,
    pod: decorateWaitingFollower(stamped, {
      ...follower,
      waitUntil: new Date(Date.now() + deps.cfg.waitDeadline * 1000).toISOString(),
      // The tree is no larger than the largest capture volume a leader may get.
      fillSizeLimit: deps.cfg.maxCacheSizeLimit,
    }),
  };
}

/** What Warmstart found waits for the pod, on the pod, for whoever looks at it (`kubectl`, `warmstart pods`). */
function stampMembership(pod: V1Pod, m: Membership, group: string | undefined): V1Pod {
  if (!m.gang && !group) return pod;
  const annotations: Record<string, string> = {
    ...(isRecord(pod.metadata?.annotations) ? pod.metadata.annotations : {}),
  };
  if (m.gang) annotations[ANN_GANG] = `${m.gang.kind}/${m.gang.name}`;
  if (group) annotations[ANN_GROUP] = group;
  if (m.group?.rank !== undefined) annotations[ANN_RANK] = m.group.rank;
  return { ...pod, metadata: { ...pod.metadata, annotations } };
}

/**
 * What classify is told of the pod's DRA claims: the device classes the cluster says they ask
 * for; a claim not looked up (past the most looked up per pod) holds no GPU. Undefined where the
 * cluster view cannot say (classify then goes by the claims' names).
 */
async function deviceClassLookup(
  pod: V1Pod,
  namespace: string,
  cluster: ClusterView,
): Promise<DeviceClassLookup | undefined> {
  if (!cluster.claimGpuClasses) return undefined;
  const refs = podClaimRefs(pod);
  const known = refs.length ? await cluster.claimGpuClasses(namespace, refs) : new Map<string, never>();
  return (ref) => {
    const key = claimKey(ref);
    return (key !== undefined && known.get(key)) || [];
  };
}

/**
 * Why the init containers' image may not be pullable in this pod, when it needs a pull secret. A
 * Secret is its namespace's: Warmstart copies none across namespaces, and may read none there,
 * so the pod must already name one of them, itself or through its ServiceAccount (whose secrets
 * the API server merges into the pod before any webhook). Naming one it might lack would leave
 * the pod stuck on its init containers; it starts cold instead.
 */
function initImageUnpullable(pod: V1Pod, cfg: WebhookConfig): string | undefined {
  if (!cfg.imagePullSecrets.length) return undefined;
  const named = new Set(listOf(pod.spec?.imagePullSecrets).map((s) => (isRecord(s) ? s.name : undefined)));
  if (cfg.imagePullSecrets.some((n) => named.has(n))) return undefined;
  return (
    `init image may not be pullable: it needs pull secret ${cfg.imagePullSecrets.join(" or ")}, ` +
    "which the pod does not name (itself or through its ServiceAccount)"
  );
}

/** The init containers' resources, from the webhook's settings. */
function initContainerOptions(cfg: WebhookConfig): Pick<RestoreOptions, "initResources"> {
  const limits = {
    ...(cfg.initCpuLimit ? { cpu: cfg.initCpuLimit } : {}),
    ...(cfg.initMemoryLimit ? { memory: cfg.initMemoryLimit } : {}),
  };
  return {
    initResources: {
      requests: { cpu: cfg.initCpuRequest, memory: cfg.initMemoryRequest },
      ...(Object.keys(limits).length ? { limits } : {}),
    },
  };
}

/** A record with a deletion timestamp: its finalizers are rolling the cache back. */
const isDeleting = (cache: ModelCacheObject | undefined): boolean =>
  Boolean(cache?.metadata?.deletionTimestamp);

export const podName = (pod: V1Pod | undefined): string => {
  const m = isRecord(pod?.metadata) ? pod.metadata : undefined;
  const n = m?.name ?? m?.generateName;
  return typeof n === "string" ? n : "";
};

/**
 * Whether a restore mounts the captured tree itself, whose manifest the record's digest names: the
 * node-local store, host-path and a shared volume do; snapshot-clone's writer captures the tree
 * again into its own volume, with a manifest of its own (its files still checked against it).
 */
function sameTree(cache: ModelCacheObject): boolean {
  const backend = cache.status?.backend ?? "";
  return (
    Boolean(cache.status?.manifestDigest) && ["node-store", "host-path", "shared-volume"].includes(backend)
  );
}
