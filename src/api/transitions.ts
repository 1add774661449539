/**
 * Which phase a record may move to, in one pure table: current phase x event x whether the
 * record's status was written for the election the event is about (same) or for another one
 * (other, including a status left by an earlier election). Every writer of a phase asks
 * `transition` before it writes; "ignore" means leave the record as it is.
 *
 * Conditions that are not about the phase stay with the writer: that the record is about the
 * event's election at all (`CacheRecords.forElection`), that it is not being deleted, what the
 * write counts (`failedCaptures`). Putting back the status a `deleting` mark replaced (a store
 * that made room, when a restore was admitted meanwhile) is an undo of that write, not a
 * transition.
 *
 * Writers: `CacheRecords.advance(hash, election, event, fields)` applies `next` for one election
 * and writes the phase with the writer's fields; `CacheRecords.fail` is `failed` plus the count.
 */
import type { CachePhase } from "./names.js";
import type { ModelCacheStatus } from "./modelcache.js";

export const CACHE_EVENTS = [
  /** Admission won a new election and records it (the webhook's reset of a record left behind). */
  "elect",
  /** The election's leader pod is recorded by UID (release controller or node agent). */
  "leaderSeen",
  /** The leader's node agent starts copying its cache after the warm-up. */
  "captureStarted",
  /** The tree is committed in the store; promote starts. */
  "captured",
  /** A promote of an election whose own promote failed, tried again (at a resync, not before).
   * Asked for by name only; `next` refuses it over a Failed election that ended another way,
   * which the table's cells do not know (callers of `transition` alone must check the reason). */
  "retryPromote",
  /** Every namespace that needs one has its read-only claim: the cache is restorable. */
  "promoted",
  /** The capture or promote failed (CaptureFailed, PromoteFailed, Unsupported, a cancelled capture). */
  "failed",
  /** The release controller retires the election (LeaderGone, DeadlinePassed, CaptureEnded). */
  "electionEnded",
  /** The cache is being removed (deletion, or the store's budget): nothing restores from it any more. */
  "deleting",
] as const;
export type CacheEvent = (typeof CACHE_EVENTS)[number];

/** The phase to write, or "ignore" (write nothing). */
export type Next = CachePhase | "ignore";
/** A record with no phase yet (created, never written, or from before phases). */
export type From = CachePhase | "none";

const I = "ignore";
/** [same election, other election] */
type Cell = readonly [same: Next, other: Next];

/**
 * Rows are the current phase, columns the event. Read a row as "what a record in this phase
 * accepts". Ready is final for every event but `deleting`; a Failed election stays failed for its
 * own later words (the first word on how an election ended stands) but not for another election's.
 * `leaderSeen` answering the current phase means: the phase stays, only the leader is recorded.
 */
export const TRANSITIONS: Readonly<Record<From, Readonly<Record<CacheEvent, Cell>>>> = {
  none: {
    elect: ["Electing", "Electing"],
    leaderSeen: ["Electing", "Electing"],
    captureStarted: ["Capturing", "Capturing"],
    captured: ["Promoting", "Promoting"],
    retryPromote: ["Promoting", "Promoting"],
    promoted: [I, I],
    failed: ["Failed", "Failed"],
    electionEnded: ["Failed", "Failed"],
    deleting: ["Failed", "Failed"],
  },
  Electing: {
    elect: ["Electing", "Electing"],
    leaderSeen: ["Electing", "Electing"],
    captureStarted: ["Capturing", "Capturing"],
    captured: ["Promoting", "Promoting"],
    retryPromote: ["Promoting", "Promoting"],
    promoted: [I, I],
    failed: ["Failed", "Failed"],
    electionEnded: ["Failed", "Failed"],
    deleting: ["Failed", "Failed"],
  },
  Capturing: {
    elect: ["Electing", "Electing"],
    leaderSeen: ["Capturing", "Electing"],
    captureStarted: ["Capturing", "Capturing"],
    captured: ["Promoting", "Promoting"],
    retryPromote: ["Promoting", "Promoting"],
    promoted: [I, I],
    failed: ["Failed", "Failed"],
    electionEnded: ["Failed", "Failed"],
    deleting: ["Failed", "Failed"],
  },
  Promoting: {
    elect: ["Electing", "Electing"],
    leaderSeen: ["Promoting", "Electing"],
    captureStarted: ["Capturing", "Capturing"],
    captured: ["Promoting", "Promoting"],
    retryPromote: ["Promoting", "Promoting"],
    promoted: ["Ready", I],
    failed: ["Failed", "Failed"],
    electionEnded: ["Failed", "Failed"],
    deleting: ["Failed", "Failed"],
  },
  Ready: {
    elect: [I, I],
    leaderSeen: [I, I],
    captureStarted: [I, I],
    captured: [I, I],
    retryPromote: [I, I],
    promoted: [I, I],
    failed: [I, I],
    electionEnded: [I, I],
    deleting: ["Failed", "Failed"],
  },
  Failed: {
    elect: ["Electing", "Electing"],
    leaderSeen: ["Failed", "Electing"],
    captureStarted: [I, "Capturing"],
    captured: [I, "Promoting"],
    retryPromote: ["Promoting", "Promoting"],
    promoted: [I, I],
    failed: [I, "Failed"],
    electionEnded: [I, "Failed"],
    deleting: ["Failed", "Failed"],
  },
};

/**
 * The phase a record in `phase` moves to on `event`, or "ignore". `sameElection`: the record's
 * status was written for the event's election (`status.electionId` is that election).
 *
 * For a writer that holds the status rather than its parts, `next` below reads them from it.
 */
export function transition(phase: CachePhase | undefined, event: CacheEvent, sameElection: boolean): Next {
  const cell = TRANSITIONS[phase ?? "none"][event];
  return sameElection ? cell[0] : cell[1];
}

/**
 * The same, from a status and the event's election: same election when the status names it. A
 * retry is asked for by name (`retryPromote`), never read into a `captured`: a promote resumed on a
 * stale look at the record would otherwise start over an election whose promote just failed. It
 * retries only a promote that failed: an election that ended otherwise stays as it ended.
 */
export function next(status: ModelCacheStatus | undefined, event: CacheEvent, election: string): Next {
  const same = status?.electionId === election;
  if (event === "retryPromote" && same && status?.phase === "Failed" && status.reason !== "PromoteFailed")
    return "ignore";
  return transition(status?.phase, event, same);
}
