/**
 * A watch that keeps itself alive. client-node 1.4's informer stops on the first error and never
 * restarts; this restarts it with capped backoff, resetting once a watch has held for a while.
 */
import * as k8s from "@kubernetes/client-node";
import type { Logger } from "./log.js";
import { Backoff } from "../core/backoff.js";
import { Alarm, type Clock } from "./clock.js";

export interface ResilientWatchOptions<T extends k8s.KubernetesObject> {
  name: string;
  clock: Clock;
  log: Logger;
  informer: k8s.Informer<T>;
  /** Any add, update or delete. */
  onChange: (obj: T, kind: "add" | "update" | "delete") => void;
  /** Called on every (re)connect: whatever happened while disconnected is unknown. */
  onConnect?: () => void;
  backoff?: { initialMs: number; maxMs: number };
  /** A watch that held this long counts as healthy: the next failure starts from the first wait. */
  healthyAfterMs?: number;
}

export class ResilientWatch<T extends k8s.KubernetesObject> {
  private readonly backoff: Backoff;
  private readonly restart: Alarm;
  private stopped = true;
  private startedAt = 0;

  constructor(private readonly o: ResilientWatchOptions<T>) {
    this.backoff = new Backoff(o.backoff ?? { initialMs: 500, maxMs: 30_000 });
    this.restart = new Alarm(o.clock, () => this.begin());
    o.informer.on("add", (obj) => o.onChange(obj, "add"));
    o.informer.on("update", (obj) => o.onChange(obj, "update"));
    o.informer.on("delete", (obj) => o.onChange(obj, "delete"));
    o.informer.on("connect", () => o.onConnect?.());
    o.informer.on("error", (err: unknown) => this.failed(err));
  }

  start(): void {
    if (!this.stopped) return;
    this.stopped = false;
    this.begin();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.restart.clear();
    // A watch the informer opens on its own after this (its list overtook the stop) is closed by
    // the guard of makeInformer below.
    await this.o.informer.stop();
  }

  private begin(): void {
    if (this.stopped) return;
    this.startedAt = this.o.clock.now();
    this.o.informer.start().catch((err: unknown) => this.failed(err));
  }

  private failed(err: unknown): void {
    // One failure can surface twice (error callback and rejected start): restart once.
    if (this.stopped || this.restart.armed) return;
    if (this.o.clock.now() - this.startedAt >= (this.o.healthyAfterMs ?? 60_000)) this.backoff.reset();
    const delay = this.backoff.next();
    this.o.log.warn({ watch: this.o.name, err, retryInMs: delay }, "watch failed; restarting");
    this.restart.set(delay);
  }
}

/**
 * An informer (client-node's ListWatch, not started) whose watches never outlive its stop.
 * ListWatch lists and opens its watch again on its own (on start, and whenever a watch ends) and
 * does not look at whether it was stopped once the list or the opening returns: a stop that lands
 * in between leaves that watch open for good, and the process alive. Here the opening looks.
 */
export function makeInformer<T extends k8s.KubernetesObject>(
  kc: k8s.KubeConfig,
  path: string,
  listFn: k8s.ListPromise<T>,
  labelSelector?: string,
  fieldSelector?: string,
): k8s.ListWatch<T> {
  const real = new k8s.Watch(kc);
  // Read when a watch opens, long after the informer below exists.
  const stopped = (): boolean => (informer as unknown as { stopped: boolean }).stopped;
  const guarded = {
    watch: async (...args: Parameters<k8s.Watch["watch"]>): Promise<AbortController> => {
      const request = await real.watch(...args);
      if (stopped()) request.abort();
      return request;
    },
  } as unknown as k8s.Watch;
  const informer = new k8s.ListWatch<T>(path, guarded, listFn, false, labelSelector, fieldSelector);
  if (typeof (informer as unknown as { stopped?: unknown }).stopped !== "boolean")
    throw new Error("client-node's ListWatch keeps no stopped flag; client-node changed");
  return informer;
}
