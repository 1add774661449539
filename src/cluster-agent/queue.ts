/**
 * The queue consumer: two long-poll loops, one for deployment requests and one for terminations.
 * The deploy loop runs only while the agent is ready and not cordoned; the termination loop runs
 * whenever valid credentials are installed, so workloads can be removed even while paused.
 */
import type { Logger } from "../common/log.js";
import type { QueueMessage, QueueName, ReceiveRequest } from "../control-plane/api.js";
import { Backoff } from "../core/backoff.js";
import { isAbortError } from "../core/gate.js";
import { sleep, type Clock } from "../common/clock.js";

export interface QueueApi {
  receive(req: ReceiveRequest, signal: AbortSignal): Promise<QueueMessage[]>;
}

export interface QueueOptions {
  clock: Clock;
  log: Logger;
  api: QueueApi;
  batch: number;
  waitSeconds: number;
  visibilityTimeoutSeconds: number;
  /** GPU types to receive deployment requests for (those with capacity now). */
  gpuTypes: () => string[];
  /** Whether calls can be made at all (valid credentials installed). */
  hasCredentials: () => boolean;
  /** Handle one message; it acknowledges or releases it itself. Must not throw. */
  handle: (queue: QueueName, msg: QueueMessage) => Promise<void>;
  retry?: { initialMs: number; maxMs: number };
}

/** Resolves waiters whenever something they wait for may have changed. */
class Wakeup {
  private waiters = new Set<() => void>();

  notify(): void {
    const w = this.waiters;
    this.waiters = new Set();
    for (const f of w) f();
  }

  wait(signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      const done = (): void => {
        this.waiters.delete(done);
        signal.removeEventListener("abort", done);
        resolve();
      };
      this.waiters.add(done);
      signal.addEventListener("abort", done, { once: true });
    });
  }
}

export class QueueConsumer {
  private paused = true;
  private cordoned = false;
  private readonly stopping = new AbortController();
  /** Aborted when deploy consumption pauses, so a long poll in flight ends at once. */
  private deployPoll = new AbortController();
  private readonly wake = new Wakeup();
  private loops: Promise<void>[] = [];

  constructor(private readonly o: QueueOptions) {}

  get isPaused(): boolean {
    return this.paused;
  }

  get isCordoned(): boolean {
    return this.cordoned;
  }

  /** Whether deployment requests are being taken right now. */
  get takingDeployments(): boolean {
    return !this.paused && !this.cordoned && this.o.hasCredentials() && this.o.gpuTypes().length > 0;
  }

  start(): void {
    if (this.loops.length) return;
    this.loops = [this.loop("deploy"), this.loop("termination")];
  }

  pause(): void {
    if (this.paused) return;
    this.paused = true;
    this.o.log.info("deployment queue paused");
    this.deployPoll.abort();
  }

  resume(): void {
    if (!this.paused) return;
    this.paused = false;
    this.o.log.info("deployment queue resumed");
    this.poke();
  }

  cordon(on: boolean): void {
    if (this.cordoned === on) return;
    this.cordoned = on;
    this.o.log.info(on ? "cordoned: taking no new deployment requests" : "cordon lifted");
    if (on) this.deployPoll.abort();
    else this.poke();
  }

  /** Credentials or capacity changed: loops waiting for them look again. */
  poke(): void {
    this.wake.notify();
  }

  /** End both loops: polls in flight are cancelled, messages being handled are finished. */
  async stop(): Promise<void> {
    this.stopping.abort();
    this.deployPoll.abort();
    this.wake.notify();
    await Promise.allSettled(this.loops);
    this.loops = [];
  }

  private canRun(queue: QueueName): boolean {
    return queue === "deploy" ? this.takingDeployments : this.o.hasCredentials();
  }

  private async loop(queue: QueueName): Promise<void> {
    const stop = this.stopping.signal;
    const backoff = new Backoff(this.o.retry ?? { initialMs: 1000, maxMs: 30_000 });
    while (!stop.aborted) {
      if (!this.canRun(queue)) {
        await this.wake.wait(stop);
        continue;
      }
      if (queue === "deploy" && this.deployPoll.signal.aborted) this.deployPoll = new AbortController();
      const signal = queue === "deploy" ? AbortSignal.any([stop, this.deployPoll.signal]) : stop;
      let messages: QueueMessage[];
      try {
        messages = await this.o.api.receive(
          {
            queue,
            ...(queue === "deploy" ? { gpuTypes: this.o.gpuTypes() } : {}),
            maxMessages: this.o.batch,
            waitSeconds: this.o.waitSeconds,
            visibilityTimeoutSeconds: this.o.visibilityTimeoutSeconds,
          },
          signal,
        );
        backoff.reset();
      } catch (err) {
        if (signal.aborted || isAbortError(err)) continue;
        const delay = backoff.next();
        this.o.log.warn({ queue, err, retryInMs: delay }, "receive failed; will retry");
        await sleep(this.o.clock, delay, stop).catch(() => undefined);
        continue;
      }
      // Received messages are handled to the end even when stopping: each one is acknowledged or
      // released, never left half done.
      for (const msg of messages) await this.o.handle(queue, msg);
    }
  }
}
