/**
 * Whether a pod is its election's leader, the only pod whose cache is ever captured: its election
 * id is the Lease's holder and the record's election, and it is the pod recorded (or now
 * recorded) as that election's leader. The first pod seen wearing an election's id is recorded as
 * its leader (a copy of its stamps can only come later).
 */
import type * as k8s from "@kubernetes/client-node";
import { PHASE } from "../api/names.js";
import { NOT_LEADER } from "../api/reasons.js";
import type { LeaderClaim } from "../common/cache-record.js";
import { apiError, isNotFound } from "../common/kube.js";
import type { Logger } from "../common/log.js";
import { recordNamesPod, recordedLeader } from "../common/modelcache.js";
import { classifyPod } from "../core/classify.js";
import { redactUrlCredentials } from "../core/env.js";
import { ANN_HASH, ANN_LEADER_NAMESPACE, leaseName, shortHash } from "../core/contract.js";
import type { LeaderSighting } from "./decide.js";
import type { AgentParts } from "./parts.js";

/**
 * Records the pod as its election's leader when none is recorded yet. The informer answers when it
 * already shows this election's leader; otherwise the record is read afresh, so a lagging informer
 * never lets a later copy of the stamps be seen first.
 */
export async function sightLeader(
  p: AgentParts,
  seen: LeaderSighting,
  uid: string,
  log: Logger,
): Promise<void> {
  const cached = p.record(shortHash(seen.hash));
  if (cached?.spec.electionId === seen.election && recordedLeader(cached)) return;
  const cache = await p.records.get(seen.hash);
  // Not this election's record (yet): a later pass looks again.
  if (!cache || cache.spec.electionId !== seen.election || cache.metadata.deletionTimestamp) return;
  if (recordedLeader(cache)) return;
  if (!recordNamesPod(cache.spec.leader, seen)) {
    log.warn(
      { election: seen.election, leader: cache.spec.leader },
      "ignored: wears the election's id, but the record names another pod",
    );
    return;
  }
  const claim = await p.records.claimLeader(seen.hash, seen.election, uid);
  if (!claim.ok)
    log.warn(
      { election: seen.election, reason: claim.reason, why: claim.why },
      "ignored: not the elected leader",
    );
}

export async function checkLeader(
  p: AgentParts,
  pod: k8s.V1Pod,
  hash: string,
  election: string,
): Promise<LeaderClaim> {
  const short = shortHash(hash);
  let cache = p.record(short);
  if (cache?.status?.phase === PHASE.Ready && !cache.metadata.deletionTimestamp)
    return { ok: false, reason: NOT_LEADER.CacheReady, why: "cache Ready", cache };
  const lease = await readLease(p, short);
  const holder = lease?.spec?.holderIdentity;
  if (!lease || holder !== election) {
    return {
      ok: false,
      reason: NOT_LEADER.NotElected,
      why: lease ? `the election Lease is held by ${holder ?? "nobody"}` : "no election Lease",
    };
  }
  const leaseHash = lease.metadata?.annotations?.[ANN_HASH];
  if (leaseHash && leaseHash !== hash)
    return { ok: false, reason: NOT_LEADER.NotElected, why: `the Lease is for hash ${leaseHash}` };
  const at = { namespace: pod.metadata?.namespace, name: pod.metadata?.name };
  const leaseNamespace = lease.metadata?.annotations?.[ANN_LEADER_NAMESPACE];
  if (leaseNamespace !== at.namespace)
    return {
      ok: false,
      reason: NOT_LEADER.OtherPod,
      why: `the election's leader is in namespace ${leaseNamespace ?? "(none)"}`,
    };
  if (cache?.spec.electionId !== election) cache = await p.records.get(short);
  if (cache && cache.spec.electionId === election && !recordNamesPod(cache.spec.leader, at))
    return { ok: false, reason: NOT_LEADER.OtherPod, why: "the election's record names another pod", cache };
  if (!cache) {
    // The election's record is gone (deleted on purpose, or never written): the Lease vouches for it.
    const model = classifyPod(pod).model;
    await p.records.ensure(hash, {
      model: model && redactUrlCredentials(model),
      electionId: election,
      leader: { namespace: pod.metadata?.namespace, name: pod.metadata?.name, node: p.cfg.node },
    });
  }
  return p.records.claimLeader(short, election, pod.metadata!.uid!);
}

async function readLease(p: AgentParts, short: string): Promise<k8s.V1Lease | undefined> {
  try {
    return await p.coordination.readNamespacedLease({
      name: leaseName(short),
      namespace: p.cfg.systemNamespace,
    });
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw apiError(`reading Lease ${leaseName(short)}`, err);
  }
}
