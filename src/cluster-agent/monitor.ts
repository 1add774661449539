/**
 * Watches the GPU inventory and says when it has changed for real: node events and a periodic
 * poll both lead to one coalesced lookup; a difference from the accepted state must hold for the
 * debounce time before it is accepted; a failed lookup keeps the last known state.
 */
import type { Logger } from "../common/log.js";
import { Alarm, type Clock } from "../common/clock.js";
import { describe, sameNodes, type GpuInventory } from "./inventory.js";

export interface MonitorOptions {
  clock: Clock;
  log: Logger;
  pollIntervalMs: number;
  debounceMs: number;
  /** Node events within this window lead to a single lookup. */
  coalesceMs?: number;
  lookup: () => Promise<GpuInventory>;
  /** Called with each accepted state, the first lookup's result included. */
  onChange: (current: GpuInventory, previous: GpuInventory | undefined) => void;
  onLookupError?: (err: unknown) => void;
}

export class GpuMonitor {
  private accepted: GpuInventory | undefined;
  private candidate: { inv: GpuInventory; since: number } | undefined;
  private running: Promise<void> | undefined;
  private again = false;
  private stopped = true;
  private readonly poll: Alarm;
  private readonly debounce: Alarm;
  private readonly coalesce: Alarm;

  constructor(private readonly opts: MonitorOptions) {
    this.poll = new Alarm(opts.clock, () => {
      this.poll.set(opts.pollIntervalMs);
      this.check();
    });
    this.debounce = new Alarm(opts.clock, () => this.check());
    this.coalesce = new Alarm(opts.clock, () => this.check());
  }

  /** The accepted inventory; undefined until a first lookup succeeded. */
  get current(): GpuInventory | undefined {
    return this.accepted;
  }

  /** A change seen but not yet held for the debounce time. */
  get pendingChange(): GpuInventory | undefined {
    return this.candidate?.inv;
  }

  start(): void {
    if (!this.stopped) return;
    this.stopped = false;
    this.poll.set(this.opts.pollIntervalMs);
    this.check();
  }

  /** Something about the nodes changed: look again soon (many calls, one lookup). */
  trigger(): void {
    if (this.stopped) return;
    this.coalesce.setIfSooner(this.opts.coalesceMs ?? 250);
  }

  /** Clear every timer and wait for a lookup in flight. */
  async stop(): Promise<void> {
    this.stopped = true;
    this.poll.clear();
    this.debounce.clear();
    this.coalesce.clear();
    await this.running;
  }

  /** Run a lookup now; if one is running, run one more right after it (never two at once). */
  check(): void {
    if (this.stopped) return;
    this.coalesce.clear();
    if (this.running) {
      this.again = true;
      return;
    }
    this.running = (async () => {
      do {
        this.again = false;
        await this.once();
      } while (this.again && !this.stopped);
    })().finally(() => {
      this.running = undefined;
    });
  }

  private async once(): Promise<void> {
    let seen: GpuInventory;
    try {
      seen = await this.opts.lookup();
    } catch (err) {
      this.opts.onLookupError?.(err);
      this.opts.log.warn(
        { err, known: this.accepted ? describe(this.accepted) : "nothing yet" },
        "GPU lookup failed; keeping the last known state",
      );
      return;
    }
    if (this.stopped) return;
    const now = this.opts.clock.now();
    const { log, debounceMs } = this.opts;

    if (!this.accepted) {
      this.accept(seen);
      return;
    }
    if (sameNodes(seen, this.accepted)) {
      if (this.candidate) log.info({ gpus: describe(seen) }, "GPU change did not hold; ignored");
      this.candidate = undefined;
      this.debounce.clear();
      return;
    }
    if (!this.candidate || !sameNodes(seen, this.candidate.inv)) {
      this.candidate = { inv: seen, since: now };
      if (debounceMs <= 0) {
        this.accept(seen);
        return;
      }
      log.info(
        { from: describe(this.accepted), to: describe(seen), debounceMs },
        "GPU change seen; waiting for it to hold",
      );
      this.debounce.set(debounceMs);
      return;
    }
    const held = now - this.candidate.since;
    if (held >= debounceMs) this.accept(seen);
    else this.debounce.set(debounceMs - held);
  }

  private accept(inv: GpuInventory): void {
    const previous = this.accepted;
    this.accepted = inv;
    this.candidate = undefined;
    this.debounce.clear();
    this.opts.log.info(
      { gpus: describe(inv), total: inv.total },
      previous ? "GPU state changed" : "GPU state known",
    );
    this.opts.onChange(inv, previous);
  }
}
