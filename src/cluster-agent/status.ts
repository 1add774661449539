/**
 * Reports each accepted request's status (phase and per-pod readiness) back to the control plane,
 * as a controller on the shared runtime keyed by request id. Level-based: a pass reads the
 * Deployment and pods as they are now and reports only what changed since the last report; a
 * report that fails is requeued with backoff. Pod events enqueue their request (a burst within
 * the coalescing window is one pass); a periodic resync enqueues every recorded one and prunes
 * old tombstones.
 */
import type { Registry } from "prom-client";
import { Alarm, type Clock } from "../common/clock.js";
import { Controller } from "../common/controller/controller.js";
import type { Logger } from "../common/log.js";
import type { StatusReport } from "../control-plane/api.js";
import type { Workloads } from "./workloads.js";

/** How long a termination tombstone is kept so a late redelivery of the request is recognised. */
export const TOMBSTONE_RETENTION_MS = 24 * 3600_000;

export interface StatusOptions {
  clock: Clock;
  log: Logger;
  workloads: Workloads;
  report: (requestId: string, report: StatusReport) => Promise<void>;
  hasCredentials: () => boolean;
  resyncMs: number;
  /** Pod events within this window lead to one pass. */
  coalesceMs?: number;
  registry?: Registry;
}

export class StatusReporter {
  private readonly last = new Map<string, string>();
  private readonly controller: Controller;
  private readonly resync: Alarm;
  private resyncing: Promise<void> | undefined;
  private stopped = true;

  constructor(private readonly o: StatusOptions) {
    this.controller = new Controller({
      name: "cluster-agent-status",
      reconcile: (requestId) => this.reconcile(requestId),
      log: o.log,
      clock: o.clock,
      ...(o.registry ? { registry: o.registry } : {}),
      // One report at a time; a control plane that is down is asked again within a resync.
      workers: 1,
      backoff: { initialMs: 500, maxMs: o.resyncMs },
    });
    this.resync = new Alarm(o.clock, () => {
      this.resync.set(o.resyncMs);
      this.resyncing = this.resyncAll()
        .catch((err: unknown) => o.log.warn({ err }, "status resync failed; the next one retries"))
        .finally(() => (this.resyncing = undefined));
    });
  }

  start(): void {
    this.stopped = false;
    void this.controller.start();
    this.resync.set(0);
  }

  /** Something about this request's workload changed. */
  enqueue(requestId: string): void {
    if (this.stopped) return;
    this.controller.addAfter(requestId, this.o.coalesceMs ?? 200);
  }

  /** Report once, now, regardless of what was reported before (acceptance, termination). */
  async reportNow(requestId: string, report: StatusReport): Promise<void> {
    await this.send(requestId, report);
  }

  forget(requestId: string): void {
    this.last.delete(requestId);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.resync.clear();
    await this.resyncing;
    await this.controller.stop();
  }

  private async resyncAll(): Promise<void> {
    if (!this.o.hasCredentials()) return;
    const records = await this.o.workloads.listRecords();
    const now = this.o.clock.now();
    for (const r of records) {
      if (r.state === "applied") this.controller.add(r.requestId);
      else if (r.state === "terminated" && now - Date.parse(r.updatedAt) > TOMBSTONE_RETENTION_MS)
        await this.o.workloads.deleteRecord(r.requestId);
    }
  }

  private async reconcile(requestId: string): Promise<void> {
    if (!this.o.hasCredentials()) return; // the next resync brings it back
    const rec = await this.o.workloads.readRecord(requestId);
    if (rec?.state !== "applied") return;
    const s = await this.o.workloads.status(rec);
    const report: StatusReport = {
      phase: s.phase,
      instances: s.instances,
      ...(s.message ? { message: s.message } : {}),
    };
    const key = JSON.stringify(report);
    if (this.last.get(requestId) === key) return;
    await this.send(requestId, report);
    this.last.set(requestId, key);
  }

  private async send(requestId: string, report: StatusReport): Promise<void> {
    await this.o.report(requestId, report);
    this.o.log.info(
      { requestId, phase: report.phase, ready: report.instances?.filter((i) => i.ready).length ?? 0 },
      "status reported",
    );
  }
}
