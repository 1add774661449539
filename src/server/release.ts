import * as k8s from "@kubernetes/client-node";
import type { Logger } from "../common/log.js";
import { apiError, apiErrorInfo, isConflict, isNotFound } from "../common/kube.js";
import { postPodEvent } from "../common/events.js";
import { ANN_ELECTION_ID, ANN_TREE, LABEL_GATED, LABEL_HASH, SCHEDULING_GATE } from "../core/contract.js";
import { sourceOf, treeSubPath } from "../promote/source.js";
import { getModelCache, type ModelCacheObject } from "../common/modelcache.js";
import { ANN_DEADLINE } from "../core/contract.js";

const jsonPatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch);
const mergePatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);

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
  onRetire?: (short: string, why: string) => void;
  onEvict?: (short: string, pods: number) => void;
}

export interface ReconcileResult {
  requeueAfterMs?: number;
}

const COMPONENT = "warmstart-server";
const CLAIM_BIND_GRACE_MS = 10_000;

const isGated = (p: k8s.V1Pod): boolean =>
  (p.spec?.schedulingGates ?? []).some((g) => g.name === SCHEDULING_GATE);
const hasController = (p: k8s.V1Pod): boolean =>
  (p.metadata?.ownerReferences ?? []).some((o) => o.controller);
const isTerminated = (p: k8s.V1Pod): boolean =>
  Boolean(p.metadata?.deletionTimestamp) || p.status?.phase === "Failed" || p.status?.phase === "Succeeded";
const toMs = (t: Date | string | undefined): number | undefined => (t ? new Date(t).getTime() : undefined);

/**
 * One level-based pass over one cache hash (SPEC 1.7): it reads the world (pods first, then the
 * Lease, then the durable cache record) and converges, whatever event woke it.
 */
export async function reconcileHash(short: string, d: ReleaseDeps): Promise<ReconcileResult> {
  // Pods before the Lease: a follower admitted after this list belongs to whatever election
  // exists then, and is never mistaken for an orphan of this pass.
  const pods = (await d.core.listPodForAllNamespaces({ labelSelector: `${LABEL_HASH}=${short}` })).items;
  const followers = pods.filter(isGated);
  const lease = await readLease(d, short);
  const cache = await getModelCache(d.custom, short);
  const phase = cache?.status?.phase;
  const log = d.log.child({ hash: short, followers: followers.length, lease: lease?.metadata?.uid, phase });

  if (phase === "Ready") {
    // A follower released before its claim is bound is tried once by the scheduler, parked as
    // unschedulable and only retried up to half a minute later; give the binder a moment first.
    // A claim that stays unbound (a WaitForFirstConsumer class) is released after the grace.
    const readySince = toMs(cache?.status?.lastTransitionTime as string | undefined) ?? 0;
    if (d.now() - readySince < CLAIM_BIND_GRACE_MS) {
      for (const ns of new Set(followers.map((f) => f.metadata!.namespace!))) {
        if ((await claimPhase(d, ns, short)) === "Pending") return { requeueAfterMs: 200 };
      }
    }
    const source = cache ? sourceOf(cache) : undefined;
    const tree = source ? treeSubPath(source) : ".";
    for (const f of followers) await ungate(d, f, short, tree);
    if (followers.length) log.info("cache Ready: released followers");
    d.onRelease?.(short, followers.length);
    if (lease) await retireLease(d, lease, "cache Ready");
    return {};
  }

  if (lease) {
    const why = electionFailure(d, lease, cache, pods);
    if (!why) {
      const deadline = toMs(lease.metadata?.annotations?.[ANN_DEADLINE]);
      const untilDeadline = deadline ? Math.max(deadline - d.now(), 0) + 50 : d.recheckMs;
      return { requeueAfterMs: Math.min(d.recheckMs, untilDeadline) };
    }
    log.warn({ why }, "election failed: retiring its Lease and re-electing");
    if (cache) await markFailed(d, short, cache, why);
    const retired = await retireLease(d, lease, why);
    d.onRetire?.(short, why);
    // Only the followers listed before the Lease was retired: replacements admitted since then
    // belong to the next election.
    if (retired !== "newer") await evictFollowers(d, followers, short, why);
    return {};
  }

  if (!followers.length) return {};
  if (phase === "Capturing" || phase === "Promoting") {
    log.info("orphaned followers wait: capture in progress");
    return { requeueAfterMs: d.recheckMs };
  }
  const why =
    phase === "Failed" ? `cache Failed: ${cache?.status?.reason ?? ""}` : "no election and no cache";
  log.warn({ why }, "orphaned followers: evicting them to re-elect");
  await evictFollowers(d, followers, short, why);
  return {};
}

function electionFailure(
  d: ReleaseDeps,
  lease: k8s.V1Lease,
  cache: ModelCacheObject | undefined,
  pods: k8s.V1Pod[],
): string | undefined {
  const holder = lease.spec?.holderIdentity;
  // Only a failure recorded for this election counts: a Failed left by the previous election
  // (before the new leader's record is written) must not end the new one.
  if (cache?.status?.phase === "Failed" && cache.spec.electionId === holder) {
    return `capture failed: ${cache.status.reason ?? ""} ${cache.status.message ?? ""}`.trim();
  }
  const deadline = toMs(lease.metadata?.annotations?.[ANN_DEADLINE]);
  if (deadline !== undefined && d.now() > deadline) return "election past its deadline";
  // Once promoting, the capture no longer needs its leader pod.
  if (cache?.status?.phase === "Promoting") return undefined;
  const leader = pods.find((p) => p.metadata?.annotations?.[ANN_ELECTION_ID] === holder);
  if (!leader) {
    const acquired = toMs(lease.spec?.acquireTime) ?? toMs(lease.metadata?.creationTimestamp);
    if (acquired !== undefined && d.now() - acquired > d.leaderGraceMs) return "leader pod gone";
    return undefined;
  }
  if (isTerminated(leader))
    return `leader pod ${leader.metadata?.namespace}/${leader.metadata?.name} terminated`;
  return undefined;
}

async function claimPhase(d: ReleaseDeps, namespace: string, short: string): Promise<string | undefined> {
  try {
    const pvc = await d.core.readNamespacedPersistentVolumeClaim({ name: `rox-${short}`, namespace });
    return pvc.status?.phase;
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw apiError(`reading claim rox-${short} in ${namespace}`, err);
  }
}

async function readLease(d: ReleaseDeps, short: string): Promise<k8s.V1Lease | undefined> {
  try {
    return await d.coordination.readNamespacedLease({
      name: `warmstart-capture-${short}`,
      namespace: d.systemNamespace,
    });
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw apiError(`reading Lease warmstart-capture-${short}`, err);
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
      const fresh = await readLease(d, name!.replace(/^warmstart-capture-/, ""));
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
    try {
      await d.core.createNamespacedPodEviction({ name, namespace, body: { metadata: { name, namespace } } });
      evicted++;
    } catch (err) {
      // Gone, or its namespace is being deleted (which removes it anyway).
      if (isNotFound(err) || /being terminated/.test(apiErrorInfo(err).message)) continue;
      throw apiError(`evicting follower ${namespace}/${name}`, err);
    }
  }
  if (evicted) d.onEvict?.(short, evicted);
}

/**
 * Record the failed election: Failed (unless the capture already said why) and one more failed
 * attempt, so admission stops electing after a few (a capture that always fails must not evict
 * and re-elect forever).
 */
async function markFailed(
  d: ReleaseDeps,
  short: string,
  cache: ModelCacheObject,
  why: string,
): Promise<void> {
  const failures = (typeof cache.status?.failures === "number" ? cache.status.failures : 0) + 1;
  const status =
    cache.status?.phase === "Failed"
      ? { failures }
      : {
          phase: "Failed",
          reason: "ElectionFailed",
          message: why,
          failures,
          lastTransitionTime: new Date(d.now()).toISOString(),
        };
  try {
    await d.custom.patchClusterCustomObjectStatus(
      {
        group: "warmstart.dev",
        version: "v1alpha1",
        plural: "modelcaches",
        name: short,
        // Only over the record this pass read: a Ready written meanwhile must never become Failed.
        body: { metadata: { resourceVersion: cache.metadata.resourceVersion }, status },
      },
      mergePatch,
    );
  } catch (err) {
    if (!isNotFound(err)) throw apiError(`marking ModelCache ${short} Failed`, err);
  }
}
