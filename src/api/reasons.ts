/**
 * The machine-readable words of the ModelCache API beside its human messages: the reasons a
 * record's status gives for its phase, and why a pod is not its election's leader. Code branches
 * on these values, never on a message (messages are for people and may change).
 */

/** `status.reason`: what moved the record to its phase. */
export const REASON = {
  /** Admission (or the first sighting of its leader) recorded a new election. */
  LeaderElected: "LeaderElected",
  CaptureStarted: "CaptureStarted",
  /** The tree is committed in the store; promote starts. */
  Captured: "Captured",
  Promoted: "Promoted",
  /** Counted failures: admission goes cold after a few of them. */
  CaptureFailed: "CaptureFailed",
  PromoteFailed: "PromoteFailed",
  /** The storage cannot share a cache (a final failure, not counted). */
  Unsupported: "Unsupported",
  /** Ends of an election written by the release controller (or a cancelled capture). */
  LeaderGone: "LeaderGone",
  DeadlinePassed: "DeadlinePassed",
  CaptureEnded: "CaptureEnded",
  CacheTooLarge: "CacheTooLarge",
  LeaderEvicted: "LeaderEvicted",
  /** The cache is being removed (deletion, or the store's budget making room). */
  Deleting: "Deleting",
} as const;
export type CacheReason = (typeof REASON)[keyof typeof REASON];

/** Why a pod is not the leader the record and the Lease name (`LeaderClaim`). */
export const NOT_LEADER = {
  /** The cache is Ready: nothing to capture. */
  CacheReady: "cache-ready",
  /** The record is being deleted: not the pod's fault, it may lead once the record is gone. */
  CacheDeleting: "cache-deleting",
  NoRecord: "no-record",
  /** The record is about another election. */
  OtherElection: "other-election",
  /** The election Lease is missing, held by another election, or for another hash. */
  NotElected: "not-elected",
  /** The Lease or the record names another pod as the election's leader. */
  OtherPod: "other-pod",
} as const;
export type NotLeaderReason = (typeof NOT_LEADER)[keyof typeof NOT_LEADER];
