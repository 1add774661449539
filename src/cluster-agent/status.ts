/**
 * Reports each accepted request's status (phase and per-pod readiness) back to the control plane.
 * Keyed by request id and level-based: a pass reads the Deployment and pods as they are now, and
 * reports only what changed since the last report. Pod events enqueue their request; a periodic
 * resync enqueues every recorded one (and prunes old tombstones).
 */
import type { Logger } from "../common/log.js";
import type { StatusReport } from "../control-plane/api.js";
import { Alarm, type Clock } from "../common/clock.js";
import type { RequestRecord, Workloads } from "./workloads.js";

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
}

export class StatusReporter {
  private readonly pending = new Set<string>();
  private readonly last = new Map<string, string>();
  private readonly flush: Alarm;
  private readonly resync: Alarm;
  private running: Promise<void> | undefined;
  private stopped = true;

  constructor(private readonly o: StatusOptions) {
    this.flush = new Alarm(o.clock, () => this.drain());
    this.resync = new Alarm(o.clock, () => {
      this.resync.set(o.resyncMs);
      this.resyncAll();
    });
  }

  start(): void {
    this.stopped = false;
    this.resync.set(0);
  }

  /** Something about this request's workload changed. */
  enqueue(requestId: string): void {
    if (this.stopped) return;
    this.pending.add(requestId);
    this.flush.setIfSooner(this.o.coalesceMs ?? 200);
  }

  /** Report once, now, regardless of what was reported before (acceptance, termination). */
  async reportNow(requestId: string, report: StatusReport): Promise<void> {
    await this.send(requestId, report);
  }

  forget(requestId: string): void {
    this.pending.delete(requestId);
    this.last.delete(requestId);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.flush.clear();
    this.resync.clear();
    await this.running;
    this.flush.clear();
    this.resync.clear();
  }

  private resyncAll(): void {
    if (!this.o.hasCredentials()) return;
    this.track(async () => {
      const records = await this.o.workloads.listRecords();
      const now = this.o.clock.now();
      for (const r of records) {
        if (r.state === "applied") this.pending.add(r.requestId);
        else if (r.state === "terminated" && now - Date.parse(r.updatedAt) > TOMBSTONE_RETENTION_MS)
          await this.o.workloads.deleteRecord(r.requestId);
      }
      this.flush.setIfSooner(0);
    });
  }

  private drain(): void {
    if (!this.o.hasCredentials()) return; // the next resync picks them up again
    this.track(async () => {
      while (this.pending.size > 0 && !this.stopped) {
        const [id] = this.pending;
        this.pending.delete(id!);
        const rec = await this.o.workloads.readRecord(id!);
        if (rec?.state !== "applied") continue;
        await this.reconcile(rec);
      }
    });
  }

  private async reconcile(rec: RequestRecord): Promise<void> {
    const s = await this.o.workloads.status(rec);
    const report: StatusReport = {
      phase: s.phase,
      instances: s.instances,
      ...(s.message ? { message: s.message } : {}),
    };
    const key = JSON.stringify(report);
    if (this.last.get(rec.requestId) === key) return;
    await this.send(rec.requestId, report);
    this.last.set(rec.requestId, key);
  }

  private async send(requestId: string, report: StatusReport): Promise<void> {
    await this.o.report(requestId, report);
    this.o.log.info(
      { requestId, phase: report.phase, ready: report.instances?.filter((i) => i.ready).length ?? 0 },
      "status reported",
    );
  }

  /** One pass at a time; a failure is a warning and the next resync tries again. */
  private track(fn: () => Promise<void>): void {
    const prev = this.running ?? Promise.resolve();
    const next = prev
      .then(fn)
      .catch((err: unknown) => {
        this.o.log.warn(
          { err: err instanceof Error ? err.message : String(err) },
          "status report pass failed; will retry",
        );
      })
      .finally(() => {
        if (this.running === next) this.running = undefined;
      });
    this.running = next;
  }
}
