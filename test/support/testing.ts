import { pino, type Logger } from "pino";
import type { Clock } from "../../src/common/clock.js";

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
      const due = [...this.timers.entries()]
        .filter(([, timer]) => timer.at <= end)
        .sort(([ia, a], [ib, b]) => a.at - b.at || ia - ib)[0];
      if (!due) break;
      const [id, timer] = due;
      this.timers.delete(id);
      this.t = Math.max(this.t, timer.at);
      timer.fn();
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

export interface LogEntry {
  level: number;
  msg: string;
  [k: string]: unknown;
}

/** A real pino logger that keeps its lines in memory, so tests can assert levels and messages. */
export function memoryLogger(): {
  log: Logger;
  entries: LogEntry[];
  warnings: () => LogEntry[];
  errors: () => LogEntry[];
} {
  const entries: LogEntry[] = [];
  const log = pino(
    { level: "debug" },
    {
      write(line: string) {
        entries.push(JSON.parse(line) as LogEntry);
      },
    },
  );
  return {
    log,
    entries,
    warnings: () => entries.filter((e) => e.level === 40),
    errors: () => entries.filter((e) => e.level >= 50),
  };
}

/** A promise with its resolve and reject in hand. */
export function deferred<T = void>(): {
  promise: Promise<T>;
  resolve: (v: T) => void;
  reject: (e: unknown) => void;
} {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}
