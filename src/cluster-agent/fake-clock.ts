import type { Clock } from "./clock.js";

/**
 * A manual clock for unit tests: time moves only when the test says so, timers fire in deadline
 * order, and `pending` counts the timers still scheduled (a stopped component must leave none).
 */
export class FakeClock implements Clock {
  private t: number;
  private seq = 0;
  private readonly timers = new Map<number, { at: number; fn: () => void }>();

  constructor(start = 1_000_000) {
    this.t = start;
  }

  now(): number {
    return this.t;
  }

  setTimeout(fn: () => void, ms: number): () => void {
    const id = ++this.seq;
    this.timers.set(id, { at: this.t + Math.max(0, ms), fn });
    return () => {
      this.timers.delete(id);
    };
  }

  get pending(): number {
    return this.timers.size;
  }

  /** Deadlines of the live timers, relative to now, soonest first. */
  get deadlines(): number[] {
    return [...this.timers.values()].map((x) => x.at - this.t).sort((a, b) => a - b);
  }

  /**
   * Move time forward by `ms`, firing every timer that falls due (including ones scheduled by the
   * timers that fire), and letting promise chains settle after each.
   */
  async advance(ms: number): Promise<void> {
    const end = this.t + ms;
    await settle();
    for (;;) {
      let nextId: number | undefined;
      let next: { at: number; fn: () => void } | undefined;
      for (const [id, timer] of this.timers) {
        if (timer.at <= end && (!next || timer.at < next.at || (timer.at === next.at && id < nextId!))) {
          nextId = id;
          next = timer;
        }
      }
      if (!next || nextId === undefined) break;
      this.timers.delete(nextId);
      this.t = Math.max(this.t, next.at);
      next.fn();
      await settle();
    }
    this.t = end;
    await settle();
  }
}

/** Let every queued microtask and immediate run (several rounds, for chains of awaits). */
export async function settle(rounds = 5): Promise<void> {
  for (let i = 0; i < rounds; i++) await new Promise<void>((r) => setImmediate(r));
}
