/**
 * Bounded exponential backoff: the first wait is `initialMs`, each failure doubles it (by `factor`),
 * and it never passes the cap. A cap below the initial wait never shortens it: an operator who
 * configured a slow interval on purpose keeps it.
 */
export interface BackoffOptions {
  initialMs: number;
  maxMs: number;
  factor?: number;
}

/** The wait before retry number `attempt` (0-based), without state. */
export function backoffDelay(attempt: number, opts: BackoffOptions): number {
  const cap = Math.max(opts.maxMs, opts.initialMs);
  const factor = opts.factor ?? 2;
  // Stop multiplying once capped so a long outage cannot overflow to Infinity.
  let delay = opts.initialMs;
  for (let i = 0; i < attempt && delay < cap; i++) delay *= factor;
  return Math.min(delay, cap);
}

export class Backoff {
  private attempt = 0;

  constructor(private readonly opts: BackoffOptions) {
    if (!(opts.initialMs > 0) || !(opts.maxMs > 0))
      throw new Error("backoff: initialMs and maxMs must be positive");
    if (opts.factor !== undefined && !(opts.factor >= 1))
      throw new Error("backoff: factor must be at least 1");
  }

  /** The wait to use now; the following call returns the next, longer one. */
  next(): number {
    const d = backoffDelay(this.attempt, this.opts);
    this.attempt++;
    return d;
  }

  /** The wait `next()` would return, without consuming it. */
  peek(): number {
    return backoffDelay(this.attempt, this.opts);
  }

  /** Back to the first wait (after a success, or when the situation changed). */
  reset(): void {
    this.attempt = 0;
  }

  get failures(): number {
    return this.attempt;
  }
}
