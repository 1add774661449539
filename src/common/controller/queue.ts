/**
 * A keyed, rate-limited work queue in controller-runtime's manner (its priority queue): a key
 * queued many times is handed out once; a key being worked on is never handed out to a second
 * worker (added meanwhile, it comes back once the first is done); a delayed add keeps the earlier
 * of two due times; failures back off per key (doubling to a cap), success forgets the backoff.
 * Time comes from an injected Clock, so tests run hours of requeues without sleeping.
 */
import { Backoff } from "../../core/backoff.js";
import type { Clock } from "../clock.js";

export interface QueueOptions {
  clock: Clock;
  /** First retry after a failure, then doubling (controller-runtime: 5 ms). */
  backoffInitialMs?: number;
  /** The longest wait between retries of one key. */
  backoffMaxMs?: number;
  /** Called whenever the number of waiting keys (ready + delayed) changes. */
  onDepth?: (depth: number) => void;
}

export class WorkQueue {
  /** Keys ready to hand out, in the order they became ready. */
  private readonly ready = new Set<string>();
  /** Keys handed out and not yet done. */
  private readonly active = new Set<string>();
  /** Active keys added again while worked on: ready once done. */
  private readonly dirty = new Set<string>();
  /** Keys due later: their due time and the timer that makes them ready. */
  private readonly delayed = new Map<string, { at: number; cancel: () => void }>();
  private readonly backoffs = new Map<string, Backoff>();
  private readonly waiters: ((key: string | undefined) => void)[] = [];
  private shut = false;

  constructor(private readonly o: QueueOptions) {}

  /** Ready now. A key already delayed becomes ready now (the earlier time wins). */
  add(key: string): void {
    if (this.shut) return;
    this.undelay(key);
    if (this.active.has(key)) this.dirty.add(key);
    else if (!this.ready.has(key)) {
      const waiter = this.waiters.shift();
      if (waiter) {
        this.active.add(key);
        waiter(key);
      } else this.ready.add(key);
    }
    this.depthChanged();
  }

  /** Ready in `ms`, unless it is (or will be) ready sooner. */
  addAfter(key: string, ms: number): void {
    if (this.shut) return;
    if (ms <= 0) return this.add(key);
    if (this.ready.has(key) || this.dirty.has(key)) return;
    const at = this.o.clock.now() + ms;
    const current = this.delayed.get(key);
    if (current && current.at <= at) return;
    current?.cancel();
    // Timers past 2^31-1 ms fire at once in Node: wait the longest one instead.
    const cancel = this.o.clock.setTimeout(
      () => {
        this.delayed.delete(key);
        this.add(key);
      },
      Math.min(ms, 2 ** 31 - 1),
    );
    this.delayed.set(key, { at, cancel });
    this.depthChanged();
  }

  /** Ready after this key's next backoff step; returns the wait. */
  addRateLimited(key: string): number {
    let b = this.backoffs.get(key);
    if (!b) {
      b = new Backoff({ initialMs: this.o.backoffInitialMs ?? 5, maxMs: this.o.backoffMaxMs ?? 60_000 });
      this.backoffs.set(key, b);
    }
    const wait = b.next();
    this.addAfter(key, wait);
    return wait;
  }

  /** Stop backing off this key (its work succeeded, or ended for good). */
  forget(key: string): void {
    this.backoffs.delete(key);
  }

  /** Retries of this key since it was last forgotten. */
  retries(key: string): number {
    return this.backoffs.has(key) ? this.backoffs.get(key)!.failures : 0;
  }

  /** The next ready key, waiting for one; undefined once shut down. The caller must call done(key). */
  get(): Promise<string | undefined> {
    if (this.shut) return Promise.resolve(undefined);
    const key = this.ready.values().next().value;
    if (key !== undefined) {
      this.ready.delete(key);
      this.active.add(key);
      this.depthChanged();
      return Promise.resolve(key);
    }
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  /** The work on `key` finished: if it was added meanwhile, it is ready again. */
  done(key: string): void {
    this.active.delete(key);
    if (this.dirty.delete(key)) this.add(key);
  }

  /** Hand out nothing more: waiting workers get undefined, delayed keys are dropped. */
  shutdown(): void {
    this.shut = true;
    for (const d of this.delayed.values()) d.cancel();
    this.delayed.clear();
    this.ready.clear();
    this.dirty.clear();
    for (const w of this.waiters.splice(0)) w(undefined);
    this.depthChanged();
  }

  /** Keys waiting: ready or delayed (not those being worked on). */
  get depth(): number {
    return this.ready.size + this.delayed.size;
  }

  /** When a delayed key becomes ready (clock time), if it is delayed. */
  dueAt(key: string): number | undefined {
    return this.delayed.get(key)?.at;
  }

  isActive(key: string): boolean {
    return this.active.has(key);
  }

  /** Nothing ready and nothing being worked on (delayed keys may remain). */
  get idle(): boolean {
    return this.ready.size === 0 && this.active.size === 0;
  }

  private undelay(key: string): void {
    const d = this.delayed.get(key);
    if (!d) return;
    d.cancel();
    this.delayed.delete(key);
  }

  private depthChanged(): void {
    this.o.onDepth?.(this.depth);
  }
}
