/**
 * Which leader pods the agent is working on. A pod is marked in progress once; the mark is
 * released on every way out except a committed capture, so a later event (or resync) can try
 * again, while a committed capture keeps the pod retired so a resync never captures it twice.
 *
 * Release and commit act on one mark object, not on a UID: a pipeline that was cancelled and ends
 * late must never release the fresh mark a newer event has since put on the same pod.
 */

import type { Logger } from "../common/log.js";
import { shortHash } from "../core/contract.js";
import type { NodeAgentMetrics } from "./metrics.js";

export type Stage = "warmup" | "waiting-slot" | "capturing" | "promoting";

export type ReleaseReason =
  | "warmup-cancelled"
  | "pod-deleted"
  | "pod-replaced"
  | "not-ready"
  | "label-removed"
  | "terminating"
  | "capture-failed"
  | "discarded"
  | "cache-ready"
  | "unsupported"
  | "not-leader"
  | "election-ended"
  | "cache-deleted"
  | "stopped"
  | "error";

export interface Mark {
  readonly uid: string;
  /** namespace/name */
  readonly key: string;
  readonly hash: string;
  readonly since: number;
  stage: Stage;
  /** Aborted (with a ReleaseReason as its reason) when the pod goes away or changes under the mark. */
  readonly controller: AbortController;
}

export interface MarkEvent {
  type: "marked" | "released" | "committed";
  mark: Mark;
  reason?: ReleaseReason;
}

export class CaptureMarks {
  private readonly inProgress = new Map<string, Mark>();
  private readonly committed = new Map<string, { hash: string; key: string }>();
  private readonly released: { uid: string; key: string; reason: ReleaseReason; at: number }[] = [];

  constructor(
    private readonly onEvent: (ev: MarkEvent) => void = () => {},
    private readonly historySize = 200,
  ) {}

  /** Marks a pod in progress. Undefined when it already is, or its capture is committed. */
  tryMark(uid: string, key: string, hash: string, now = Date.now()): Mark | undefined {
    if (this.inProgress.has(uid) || this.committed.has(uid)) return undefined;
    const mark: Mark = { uid, key, hash, since: now, stage: "warmup", controller: new AbortController() };
    this.inProgress.set(uid, mark);
    this.onEvent({ type: "marked", mark });
    return mark;
  }

  get(uid: string): Mark | undefined {
    return this.inProgress.get(uid);
  }

  /** The mark on a pod of this namespace/name, whatever its UID (a replaced pod keeps its name). */
  forKey(key: string): Mark | undefined {
    for (const m of this.inProgress.values()) if (m.key === key) return m;
    return undefined;
  }

  /** Whether a capture of this hash is running here now (any pod). */
  busyWith(hash: string): boolean {
    for (const m of this.inProgress.values()) if (m.hash === hash) return true;
    return false;
  }

  isCommitted(uid: string): boolean {
    return this.committed.has(uid);
  }

  /** Asks the pipeline that owns the mark to stop; the pipeline releases it with this reason. */
  cancel(mark: Mark, reason: ReleaseReason): void {
    if (this.inProgress.get(mark.uid) !== mark || mark.controller.signal.aborted) return;
    mark.controller.abort(reason);
  }

  /** Releases exactly this mark; false when it is no longer the current one (already released or committed). */
  release(mark: Mark, reason: ReleaseReason, now = Date.now()): boolean {
    if (this.inProgress.get(mark.uid) !== mark) return false;
    this.inProgress.delete(mark.uid);
    if (!mark.controller.signal.aborted) mark.controller.abort(reason);
    this.remember(mark.uid, mark.key, reason, now);
    this.onEvent({ type: "released", mark, reason });
    return true;
  }

  /** The capture of this pod is committed: the pod is retired for good (until it is deleted). */
  commit(mark: Mark): boolean {
    if (this.inProgress.get(mark.uid) !== mark) return false;
    this.inProgress.delete(mark.uid);
    this.committed.set(mark.uid, { hash: mark.hash, key: mark.key });
    this.onEvent({ type: "committed", mark });
    return true;
  }

  /** A deleted pod can never come back under its UID: drop what is kept about it. */
  forget(uid: string): void {
    this.committed.delete(uid);
  }

  /** The pods of this namespace/name are gone: drop what is kept about them. */
  forgetKey(key: string): void {
    for (const [uid, c] of this.committed) if (c.key === key) this.committed.delete(uid);
  }

  /** A pod settled without ever being marked (it cannot lead): remembered as its last release. */
  settle(uid: string, key: string, reason: ReleaseReason, now = Date.now()): void {
    this.remember(uid, key, reason, now);
  }

  /** The most recent release of a pod, if any (for logs, tests and debugging). */
  lastRelease(uid: string): ReleaseReason | undefined {
    for (let i = this.released.length - 1; i >= 0; i--)
      if (this.released[i]!.uid === uid) return this.released[i]!.reason;
    return undefined;
  }

  private remember(uid: string, key: string, reason: ReleaseReason, at: number): void {
    this.released.push({ uid, key, reason, at });
    if (this.released.length > this.historySize) this.released.shift();
  }

  get inProgressCount(): number {
    return this.inProgress.size;
  }

  get committedCount(): number {
    return this.committed.size;
  }

  marks(): Mark[] {
    return [...this.inProgress.values()];
  }
}

/** Marks whose changes show in the agent's metrics and log. */
export function observedMarks(metrics: NodeAgentMetrics, log: Logger): CaptureMarks {
  const marks: CaptureMarks = new CaptureMarks((ev) => {
    metrics.marksInProgress.set(marks.inProgressCount);
    if (ev.type !== "released") return;
    metrics.marksReleased.inc({ reason: ev.reason ?? "error" });
    log.info(
      { pod: ev.mark.key, uid: ev.mark.uid, hash: shortHash(ev.mark.hash), reason: ev.reason },
      "mark released",
    );
  });
  return marks;
}
