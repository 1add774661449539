import assert from "node:assert/strict";
import { test } from "node:test";
import { FakeClock, memoryLogger } from "../../test/support/testing.js";
import type { StatusReport } from "../control-plane/api.js";
import { StatusReporter, TOMBSTONE_RETENTION_MS } from "./status.js";
import type { RequestRecord, Workloads } from "./workloads.js";

/** Workload records and their status as the test sets them (the Kubernetes side is the integration tests'). */
function setup(): {
  clock: FakeClock;
  reporter: StatusReporter;
  records: Map<string, RequestRecord>;
  phase: { value: string };
  sent: { id: string; report: StatusReport; at: number }[];
  failing: { count: number };
} {
  const clock = new FakeClock(Date.parse("2026-12-01T12:00:00Z"));
  const records = new Map<string, RequestRecord>();
  const phase = { value: "Pending" };
  const sent: { id: string; report: StatusReport; at: number }[] = [];
  const failing = { count: 0 };
  const workloads = {
    readRecord: (id: string) => Promise.resolve(records.get(id)),
    listRecords: () => Promise.resolve([...records.values()]),
    deleteRecord: (id: string) => Promise.resolve(void records.delete(id)),
    status: () => Promise.resolve({ phase: phase.value, instances: [] }),
  } as unknown as Workloads;
  const reporter = new StatusReporter({
    clock,
    log: memoryLogger().log,
    workloads,
    resyncMs: 15_000,
    hasCredentials: () => true,
    report: (id, report) => {
      if (failing.count > 0) {
        failing.count--;
        return Promise.reject(new Error("control plane unavailable"));
      }
      sent.push({ id, report, at: clock.now() });
      return Promise.resolve();
    },
  });
  return { clock, reporter, records, phase, sent, failing };
}

const applied = (id: string, updatedAt = "2026-12-01T12:00:00Z"): RequestRecord => ({
  requestId: id,
  messageId: "m",
  name: id,
  namespace: "ns",
  state: "applied",
  updatedAt,
});

test("a burst of pod events is one report, sent once the coalescing window ends; an unchanged status is not sent again", async () => {
  const s = setup();
  s.records.set("r1", applied("r1"));
  s.reporter.start();
  await s.clock.advance(0);
  assert.equal(s.sent.length, 1, "the first resync reports every applied request");
  const t0 = s.clock.now();
  s.phase.value = "Running";
  for (let i = 0; i < 5; i++) s.reporter.enqueue("r1");
  await s.clock.advance(199);
  assert.equal(s.sent.length, 1);
  await s.clock.advance(1);
  assert.equal(s.sent.length, 2);
  assert.equal(s.sent[1]!.at - t0, 200);
  s.reporter.enqueue("r1");
  await s.clock.advance(200);
  assert.equal(s.sent.length, 2, "nothing changed");
  await s.reporter.stop();
  assert.equal(s.clock.pending, 0);
});

test("a failed report is requeued with growing waits, not dropped until the next resync", async () => {
  const s = setup();
  s.records.set("r1", applied("r1"));
  s.failing.count = 3;
  s.reporter.start();
  await s.clock.advance(0);
  assert.equal(s.sent.length, 0);
  await s.clock.advance(500 + 1_000 + 2_000);
  assert.equal(s.sent.length, 1, "sent after three retries (0.5 s, 1 s, 2 s), long before the 15 s resync");
  assert.equal(s.sent[0]!.at - Date.parse("2026-12-01T12:00:00Z"), 3_500);
  await s.reporter.stop();
});

test("the resync prunes tombstones past their retention and reports only applied requests", async () => {
  const s = setup();
  const old = new Date(s.clock.now() - TOMBSTONE_RETENTION_MS - 1).toISOString();
  s.records.set("gone", { ...applied("gone", old), state: "terminated" });
  s.records.set("recent", { ...applied("recent"), state: "terminated" });
  s.records.set("live", applied("live"));
  s.reporter.start();
  await s.clock.advance(0);
  assert.deepEqual([...s.records.keys()].sort(), ["live", "recent"]);
  assert.deepEqual(
    s.sent.map((x) => x.id),
    ["live"],
  );
  await s.reporter.stop();
});
