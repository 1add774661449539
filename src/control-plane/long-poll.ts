/** Long polls on the control plane's queues: a receive waits here until its queue has a message. */

/** Long-poll waiters per cluster queue, woken when a message becomes visible there. */
export class Waiters {
  private readonly byKey = new Map<string, Set<() => void>>();

  wait(key: string, ms: number, signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const set = this.byKey.get(key) ?? new Set<() => void>();
      this.byKey.set(key, set);
      const done = (): void => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        set.delete(done);
        if (set.size === 0 && this.byKey.get(key) === set) this.byKey.delete(key);
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, ms));
      signal.addEventListener("abort", done, { once: true });
      set.add(done);
    });
  }

  wake(key: string): void {
    for (const fn of [...(this.byKey.get(key) ?? [])]) fn();
  }

  wakeAll(): void {
    for (const key of [...this.byKey.keys()]) this.wake(key);
  }
}

export const queueKey = (clusterId: string, queue: string): string => `${clusterId}\u0000${queue}`;
