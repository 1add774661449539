import * as k8s from "@kubernetes/client-node";
import { PHASE, REASON } from "../../api/index.js";
import type { Logger } from "../../common/log.js";
import { apiError, apiErrorInfo, isConflict, isNotFound } from "../../common/kube.js";
import { postCacheEvent, postPodEvent } from "../../common/events.js";
import {
  ANN_DEADLINE,
  ANN_ELECTION_ID,
  ANN_TREE,
  FINALIZER_CLEANUP,
  LABEL_GATED,
  LABEL_HASH,
  SCHEDULING_GATE,
  leaseName,
} from "../../core/contract.js";
import { recordRestores, settleWaiting } from "./restores.js";
import { sourceOf, treeSubPath } from "../../promote/source.js";
import { deleteCachePass } from "../../promote/rollback.js";
import {
  evictionMessage,
  evictionWarning,
  leaderEviction,
  type LeaderEviction,
} from "../../promote/leader-eviction.js";
import {
  getModelCache,
  recordNamesPod,
  recordedLeader,
  statusOf,
  type ModelCacheObject,
  type RestoreRecord,
} from "../../common/modelcache.js";
import { CacheRecords } from "../../common/cache-record.js";
import { transition } from "../../api/transitions.js";

const jsonPatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch);

export interface ReleaseDeps {
  core: k8s.CoreV1Api;
  coordination: k8s.CoordinationV1Api;
  custom: k8s.CustomObjectsApi;
  systemNamespace: string;
  log: Logger;
  now: () => number;
  /** A Lease may exist this long before its leader pod is persisted (admission → create). */
  leaderGraceMs: number;
  /** How often an election in progress is looked at again (deadline, leader health). */
  recheckMs: number;
  onRelease?: (short: string, pods: number) => void;
  /** An election retired: why, as its record says it (a bounded set), and as the log says it. */
  onRetire?: (short: string, reason: ElectionEnd["reason"], message: string) => void;
  onEvict?: (short: string, pods: number) => void;
  /** A waiting follower that started cold (its wait ended without a cache). */
  onWaitingCold?: (short: string) => void;
  onRestore?: (short: string, restores: RestoreRecord[]) => void;
  /** Tests: runs right after the pass listed the pods (to create a pod the list cannot hold). */
  afterPodsListed?: () => Promise<void>;
  /** Tests: runs just before each follower's eviction (to replace the pod at that moment). */
  beforeEvict?: (pod: k8s.V1Pod) => void | Promise<void>;
}

export interface ReconcileResult {
  requeueAfterMs?: number;
}

export const COMPONENT = "warmstart-server";

export const isGated = (p: k8s.V1Pod): boolean =>
  (p.spec?.schedulingGates ?? []).some((g) => g.name === SCHEDULING_GATE);
const hasController = (p: k8s.V1Pod): boolean =>
  (p.metadata?.ownerReferences ?? []).some((o) => o.controller);
export const isTerminated = (p: k8s.V1Pod): boolean =>
  // eslint-disable-next-line no-restricted-syntax -- a Pod's own phase, not the cache's
  Boolean(p.metadata?.deletionTimestamp) || p.status?.phase === "Failed" || p.status?.phase === "Succeeded";
export const toMs = (t: Date | string | undefined): number | undefined =>
  t ? new Date(t).getTime() : undefined;

/**
 * One level-based pass over one cache hash: it reads the world (pods first, then the Lease, then
 * the durable cache record) and converges, whatever event woke it.
 */
export async function reconcileHash(short: string, d: ReleaseDeps): Promise<ReconcileResult> {
  // Pods before the Lease (a follower admitted later belongs to whatever election exists then, not
  // an orphan of this pass); the record last, its phase as fresh as the Lease's absence.
  const listPods = async (): Promise<k8s.V1Pod[]> =>
    (await d.core.listPodForAllNamespaces({ labelSelector: `${LABEL_HASH}=${short}` })).items;
  let pods = await listPods();
  await d.afterPodsListed?.();
  const followers = pods.filter(isGated);
  const lease = await readLease(d, leaseName(short));
  const cache = await getModelCache(d.custom, short);
  // A leader created and recorded by UID while the list was in flight is missing from it.
  const uid =
    cache && lease && cache.spec.electionId === lease.spec?.holderIdentity
      ? recordedLeader(cache)
      : undefined;
  if (uid && !pods.some((p) => p.metadata?.uid === uid)) pods = await listPods();
  const phase = cache?.status?.phase;
  const log = d.log.child({ hash: short, followers: followers.length, lease: lease?.metadata?.uid, phase });

  if (cache?.metadata.deletionTimestamp) {
    // `kubectl delete modelcache` or `warmstart cache delete`: roll the cache back.
    const report = await deleteCachePass({ core: d.core, custom: d.custom }, short, {
      startDeletion: false,
      log,
    });
    if (report.gone) return {};
    log.info(
      { left: report.left.map((l) => `${l.kind} ${l.namespace ?? ""}/${l.name}: ${l.why}`) },
      "cache deletion: waiting",
    );
    return { requeueAfterMs: d.recheckMs };
  }
  if (cache && !(cache.metadata.finalizers ?? []).includes(FINALIZER_CLEANUP)) {
    await new CacheRecords(d.custom).addFinalizer(short, FINALIZER_CLEANUP);
  }

  await recordRestores(d, short, pods, log);
  await settleWaiting(d, short, pods, log);

  if (phase === PHASE.Ready) {
    // Released at once, whether the claims are Bound yet or not: the scheduler's volume binder
    // completes a pre-bound claim for the pod it places as it places it, where waiting for the PV
    // controller to bind it alone costs up to its resync period (15 s by default).
    const source = cache ? sourceOf(cache) : undefined;
    const tree = source ? treeSubPath(source) : ".";
    for (const f of followers) await ungate(d, f, short, tree);
    if (followers.length) log.info("cache Ready: released followers");
    d.onRelease?.(short, followers.length);
    if (lease) await retireLease(d, lease, "cache Ready");
    return {};
  }

  if (lease) {
    const holder = lease.spec?.holderIdentity;
    if (cache && holder) await recordLeader(d, short, cache, holder, pods, log);
    const failure = electionFailure(d, lease, cache, pods);
    if (!failure) {
      const deadline = toMs(lease.metadata?.annotations?.[ANN_DEADLINE]);
      const untilDeadline = deadline ? Math.max(deadline - d.now(), 0) + 50 : d.recheckMs;
      return { requeueAfterMs: Math.min(d.recheckMs, untilDeadline) };
    }
    const why = failure.message;
    log.warn({ why }, "election failed: retiring its Lease and re-electing");
    if (cache && holder) await markFailed(d, short, holder, failure);
    const retired = await retireLease(d, lease, why);
    d.onRetire?.(short, failure.reason, why);
    // Only the followers listed before the Lease was retired: replacements admitted since then
    // belong to the next election.
    if (retired !== "newer") await evictFollowers(d, followers, short, why);
    return {};
  }

  if (!followers.length) return {};
  if (phase === PHASE.Capturing || phase === PHASE.Promoting) {
    log.info("orphaned followers wait: capture in progress");
    return { requeueAfterMs: d.recheckMs };
  }
  const why =
    phase === PHASE.Failed ? `cache Failed: ${cache?.status?.reason ?? ""}` : "no election and no cache";
  log.warn({ why }, "orphaned followers: evicting them to re-elect");
  await evictFollowers(d, followers, short, why);
  return {};
}

/** Why an election ended, as the record will say it (reason) and the log (message). */
export interface ElectionEnd {
  reason:
    | typeof REASON.LeaderGone
    | typeof REASON.DeadlinePassed
    | typeof REASON.CaptureEnded
    | typeof REASON.CacheTooLarge
    | typeof REASON.LeaderEvicted;
  message: string;
  /** The leader the kubelet evicted (CacheTooLarge, LeaderEvicted): a failed capture that counts. */
  evicted?: { pod: k8s.V1Pod; eviction: LeaderEviction };
}

/**
 * Whether the election is over, and why, from what one pass read (pure: `now` and the leader's
 * grace are all it takes from `d`).
 */
export function electionFailure(
  d: Pick<ReleaseDeps, "now" | "leaderGraceMs">,
  lease: k8s.V1Lease,
  cache: ModelCacheObject | undefined,
  pods: k8s.V1Pod[],
): ElectionEnd | undefined {
  const holder = lease.spec?.holderIdentity;
  // Only a failure recorded for this election counts: a Failed left by the previous election
  // (before the new leader's record is written) must not end the new one.
  if (cache?.status?.phase === PHASE.Failed && cache.spec.electionId === holder && statusOf(cache, holder)) {
    return {
      reason: REASON.CaptureEnded,
      message: `capture failed: ${cache.status.reason ?? ""} ${cache.status.message ?? ""}`.trim(),
    };
  }
  // Once promoting, the capture no longer needs its leader pod.
  const promoting = cache?.status?.phase === PHASE.Promoting && statusOf(cache, holder);
  // The leader is the pod recorded by UID when there is one: a copy of its stamps is not it.
  // Without one, a pod wearing its id where the record says the leader is (not a copy elsewhere).
  const ours = cache?.spec.electionId === holder ? cache : undefined;
  const uid = ours ? recordedLeader(ours) : undefined;
  const leader = uid
    ? pods.find((p) => p.metadata?.uid === uid)
    : pods.find(
        (p) =>
          p.metadata?.annotations?.[ANN_ELECTION_ID] === holder &&
          (!ours || recordNamesPod(ours.spec.leader, p.metadata ?? {})),
      );
  // An eviction before the deadline's look: a leader evicted and then left past the deadline is
  // still the eviction it was, which the next election would repeat.
  const eviction = leader && !promoting ? leaderEviction(leader) : undefined;
  if (leader && eviction)
    return {
      reason: eviction.reason,
      message: evictionMessage(eviction, leader),
      evicted: { pod: leader, eviction },
    };
  const deadline = toMs(lease.metadata?.annotations?.[ANN_DEADLINE]);
  if (deadline !== undefined && d.now() > deadline)
    return { reason: REASON.DeadlinePassed, message: "election past its deadline" };
  if (promoting) return undefined;
  if (!leader) {
    const acquired = toMs(lease.spec?.acquireTime) ?? toMs(lease.metadata?.creationTimestamp);
    if (uid || (acquired !== undefined && d.now() - acquired > d.leaderGraceMs))
      return { reason: REASON.LeaderGone, message: "leader pod gone" };
    return undefined;
  }
  if (isTerminated(leader))
    return {
      reason: REASON.LeaderGone,
      message: `leader pod ${leader.metadata?.namespace}/${leader.metadata?.name} terminated`,
    };
  return undefined;
}

/**
 * The election's leader by UID, recorded when exactly one live pod wears its id where the record
 * says the leader is (the id is public: a pod elsewhere wearing it is a copy).
 */
async function recordLeader(
  d: ReleaseDeps,
  short: string,
  cache: ModelCacheObject,
  holder: string,
  pods: k8s.V1Pod[],
  log: Logger,
): Promise<void> {
  if (cache.spec.electionId !== holder || recordedLeader(cache)) return;
  if (transition(cache.status?.phase, "leaderSeen", statusOf(cache, holder)) === "ignore") return;
  const wearing = pods.filter(
    (p) =>
      p.metadata?.annotations?.[ANN_ELECTION_ID] === holder &&
      !isTerminated(p) &&
      recordNamesPod(cache.spec.leader, p.metadata ?? {}),
  );
  if (wearing.length !== 1) {
    if (wearing.length > 1)
      log.warn(
        { pods: wearing.map((p) => `${p.metadata?.namespace}/${p.metadata?.name}`) },
        "several pods wear the election's id and none is recorded: leaving it to the first the node agents see",
      );
    return;
  }
  const claim = await new CacheRecords(d.custom).claimLeader(short, holder, wearing[0]!.metadata!.uid!);
  if (!claim.ok) log.info({ why: claim.why }, "leader not recorded");
}

async function readLease(d: ReleaseDeps, name: string): Promise<k8s.V1Lease | undefined> {
  try {
    return await d.coordination.readNamespacedLease({ name, namespace: d.systemNamespace });
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw apiError(`reading Lease ${name}`, err);
  }
}

/**
 * Delete exactly this Lease: UID and resourceVersion preconditions, retried on a conflict. A Lease
 * of the same name with another UID belongs to a newer election and is never deleted.
 */
export async function retireLease(
  d: ReleaseDeps,
  lease: k8s.V1Lease,
  why: string,
): Promise<"retired" | "gone" | "newer"> {
  let current = lease;
  for (let attempt = 0; attempt < 5; attempt++) {
    const { name, namespace, uid, resourceVersion } = current.metadata!;
    try {
      await d.coordination.deleteNamespacedLease({
        name: name!,
        namespace: namespace!,
        body: { preconditions: { uid, resourceVersion } },
      });
      d.log.info({ lease: name, why }, "Lease retired");
      return "retired";
    } catch (err) {
      if (isNotFound(err)) return "gone";
      if (!isConflict(err)) throw apiError(`retiring Lease ${name}`, err);
      const fresh = await readLease(d, name!);
      if (!fresh) return "gone";
      if (fresh.metadata?.uid !== uid) return "newer";
      current = fresh;
    }
  }
  throw new Error(`retiring Lease ${lease.metadata?.name}: still conflicting after 5 attempts`);
}

/**
 * Remove our scheduling gate (guarded by a `test` op, so no other gate is ever removed), and in
 * the same write tell the pod where the tree is inside its volume (its mounts read it at start).
 */
async function ungate(d: ReleaseDeps, pod: k8s.V1Pod, short: string, tree: string): Promise<void> {
  const gates = pod.spec?.schedulingGates ?? [];
  const index = gates.findIndex((g) => g.name === SCHEDULING_GATE);
  if (index < 0) return;
  const ops: object[] = [
    { op: "test", path: `/spec/schedulingGates/${index}/name`, value: SCHEDULING_GATE },
    { op: "remove", path: `/spec/schedulingGates/${index}` },
  ];
  if (!pod.metadata?.annotations) ops.push({ op: "add", path: "/metadata/annotations", value: {} });
  ops.push({ op: "add", path: `/metadata/annotations/${ANN_TREE.replace("/", "~1")}`, value: tree });
  if (pod.metadata?.labels?.[LABEL_GATED])
    ops.push({ op: "remove", path: `/metadata/labels/${LABEL_GATED.replace("/", "~1")}` });
  try {
    await d.core.patchNamespacedPod(
      { name: pod.metadata!.name!, namespace: pod.metadata!.namespace!, body: ops },
      jsonPatch,
    );
  } catch (err) {
    if (isNotFound(err)) return;
    // A failed `test` means the gates changed under us: the next pass reads them again.
    throw apiError(`releasing ${pod.metadata?.namespace}/${pod.metadata?.name}`, err);
  }
  await postPodEvent(d.core, pod, {
    type: "Normal",
    reason: "WarmstartReleased",
    message: `cache ${short} is Ready: scheduling gate removed, the pod restores from it`,
    component: COMPONENT,
  }).catch((err: unknown) => d.log.warn({ err }, "could not post event"));
}

async function evictFollowers(
  d: ReleaseDeps,
  followers: k8s.V1Pod[],
  short: string,
  why: string,
): Promise<void> {
  let evicted = 0;
  for (const pod of followers) {
    const { name, namespace } = pod.metadata as { name: string; namespace: string };
    if (!hasController(pod)) {
      d.log.warn({ pod: `${namespace}/${name}` }, "follower has no controller: left gated");
      await postPodEvent(d.core, pod, {
        type: "Warning",
        reason: "WarmstartStranded",
        message: `election for cache ${short} ended (${why}); this pod has no controller to recreate it, so it stays gated: delete and recreate it`,
        component: COMPONENT,
      }).catch(() => undefined);
      continue;
    }
    await d.beforeEvict?.(pod);
    try {
      // This pod, not one its controller made under the same name since it was listed.
      await d.core.createNamespacedPodEviction({
        name,
        namespace,
        body: {
          metadata: { name, namespace },
          deleteOptions: { preconditions: { uid: pod.metadata!.uid! } },
        },
      });
      evicted++;
    } catch (err) {
      // Gone, or its namespace is being deleted (which removes it anyway).
      if (isNotFound(err) || /being terminated/.test(apiErrorInfo(err).message)) continue;
      if (isConflict(err) || /precondition/i.test(apiErrorInfo(err).message)) {
        d.log.info(
          { pod: `${namespace}/${name}` },
          "not evicted: replaced since it was listed (the next election's)",
        );
        continue;
      }
      throw apiError(`evicting follower ${namespace}/${name}`, err);
    }
  }
  if (evicted) d.onEvict?.(short, evicted);
}

/**
 * Record how the election ended, on its own record only (the record names this election, so a
 * newer one is never touched) and only over what this pass read (a Ready written meanwhile is
 * never overwritten). Only an evicted leader counts here (`CacheRecords.fail`, once per
 * election, so a retried retirement counts it once): a leader deleted or a deadline never does.
 */
async function markFailed(d: ReleaseDeps, short: string, holder: string, end: ElectionEnd): Promise<void> {
  const records = new CacheRecords(d.custom);
  if (end.evicted) {
    // Recorded as a failed capture (the reason admission counts), the eviction's cause first in
    // its message: past the limit the hash is admitted cold, saying why.
    const r = await records.fail(short, holder, REASON.CaptureFailed, end.message);
    if (r?.written) await warnEvicted(d, short, end.evicted, end.message, r.cache);
    return;
  }
  await records.forElection(short, holder, (c) => {
    const phase = transition(c.status?.phase, "electionEnded", statusOf(c, holder));
    return phase === "ignore" ? undefined : { phase, reason: end.reason, message: end.message };
  });
}

/** A Warning on the evicted leader and on the record: what was counted, and where it leads. */
async function warnEvicted(
  d: ReleaseDeps,
  short: string,
  evicted: NonNullable<ElectionEnd["evicted"]>,
  message: string,
  cache: ModelCacheObject,
): Promise<void> {
  const ev = {
    type: "Warning" as const,
    ...evictionWarning(evicted.eviction, message, short, Number(cache.status?.failedCaptures ?? 0)),
    component: COMPONENT,
  };
  const warn = (err: unknown): void => d.log.warn({ err, hash: short }, "could not post event");
  await postPodEvent(d.core, evicted.pod, ev).catch(warn);
  await postCacheEvent(d.core, cache, ev).catch(warn);
}
