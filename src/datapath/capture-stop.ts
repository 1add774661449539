/** A capture's deadline and its caller's signal, as one thing the capture checks as it goes. */
import { CaptureStoppedError } from "./capture-errors.js";

/** The deadline and the caller's signal as one: `check()` throws once either fired. */
export class CaptureStop {
  readonly signal: AbortSignal;
  private readonly ac = new AbortController();
  private why: "deadline" | "aborted" | undefined;
  private readonly timer: NodeJS.Timeout | undefined;
  private readonly onAbort = (): void => this.fire("aborted");

  constructor(
    private readonly what: string,
    private readonly deadlineMs: number,
    private readonly outer: AbortSignal | undefined,
  ) {
    this.signal = this.ac.signal;
    if (deadlineMs > 0)
      this.timer = setTimeout(() => this.fire("deadline"), Math.min(deadlineMs, 2 ** 31 - 1)).unref();
    if (outer?.aborted) this.fire("aborted");
    else outer?.addEventListener("abort", this.onAbort, { once: true });
  }

  private fire(why: "deadline" | "aborted"): void {
    if (this.why) return;
    this.why = why;
    this.ac.abort();
  }

  get fired(): boolean {
    return this.why !== undefined;
  }

  check(): void {
    if (!this.why) return;
    if (this.why === "deadline")
      throw new CaptureStoppedError(
        "deadline",
        `capture of ${this.what} passed its deadline (${Math.round(this.deadlineMs / 1000)} s); nothing was committed`,
      );
    const reason = this.outer?.reason as unknown;
    const detail =
      reason instanceof Error ? `: ${reason.message}` : typeof reason === "string" ? `: ${reason}` : "";
    throw new CaptureStoppedError(
      "aborted",
      `capture of ${this.what} was cancelled${detail}; nothing was committed`,
    );
  }

  dispose(): void {
    clearTimeout(this.timer);
    this.outer?.removeEventListener("abort", this.onAbort);
  }
}
