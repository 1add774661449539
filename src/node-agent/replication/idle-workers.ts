/**
 * Where a replication's workers wait for something to change (a chunk done, a source's news).
 * A change wakes one of them; one that then finds work wakes the next (receiver.ts worker), so a
 * change costs one fruitless look at the queue, not one per idle worker: at a 1 GiB tree of
 * 64 KiB chunks each look reads 16,384 queued chunks, and every answer of a filling copy is news.
 */
export class IdleWorkers {
  private waiters: (() => void)[] = [];

  /** Resolves when woken, or after `ms` (a worker also looks now and then on its own). */
  wait(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const go = (): void => {
        clearTimeout(timer);
        resolve();
      };
      // Gone from the waiters when it times out, so no later wake is spent on it.
      const timer = setTimeout(() => {
        const at = this.waiters.indexOf(go);
        if (at >= 0) this.waiters.splice(at, 1);
        resolve();
      }, ms);
      this.waiters.push(go);
    });
  }

  /** Wakes the longest waiting worker, or `all` of them (the end, when every worker must see it). */
  wake(all = false): void {
    for (const go of this.waiters.splice(0, all ? this.waiters.length : 1)) go();
  }

  get waiting(): number {
    return this.waiters.length;
  }
}
