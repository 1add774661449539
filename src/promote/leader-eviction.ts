/**
 * A leader the kubelet evicted, told apart from a leader that went away: node pressure (the
 * leader filled the node's disk warming its cache) or a limit of its own (its capture volume's
 * `sizeLimit`) comes back with every election, so it is a failed capture that counts, and
 * admission goes cold after a few instead of re-electing forever. Pure: the release controller
 * reads it when it retires an election, the node agent when a capture stops.
 *
 * A kubelet eviction writes phase Failed, reason `Evicted`, its message, and a `DisruptionTarget`
 * condition (reason `TerminationByKubelet`, the same message), which may come first while the
 * containers stop. A graceful node shutdown writes that condition too, and is no eviction.
 */
import type * as k8s from "@kubernetes/client-node";
import { CACHE_VOLUME } from "../core/contract.js";
import { REASON } from "../api/reasons.js";

export interface LeaderEviction {
  /** CacheTooLarge: its capture volume outgrew its size limit; LeaderEvicted: any other eviction. */
  reason: typeof REASON.CacheTooLarge | typeof REASON.LeaderEvicted;
  /** What it means for the cache, for the record and the events: "node disk pressure". */
  cause: string;
  /** The kubelet's own words. */
  detail: string;
}

const DISRUPTION_TARGET = "DisruptionTarget";
const BY_KUBELET = "TerminationByKubelet";

/** The eviction the pod's status tells of, or undefined for any other state or end. */
export function leaderEviction(pod: k8s.V1Pod): LeaderEviction | undefined {
  const s = pod.status;
  const condition = s?.conditions?.find(
    (c) => c.type === DISRUPTION_TARGET && c.status === "True" && c.reason === BY_KUBELET,
  );
  const evicted = s?.reason === "Evicted" || (condition && !/node shutdown/i.test(condition.message ?? ""));
  if (!evicted) return undefined;
  const detail = ((s?.reason === "Evicted" ? s.message : undefined) ?? condition?.message ?? "").trim();
  return { ...classify(detail), detail };
}

/** The kubelet's messages (pkg/kubelet/eviction/helpers.go), from the most to the least specific. */
function classify(detail: string): Pick<LeaderEviction, "reason" | "cause"> {
  if (new RegExp(`EmptyDir volume "${CACHE_VOLUME}" exceeds`).test(detail))
    return { reason: REASON.CacheTooLarge, cause: "cache larger than its size limit" };
  const low = /low on resource: ([A-Za-z-]+(?:\.[A-Za-z-]+)*)/.exec(detail)?.[1];
  const pressure = /\b(Disk|Memory|PID)Pressure\b/.exec(detail)?.[1];
  if (low === "ephemeral-storage" || low === "inodes" || pressure === "Disk")
    return { reason: REASON.LeaderEvicted, cause: "node disk pressure" };
  if (low === "memory" || pressure === "Memory")
    return { reason: REASON.LeaderEvicted, cause: "node memory pressure" };
  if (low === "pids" || pressure === "PID")
    return { reason: REASON.LeaderEvicted, cause: "node PID pressure" };
  if (low) return { reason: REASON.LeaderEvicted, cause: `node pressure (${low})` };
  if (/ephemeral (local )?storage|EmptyDir volume/i.test(detail))
    return { reason: REASON.LeaderEvicted, cause: "over its ephemeral-storage limit" };
  return { reason: REASON.LeaderEvicted, cause: "evicted by the kubelet" };
}

/**
 * The record's message for an evicted leader: its cause first (`LeaderEvicted: node disk
 * pressure`), so admission's cold reason, which quotes it, says why at a glance.
 */
export function evictionMessage(e: LeaderEviction, pod: k8s.V1Pod): string {
  const who = `leader pod ${pod.metadata?.namespace ?? "?"}/${pod.metadata?.name ?? "?"}`;
  const head = e.reason === REASON.CacheTooLarge ? `CacheTooLarge: ${e.cause}` : `LeaderEvicted: ${e.cause}`;
  return `${head}: ${who} evicted by the kubelet${e.detail ? ` (${e.detail})` : ""}`;
}

/**
 * The Warning posted where an eviction was counted (on the leader, on the record): what was
 * counted and where it leads. `count`: the record's failed captures as written.
 */
export function evictionWarning(
  e: LeaderEviction,
  message: string,
  short: string,
  count: number,
): { reason: string; message: string } {
  return {
    reason: e.reason === REASON.CacheTooLarge ? "WarmstartCacheTooLarge" : "WarmstartLeaderEvicted",
    message:
      `${message}. Counted as failed capture ${count} of cache ${short}: once the count reaches the ` +
      `webhook's --max-failed-captures, its pods start cold instead of electing again ` +
      `(warmstart cache retry ${short} clears it)`,
  };
}
