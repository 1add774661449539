/**
 * The one controller runtime every Warmstart controller runs on (docs/adr/0009-one-controller-runtime.md):
 * reconcile by key, level-based. A pass gets the key, a child logger carrying a reconcile id, and
 * an abort signal that fires when the controller stops. It returns nothing (done), asks to come
 * back later (`requeueAfterMs`), throws (retried with per-key backoff) or throws TerminalError
 * (logged, not retried until something enqueues the key again). Workers start only after every
 * informer the reconciles read from has listed once.
 */
import { randomUUID } from "node:crypto";
import { Counter, Gauge, Histogram, type Registry } from "prom-client";
import { realClock, sleep, type Clock } from "../clock.js";
import type { Logger } from "../log.js";
import { WorkQueue } from "./queue.js";

/** A failure that retrying cannot fix: logged, and the key is not requeued for it. */
export class TerminalError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "TerminalError";
  }
}

export interface ReconcileContext {
  /** Child logger with the controller, key and reconcile id. */
  log: Logger;
  /** Fires when the controller stops: long waits inside a reconcile end with it. */
  signal: AbortSignal;
  reconcileId: string;
}

export type ReconcileResult = void | { requeueAfterMs?: number };

export type Reconciler = (key: string, ctx: ReconcileContext) => Promise<ReconcileResult>;

export interface ControllerOptions {
  /** Names the controller in logs and metrics. */
  name: string;
  reconcile: Reconciler;
  log: Logger;
  clock?: Clock;
  /** Where the controller's metrics go; none when absent. */
  registry?: Registry;
  /** Reconciles of different keys at once (one key is never reconciled twice at once). */
  workers?: number;
  backoff?: { initialMs: number; maxMs: number };
  /** Each informer the reconciles read from: workers start when all have listed. */
  synced?: (() => boolean)[];
}

export type ReconcileOutcome = "success" | "error" | "requeue_after" | "terminal";

export class Controller {
  readonly queue: WorkQueue;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly metrics: ControllerMetrics | undefined;
  private readonly abort = new AbortController();
  private workers: Promise<void> | undefined;
  private readonly idleWaiters: (() => void)[] = [];

  constructor(private readonly o: ControllerOptions) {
    this.clock = o.clock ?? realClock;
    this.log = o.log.child({ controller: o.name });
    this.metrics = o.registry ? controllerMetrics(o.registry) : undefined;
    const labels = { controller: o.name };
    this.queue = new WorkQueue({
      clock: this.clock,
      backoffInitialMs: o.backoff?.initialMs ?? 5,
      backoffMaxMs: o.backoff?.maxMs ?? 60_000,
      onDepth: (depth) => this.metrics?.depth.set(labels, depth),
    });
  }

  add(key: string): void {
    if (this.abort.signal.aborted) return;
    this.metrics?.adds.inc({ controller: this.o.name });
    this.queue.add(key);
  }

  addAfter(key: string, ms: number): void {
    if (this.abort.signal.aborted) return;
    this.metrics?.adds.inc({ controller: this.o.name });
    this.queue.addAfter(key, ms);
  }

  /** Waits for the informers to list, then starts the workers (returns once they run). */
  async start(): Promise<void> {
    if (this.workers) return;
    const signal = this.abort.signal;
    while (!(this.o.synced ?? []).every((s) => s())) {
      try {
        await sleep(this.clock, 50, signal);
      } catch {
        return;
      }
    }
    if (signal.aborted) return;
    this.log.debug({ workers: this.o.workers ?? 1 }, "informers listed; starting workers");
    this.workers = Promise.all(Array.from({ length: this.o.workers ?? 1 }, () => this.worker())).then(
      () => undefined,
    );
  }

  /** Stops handing out keys, aborts the reconciles in progress and waits for them to return. */
  async stop(): Promise<void> {
    this.abort.abort("stopped");
    this.queue.shutdown();
    await this.workers;
    for (const w of this.idleWaiters.splice(0)) w();
  }

  get started(): boolean {
    return this.workers !== undefined;
  }

  /** Resolves when nothing is ready or being reconciled (keys due later may remain). Tests wait on it. */
  async idle(): Promise<void> {
    while (!this.queue.idle && !this.abort.signal.aborted)
      await new Promise<void>((r) => this.idleWaiters.push(r));
  }

  private async worker(): Promise<void> {
    for (;;) {
      const key = await this.queue.get();
      if (key === undefined) return;
      try {
        await this.reconcileOnce(key);
      } finally {
        this.queue.done(key);
        if (this.queue.idle) for (const w of this.idleWaiters.splice(0)) w();
      }
    }
  }

  private async reconcileOnce(key: string): Promise<void> {
    const reconcileId = randomUUID();
    const log = this.log.child({ key, reconcileId });
    const started = this.clock.now();
    const observe = (result: ReconcileOutcome): void =>
      this.metrics?.duration.observe(
        { controller: this.o.name, result },
        (this.clock.now() - started) / 1000,
      );
    try {
      const result = await this.o.reconcile(key, { log, signal: this.abort.signal, reconcileId });
      this.queue.forget(key);
      if (result?.requeueAfterMs !== undefined && result.requeueAfterMs >= 0) {
        observe("requeue_after");
        this.queue.addAfter(key, result.requeueAfterMs);
      } else observe("success");
    } catch (err) {
      if (this.abort.signal.aborted) {
        log.debug({ err }, "reconcile ended by the controller stopping");
        return;
      }
      if (err instanceof TerminalError) {
        observe("terminal");
        this.queue.forget(key);
        log.error({ err }, "reconcile failed for good; not retried until the key changes");
        return;
      }
      observe("error");
      this.metrics?.retries.inc({ controller: this.o.name });
      const wait = this.queue.addRateLimited(key);
      log.warn({ err, retryInMs: wait, retries: this.queue.retries(key) }, "reconcile failed; requeued");
    }
  }
}

interface ControllerMetrics {
  depth: Gauge<"controller">;
  adds: Counter<"controller">;
  retries: Counter<"controller">;
  duration: Histogram<"controller" | "result">;
}

/** One set per registry, labelled by controller: a process may run several controllers. */
const metricsByRegistry = new WeakMap<Registry, ControllerMetrics>();

function controllerMetrics(registry: Registry): ControllerMetrics {
  let m = metricsByRegistry.get(registry);
  if (m) return m;
  m = {
    depth: new Gauge({
      name: "warmstart_controller_queue_depth",
      help: "Keys waiting in the controller's queue (ready or due later)",
      labelNames: ["controller"],
      registers: [registry],
    }),
    adds: new Counter({
      name: "warmstart_controller_adds_total",
      help: "Keys added to the controller's queue",
      labelNames: ["controller"],
      registers: [registry],
    }),
    retries: new Counter({
      name: "warmstart_controller_retries_total",
      help: "Reconciles that failed and were requeued with backoff",
      labelNames: ["controller"],
      registers: [registry],
    }),
    duration: new Histogram({
      name: "warmstart_controller_reconcile_duration_seconds",
      help: "One reconcile pass, by result (success, error, requeue_after, terminal)",
      labelNames: ["controller", "result"],
      // Passes that wait on the API server, up to a promote that publishes a snapshot.
      buckets: [0.005, 0.025, 0.1, 0.25, 1, 2.5, 10, 30, 60, 180],
      registers: [registry],
    }),
  };
  metricsByRegistry.set(registry, m);
  return m;
}
