import { Backoff } from "../core/backoff.js";

/**
 * A keyed work queue in the controller-runtime manner: a key queued many times is processed once,
 * never by two workers at once (a key added while it is processed runs again afterwards), a
 * failure requeues it with per-key exponential backoff, success forgets the backoff.
 */
export class WorkQueue {
  private readonly queued = new Set<string>();
  private readonly active = new Set<string>();
  private readonly dirty = new Set<string>();
  private readonly backoffs = new Map<string, Backoff>();
  private readonly timers = new Map<string, NodeJS.Timeout>();
  private readonly sleepers: (() => void)[] = [];
  private stopped = false;

  constructor(
    private readonly handler: (key: string) => Promise<void | { requeueAfterMs?: number }>,
    private readonly opts: {
      workers: number;
      initialMs?: number;
      maxMs?: number;
      onError?: (key: string, err: unknown) => void;
    },
  ) {}

  add(key: string): void {
    if (this.stopped) return;
    if (this.active.has(key)) {
      this.dirty.add(key);
      return;
    }
    this.queued.add(key);
    this.sleepers.shift()?.();
  }

  addAfter(key: string, ms: number): void {
    if (this.stopped || this.timers.has(key)) return;
    this.timers.set(
      key,
      setTimeout(() => {
        this.timers.delete(key);
        this.add(key);
      }, ms),
    );
  }

  /** Run the workers until `stop()`. */
  async run(): Promise<void> {
    await Promise.all(Array.from({ length: this.opts.workers }, () => this.worker()));
  }

  stop(): void {
    this.stopped = true;
    for (const t of this.timers.values()) clearTimeout(t);
    this.timers.clear();
    for (const wake of this.sleepers.splice(0)) wake();
  }

  get idle(): boolean {
    return this.queued.size === 0 && this.active.size === 0;
  }

  private async worker(): Promise<void> {
    while (!this.stopped) {
      const key = this.queued.values().next().value;
      if (key === undefined) {
        await new Promise<void>((resolve) => this.sleepers.push(resolve));
        continue;
      }
      this.queued.delete(key);
      this.active.add(key);
      try {
        const result = await this.handler(key);
        this.backoffs.delete(key);
        if (result?.requeueAfterMs) this.addAfter(key, result.requeueAfterMs);
      } catch (err) {
        this.opts.onError?.(key, err);
        let b = this.backoffs.get(key);
        if (!b)
          this.backoffs.set(
            key,
            (b = new Backoff({ initialMs: this.opts.initialMs ?? 5, maxMs: this.opts.maxMs ?? 60_000 })),
          );
        this.addAfter(key, b.next());
      } finally {
        this.active.delete(key);
        if (this.dirty.delete(key)) this.add(key);
      }
    }
  }
}
