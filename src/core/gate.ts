/**
 * A first-come, first-served mutex whose waiting honours an AbortSignal. A waiter cancelled before
 * it gets the gate leaves the queue and never runs its work; a cancelled holder is not interrupted
 * (its work decides how to react to the signal), it just releases the gate when done.
 */
interface Waiter {
  grant: (release: () => void) => void;
  signal?: AbortSignal;
  onAbort?: () => void;
}

export class Gate {
  private held = false;
  private readonly queue: Waiter[] = [];

  get locked(): boolean {
    return this.held;
  }

  get waiting(): number {
    return this.queue.length;
  }

  /** Wait for the gate; resolves with its release function (idempotent), rejects if `signal` aborts first. */
  acquire(signal?: AbortSignal): Promise<() => void> {
    if (signal?.aborted) return Promise.reject(abortReason(signal));
    if (!this.held) {
      this.held = true;
      return Promise.resolve(this.releaser());
    }
    return new Promise((resolve, reject) => {
      const waiter: Waiter = { grant: resolve, signal };
      if (signal) {
        waiter.onAbort = () => {
          const i = this.queue.indexOf(waiter);
          if (i >= 0) this.queue.splice(i, 1);
          reject(abortReason(signal));
        };
        signal.addEventListener("abort", waiter.onAbort, { once: true });
      }
      this.queue.push(waiter);
    });
  }

  /**
   * Run `fn` holding the gate. If `signal` aborts while waiting, or between being granted the gate
   * and starting, `fn` never runs: the cancelled caller has no side effects.
   */
  async run<T>(fn: () => Promise<T> | T, signal?: AbortSignal): Promise<T> {
    const release = await this.acquire(signal);
    try {
      if (signal?.aborted) throw abortReason(signal);
      return await fn();
    } finally {
      release();
    }
  }

  private releaser(): () => void {
    let done = false;
    return () => {
      if (done) return;
      done = true;
      this.handOver();
    };
  }

  private handOver(): void {
    const next = this.queue.shift();
    if (!next) {
      this.held = false;
      return;
    }
    if (next.signal && next.onAbort) next.signal.removeEventListener("abort", next.onAbort);
    next.grant(this.releaser());
  }
}

function abortReason(signal: AbortSignal): Error {
  const r: unknown = signal.reason;
  if (r instanceof Error) return r;
  return new DOMException("the operation was aborted", "AbortError");
}

/** True for the error an aborted wait rejects with. */
export function isAbortError(err: unknown): boolean {
  return err instanceof Error && (err.name === "AbortError" || err.name === "TimeoutError");
}
