/** A counting semaphore whose waiters can give up: bounded concurrency for captures. */
export class Slots {
  private free: number;
  private readonly waiters: { grant: () => void; signal?: AbortSignal }[] = [];

  constructor(readonly size: number) {
    if (!Number.isInteger(size) || size < 1)
      throw new Error(`slots: size must be a positive integer, got ${size}`);
    this.free = size;
  }

  /**
   * Resolves with a release function once a slot is free; rejects (with the signal's reason as cause) if it
   * aborts first, leaving no trace (a cancelled waiter never takes a slot later).
   */
  acquire(signal?: AbortSignal): Promise<() => void> {
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    if (this.free > 0) {
      this.free--;
      return Promise.resolve(this.releaser());
    }
    return new Promise((resolve, reject) => {
      const waiter = {
        signal,
        grant: (): void => {
          signal?.removeEventListener("abort", onAbort);
          resolve(this.releaser());
        },
      };
      const onAbort = (): void => {
        const i = this.waiters.indexOf(waiter);
        if (i >= 0) this.waiters.splice(i, 1);
        reject(abortReason(signal!));
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  get available(): number {
    return this.free;
  }

  get waiting(): number {
    return this.waiters.length;
  }

  private releaser(): () => void {
    let done = false;
    return () => {
      if (done) return;
      done = true;
      const next = this.waiters.shift();
      if (next) next.grant();
      else this.free++;
    };
  }
}

/** The waiter gave up; `cause` is the signal's reason. */
function abortReason(signal: AbortSignal): Error {
  return new Error("stopped waiting for a capture slot", { cause: signal.reason });
}
