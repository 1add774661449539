/**
 * Waiting followers as the cluster shows them (SPEC 1.3 "Groups and gangs"): the outcome their
 * seed reported in its termination message, and what they wait for.
 */
import type { V1Pod } from "@kubernetes/client-node";
import {
  ANN_ROLE,
  ANN_WAIT_UNTIL,
  FILL_VOLUME,
  INIT_SEED,
  LABEL_WAITING,
  type SeedOutcome,
} from "./contract.js";
import { isRecord } from "./guards.js";

/** A follower that waits running (not gated) for its cache, and has not been settled cold. */
export const isWaitingFollower = (pod: V1Pod): boolean =>
  pod.metadata?.labels?.[LABEL_WAITING] === "true" && pod.metadata.annotations?.[ANN_ROLE] === "follower";

/** Its spec has the fill volume: its tree, if any, came from its node's agent (nobody changes a spec). */
export const hasFillVolume = (pod: V1Pod): boolean =>
  (pod.spec?.volumes ?? []).some((v) => v.name === FILL_VOLUME && v.emptyDir !== undefined);

/** When it stops waiting (epoch ms), from its stamp; undefined when there is none. */
export function waitUntilOf(pod: V1Pod): number | undefined {
  const t = pod.metadata?.annotations?.[ANN_WAIT_UNTIL];
  const ms = t ? Date.parse(t) : NaN;
  return Number.isFinite(ms) ? ms : undefined;
}

/**
 * What the seed of a waiting follower reported when it ended (its termination message, one line
 * of JSON): restored, or cold and why. Undefined while it runs, or when the message is not one.
 */
export function seedOutcome(pod: V1Pod): SeedOutcome | undefined {
  const s = (pod.status?.initContainerStatuses ?? []).find((c) => c.name === INIT_SEED);
  const message = s?.state?.terminated?.message ?? s?.lastState?.terminated?.message;
  if (!message) return undefined;
  let v: unknown;
  try {
    v = JSON.parse(message.trim());
  } catch {
    return undefined;
  }
  if (!isRecord(v) || (v.outcome !== "restored" && v.outcome !== "cold")) return undefined;
  const waitedMs = typeof v.waitedMs === "number" && Number.isFinite(v.waitedMs) ? v.waitedMs : 0;
  const reason = typeof v.reason === "string" ? v.reason.slice(0, 512) : undefined;
  return { outcome: v.outcome, waitedMs, ...(reason ? { reason } : {}) };
}
