/**
 * What the node agent does for a waiting follower on its node (SPEC 1.3 "Groups and gangs", ADR
 * 0012): pure, so every branch has a unit test. The agent fills the pod's fill volume with the
 * cache's tree once the record is Ready, writes the cold marker when no cache will come, and
 * otherwise looks again when something changes or at the pod's wait deadline.
 */
import { PHASE } from "../api/index.js";
import type * as k8s from "@kubernetes/client-node";
import { status } from "@grpc/grpc-js";
import type { ModelCacheObject } from "../common/modelcache.js";
import {
  ANN_HASH,
  ANN_ROLE,
  ANN_WAIT_UNTIL,
  FILL_VOLUME,
  INIT_SEED,
  LABEL_WAITING,
  shortHash,
} from "../core/contract.js";
import { CsiError } from "./csi/request.js";
import { ScopeOverShareError } from "./fair-share.js";

export type FillDecision =
  /** Nothing to do for this pod (not a waiting follower, or past its wait). */
  | { do: "none"; why: string }
  /** Look again at this time (the wait deadline) or when the record changes. */
  | { do: "wait"; untilMs: number; why: string }
  | { do: "cold"; reason: string }
  | { do: "fill"; hash: string };

const toMs = (t: string | Date | undefined): number | undefined => {
  if (t === undefined) return undefined;
  const ms = new Date(t).getTime();
  return Number.isFinite(ms) ? ms : undefined;
};

/** Whether some container of the pod (ephemeral ones included) could write into its fill volume. */
export function fillVolumeWritable(pod: k8s.V1Pod): boolean {
  const spec = pod.spec;
  const all = [
    ...(spec?.initContainers ?? []),
    ...(spec?.containers ?? []),
    ...(spec?.ephemeralContainers ?? []),
  ];
  return all.some((c) => (c.volumeMounts ?? []).some((m) => m.name === FILL_VOLUME && m.readOnly !== true));
}

/** The seed init container is still waiting (or not started yet): a fill can still be used. */
function seedWaiting(pod: k8s.V1Pod): boolean {
  const s = pod.status?.initContainerStatuses?.find((c) => c.name === INIT_SEED);
  return !s || !s.state?.terminated;
}

/**
 * The decision for one pod, from the pod and its cache record as the informers hold them. `now`
 * is the agent's clock. The filled or cold volume is the caller's to check (it reads the disk).
 */
export function decideFill(
  pod: k8s.V1Pod | undefined,
  cache: ModelCacheObject | undefined,
  now: number,
): FillDecision {
  if (!pod?.metadata?.uid) return { do: "none", why: "pod gone" };
  const meta = pod.metadata;
  if (meta.labels?.[LABEL_WAITING] !== "true" || meta.annotations?.[ANN_ROLE] !== "follower")
    return { do: "none", why: "not a waiting follower" };
  // eslint-disable-next-line no-restricted-syntax -- a Pod's own phase, not the cache's
  if (meta.deletionTimestamp || pod.status?.phase === "Succeeded" || pod.status?.phase === "Failed")
    return { do: "none", why: "pod terminating" };
  const hash = meta.annotations?.[ANN_HASH];
  if (!hash || !/^[0-9a-f]{64}$/.test(hash)) return { do: "none", why: "no cache hash" };
  if (!pod.spec?.volumes?.some((v) => v.name === FILL_VOLUME && v.emptyDir))
    return { do: "none", why: "no fill volume" };
  if (!seedWaiting(pod)) return { do: "none", why: "its seed has ended" };
  // The agent writes into this volume as root: nothing of the pod may write it meanwhile.
  if (fillVolumeWritable(pod))
    return { do: "cold", reason: `a container of this pod can write its ${FILL_VOLUME} volume: not filled` };

  const until = toMs(meta.annotations?.[ANN_WAIT_UNTIL]);
  if (until === undefined) return { do: "cold", reason: "no wait deadline on the pod" };
  if (now >= until)
    return { do: "cold", reason: `no cache within the wait deadline (${new Date(until).toISOString()})` };
  const short = shortHash(hash);
  const waiting = (why: string): FillDecision => ({ do: "wait", untilMs: until, why });
  if (!cache) return waiting(`cache ${short} has no record yet`);
  if (cache.spec.hash !== hash) return { do: "cold", reason: `record ${short} is another cache's` };
  if (cache.metadata.deletionTimestamp) return { do: "cold", reason: `cache ${short} is being deleted` };
  const phase = cache.status?.phase;
  if (phase === PHASE.Ready) return { do: "fill", hash };
  if (phase === PHASE.Failed) {
    // A failure written before this pod existed is the previous election's: the one it follows
    // resets the record to Electing.
    const at = toMs(cache.status?.lastTransitionTime);
    const created = toMs(meta.creationTimestamp);
    if (at === undefined || created === undefined || at >= created)
      return {
        do: "cold",
        reason:
          `the election of cache ${short} failed: ${cache.status?.reason ?? ""} ${cache.status?.message ?? ""}`.trim(),
      };
    return waiting(`cache ${short}: a failure from before this pod; waiting for the next election`);
  }
  return waiting(`cache ${short} is ${phase ?? "new"}`);
}

export type FillFailure = { do: "retry"; why: string } | { do: "cold"; reason: string };

/**
 * What a fill that failed leaves its waiting follower with. The record turns Ready a moment
 * before the leader's node records its copy, and a full store frees room as restores end: tried
 * again until the pod's deadline. A store whose room this cache's sharing scope has used up (its
 * fair share) frees none for it while its own engines run: cold at once, saying so.
 */
export function afterFillFailure(err: unknown, short: string): FillFailure {
  if (err instanceof CsiError && err.cause instanceof ScopeOverShareError)
    return {
      do: "cold",
      reason: `cache ${short} is Ready but has no room in this node's store: ${err.cause.message}`,
    };
  if (err instanceof CsiError && (err.code === status.UNAVAILABLE || err.code === status.RESOURCE_EXHAUSTED))
    return { do: "retry", why: err.message };
  return {
    do: "cold",
    reason: `cache ${short} is Ready but could not be filled here: ${(err as Error).message}`,
  };
}
