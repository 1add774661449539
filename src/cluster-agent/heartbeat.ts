/**
 * Periodic heartbeat: tells the control plane the registered capacity, readiness and whether the
 * queue is paused, and carries out its instruction (`cordon`: take no new deployment requests;
 * `drain`: also remove the workloads this agent created; `none`: back to normal).
 */
import type { Logger } from "../common/log.js";
import type { HeartbeatRequest, Instruction } from "../control-plane/api.js";
import { isAbortError } from "../core/gate.js";
import { Alarm, type Clock } from "../common/clock.js";

export interface HeartbeatOptions {
  clock: Clock;
  log: Logger;
  intervalMs: () => number;
  /** Undefined when there is nothing to send (no valid credentials). */
  snapshot: () => HeartbeatRequest | undefined;
  send: (hb: HeartbeatRequest, signal: AbortSignal) => Promise<Instruction>;
  onInstruction: (i: Instruction) => Promise<void>;
  /**
   * Runs taking the snapshot and sending it, exclusive of registration: the control plane takes a
   * heartbeat's capacity, so one built before a registration must not land after it.
   */
  exclusive?: <T>(fn: () => Promise<T>, signal: AbortSignal) => Promise<T>;
}

export class Heartbeat {
  private readonly timer: Alarm;
  private readonly stopping = new AbortController();
  private running: Promise<void> | undefined;
  private stopped = true;
  private last: Instruction = "none";

  constructor(private readonly o: HeartbeatOptions) {
    this.timer = new Alarm(o.clock, () => this.beat());
  }

  get instruction(): Instruction {
    return this.last;
  }

  start(): void {
    this.stopped = false;
    this.timer.set(0);
  }

  /** Beat now (e.g. right after registering), then keep the period. */
  now(): void {
    if (!this.stopped && !this.running) this.timer.set(0);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.stopping.abort();
    this.timer.clear();
    await this.running;
    this.timer.clear();
  }

  private beat(): void {
    if (this.stopped) return;
    this.running = this.once().finally(() => {
      this.running = undefined;
      if (!this.stopped) this.timer.set(this.o.intervalMs());
    });
  }

  private async once(): Promise<void> {
    const signal = this.stopping.signal;
    const exclusive = this.o.exclusive ?? ((fn) => fn());
    try {
      const instruction = await exclusive(async () => {
        const hb = this.o.snapshot();
        return hb ? this.o.send(hb, signal) : undefined;
      }, signal);
      if (instruction === undefined) return;
      if (instruction !== this.last) {
        this.o.log.info({ from: this.last, to: instruction }, "control plane instruction changed");
        this.last = instruction;
      }
      await this.o.onInstruction(instruction);
    } catch (err) {
      if (this.stopping.signal.aborted || isAbortError(err)) return;
      this.o.log.warn({ err }, "heartbeat failed; will retry");
    }
  }
}
