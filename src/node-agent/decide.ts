/**
 * What the agent does about one pod it sees, as a pure function of the pod: skip it (and why),
 * or consider it for capture. Whether it is already marked or captured is the caller's concern.
 */
import type * as k8s from "@kubernetes/client-node";
import { ANN_ELECTION_ID, ANN_HASH, LABEL_CAPTURE, LABEL_HASH, shortHash } from "../core/contract.js";
import type { ReleaseReason } from "./marks.js";

export type SkipReason =
  "no-capture-label" | "other-node" | "no-hash" | "no-election-id" | "terminating" | "not-ready";

export type PodDecision =
  | { action: "skip"; reason: SkipReason; detail?: string }
  | { action: "consider"; hash: string; short: string; election: string };

export const isPodReady = (pod: k8s.V1Pod): boolean =>
  pod.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ?? false;

/** When the pod last turned Ready (watch objects carry strings, listed ones Dates). */
export function readySince(pod: k8s.V1Pod): Date | undefined {
  const c = pod.status?.conditions?.find((x) => x.type === "Ready" && x.status === "True");
  const t = c?.lastTransitionTime as Date | string | undefined;
  return t ? new Date(t) : undefined;
}

/** Creation to Ready, in seconds (one decimal), when both are known. */
export function timeToReadySeconds(pod: k8s.V1Pod): number | undefined {
  const created = pod.metadata?.creationTimestamp as Date | string | undefined;
  const ready = readySince(pod);
  if (!created || !ready) return undefined;
  const s = (ready.getTime() - new Date(created).getTime()) / 1000;
  return Number.isFinite(s) && s >= 0 ? Math.round(s * 10) / 10 : undefined;
}

/**
 * A pod that says it leads an election on this node, Ready or not: the first one seen is recorded
 * as the election's leader (a copy of its stamps can only come later).
 */
export interface LeaderSighting {
  hash: string;
  election: string;
  namespace: string;
  name: string;
}

export function leaderSighting(pod: k8s.V1Pod, node: string): LeaderSighting | undefined {
  const d = decidePod(pod, node);
  const at = { namespace: pod.metadata?.namespace ?? "", name: pod.metadata?.name ?? "" };
  if (d.action === "consider") return { hash: d.hash, election: d.election, ...at };
  if (d.reason !== "not-ready") return undefined;
  return {
    hash: pod.metadata!.annotations![ANN_HASH]!,
    election: pod.metadata!.annotations![ANN_ELECTION_ID]!,
    ...at,
  };
}

/** Whether a mark's pipeline stops for this skip: a Ready blip does not end a copy in progress. */
export function cancelsCapture(skip: SkipReason): boolean {
  return skip !== "not-ready";
}

export function decidePod(pod: k8s.V1Pod, node: string): PodDecision {
  if (pod.metadata?.labels?.[LABEL_CAPTURE] !== "true") return { action: "skip", reason: "no-capture-label" };
  if (pod.spec?.nodeName !== node)
    return { action: "skip", reason: "other-node", detail: pod.spec?.nodeName ?? "" };
  // The stamp is read, never recomposed: admission composed it from the spec as written.
  const hash = pod.metadata?.annotations?.[ANN_HASH];
  if (!hash || !/^[0-9a-f]{64}$/.test(hash)) {
    return { action: "skip", reason: "no-hash", detail: hash ? "not a sha256" : `no ${ANN_HASH} annotation` };
  }
  const label = pod.metadata?.labels?.[LABEL_HASH];
  if (label && label !== shortHash(hash)) {
    return { action: "skip", reason: "no-hash", detail: `label ${label} does not match the stamped hash` };
  }
  // Only an elected leader is ever captured (its election id is checked against the Lease and the
  // record later): the capture label alone proves nothing.
  const election = pod.metadata?.annotations?.[ANN_ELECTION_ID];
  if (!election) return { action: "skip", reason: "no-election-id" };
  if (pod.metadata?.deletionTimestamp) return { action: "skip", reason: "terminating" };
  if (pod.status?.phase !== "Running" || !isPodReady(pod)) {
    return { action: "skip", reason: "not-ready", detail: pod.status?.phase ?? "no phase" };
  }
  return { action: "consider", hash, short: shortHash(hash), election };
}

/** A skip that ends a warm-up in progress, and the reason its mark is released with. */
export function cancelReasonFor(skip: SkipReason): ReleaseReason {
  switch (skip) {
    case "no-capture-label":
      return "label-removed";
    case "terminating":
      return "terminating";
    case "not-ready":
      return "not-ready";
    case "other-node":
    case "no-hash":
      return "warmup-cancelled";
    case "no-election-id":
      return "not-leader";
  }
}
