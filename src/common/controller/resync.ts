/**
 * The periodic resync of a controller whose passes read informers' caches: every key the caches
 * name is enqueued again each period, so a pass an event did not cause (a deadline, a retry that
 * gave up) still comes. Passes are level-based, so an extra one changes nothing.
 */
import type { Clock } from "../clock.js";

export interface ResyncOptions {
  clock: Clock;
  periodMs: number;
  /** The keys to enqueue, read when the period ends (from the caches, never the API server). */
  keys: () => Iterable<string>;
  add: (key: string) => void;
}

/** Starts the resync; the returned function stops it (idempotent). */
export function resyncEvery(o: ResyncOptions): () => void {
  let cancel: (() => void) | undefined;
  let stopped = false;
  const tick = (): void => {
    if (stopped) return;
    for (const key of new Set(o.keys())) o.add(key);
    cancel = o.clock.setTimeout(tick, o.periodMs);
  };
  cancel = o.clock.setTimeout(tick, o.periodMs);
  return () => {
    stopped = true;
    cancel?.();
  };
}
