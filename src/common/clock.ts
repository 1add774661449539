/**
 * Time as the agent sees it. Every timer the agent starts goes through a Clock, so tests can run
 * hours of backoff in milliseconds and count the timers left behind after stop().
 */
export interface Clock {
  now(): number;
  /** Schedule `fn`; the returned function cancels it (idempotent). */
  setTimeout(fn: () => void, ms: number): () => void;
}

export const realClock: Clock = {
  now: () => Date.now(),
  setTimeout(fn, ms) {
    const t = setTimeout(fn, Math.max(0, ms));
    return () => clearTimeout(t);
  },
};

/** Resolve after `ms`; reject with the signal's AbortError if it aborts first (the timer is cleared). */
export function sleep(clock: Clock, ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(abortError());
      return;
    }
    const onAbort = (): void => {
      cancel();
      reject(abortError());
    };
    const cancel = clock.setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

export function abortError(): Error {
  return new DOMException("the operation was aborted", "AbortError");
}

/**
 * A timer that can be (re)armed and disarmed, for work that must happen at most once per period
 * (the next retry, the next renewal): arming again replaces the previous deadline.
 */
export class Alarm {
  private cancel: (() => void) | undefined;
  private at: number | undefined;

  constructor(
    private readonly clock: Clock,
    private readonly fire: () => void,
  ) {}

  /** Fire in `ms` from now, replacing any earlier schedule. */
  set(ms: number): void {
    // Timers past 2^31-1 ms fire at once in Node: a longer wait fires at the longest one instead.
    ms = Math.min(ms, 2 ** 31 - 1);
    this.clear();
    this.at = this.clock.now() + ms;
    this.cancel = this.clock.setTimeout(() => {
      this.cancel = undefined;
      this.at = undefined;
      this.fire();
    }, ms);
  }

  /** Fire in `ms` unless already due sooner. */
  setIfSooner(ms: number): void {
    if (this.at !== undefined && this.at <= this.clock.now() + ms) return;
    this.set(ms);
  }

  clear(): void {
    this.cancel?.();
    this.cancel = undefined;
    this.at = undefined;
  }

  get armed(): boolean {
    return this.cancel !== undefined;
  }

  /** When it fires (clock time), if armed. */
  get due(): number | undefined {
    return this.at;
  }
}
