import assert from "node:assert/strict";
import { test } from "node:test";
import { Registry } from "prom-client";
import { FakeClock, deferred, memoryLogger, settle } from "../../../test/support/testing.js";
import { Controller, TerminalError, type ReconcileContext, type ReconcileResult } from "./controller.js";

function controller(
  reconcile: (key: string, ctx: ReconcileContext) => Promise<ReconcileResult>,
  extra: { synced?: (() => boolean)[]; workers?: number } = {},
): { c: Controller; clock: FakeClock; registry: Registry; logs: ReturnType<typeof memoryLogger> } {
  const clock = new FakeClock();
  const registry = new Registry();
  const logs = memoryLogger();
  const c = new Controller({ name: "test", reconcile, log: logs.log, clock, registry, ...extra });
  return { c, clock, registry, logs };
}

const metric = async (registry: Registry, name: string, labels: Record<string, string>): Promise<number> => {
  const values = (await registry.getMetricsAsJSON()).flatMap((m) =>
    m.values.map((v) => ({ ...v, name: (v as { metricName?: string }).metricName ?? m.name })),
  );
  const v = values.find(
    (x) => x.name === name && Object.entries(labels).every(([k, l]) => x.labels[k] === l),
  );
  return Number(v?.value ?? 0);
};

test("workers start only after every informer has listed", async () => {
  let listed = false;
  const seen: string[] = [];
  const { c, clock } = controller(
    (k) => {
      seen.push(k);
      return Promise.resolve();
    },
    { synced: [() => true, () => listed] },
  );
  c.add("a");
  const started = c.start();
  await clock.advance(500);
  assert.deepEqual(seen, [], "nothing reconciled before the list");
  assert.equal(c.started, false);
  listed = true;
  await clock.advance(50);
  await started;
  await c.idle();
  assert.deepEqual(seen, ["a"]);
  await c.stop();
  assert.equal(clock.pending, 0);
});

test("a failing reconcile is requeued with backoff, not retried in place; success forgets it", async () => {
  let failures = 2;
  const attempts: number[] = [];
  const { c, clock, registry, logs } = controller(() => {
    attempts.push(clock.now());
    if (failures-- > 0) return Promise.reject(new Error("api down", { cause: new Error("ECONNREFUSED") }));
    return Promise.resolve();
  });
  await c.start();
  const t0 = clock.now();
  c.add("k");
  await c.idle();
  assert.equal(attempts.length, 1);
  assert.deepEqual(clock.deadlines, [5], "first retry after 5 ms");
  await clock.advance(5);
  await c.idle();
  assert.deepEqual(clock.deadlines, [10], "then 10 ms");
  await clock.advance(10);
  await c.idle();
  assert.deepEqual(
    attempts.map((t) => t - t0),
    [0, 5, 15],
  );
  assert.equal(c.queue.retries("k"), 0, "forgotten on success");
  assert.equal(await metric(registry, "warmstart_controller_retries_total", { controller: "test" }), 2);
  const warn = logs.warnings().find((e) => e.msg === "reconcile failed; requeued");
  assert.ok(warn, "the failure is logged");
  const err = warn.err as { stack?: string };
  assert.match(String(err.stack), /^Error: api down\n\s+at /, "logged with its stack");
  assert.match(String(err.stack), /caused by: Error: ECONNREFUSED/, "and its cause");
  assert.ok(warn.reconcileId, "with the pass's reconcile id");
  await c.stop();
});

test("a terminal error is logged and not requeued", async () => {
  let calls = 0;
  const { c, clock, registry, logs } = controller(() => {
    calls++;
    return Promise.reject(new TerminalError("bad spec"));
  });
  await c.start();
  c.add("k");
  await c.idle();
  await clock.advance(3_600_000);
  assert.equal(calls, 1);
  assert.equal(clock.pending, 0);
  assert.ok(logs.errors().some((e) => e.msg.startsWith("reconcile failed for good")));
  assert.equal(
    await metric(registry, "warmstart_controller_reconcile_duration_seconds_count", {
      controller: "test",
      result: "terminal",
    }),
    1,
  );
  await c.stop();
});

test("requeueAfter brings the key back at that time, and an earlier add wins", async () => {
  const at: number[] = [];
  const { c, clock } = controller(() => {
    at.push(clock.now());
    return Promise.resolve({ requeueAfterMs: 60_000 });
  });
  await c.start();
  const t0 = clock.now();
  c.add("k");
  await c.idle();
  await clock.advance(10_000);
  c.addAfter("k", 1_000); // an event asking for a look sooner
  await clock.advance(1_000);
  await c.idle();
  assert.deepEqual(
    at.map((t) => t - t0),
    [0, 11_000],
  );
  assert.deepEqual(clock.deadlines, [60_000], "the next one is a minute after the last pass");
  await c.stop();
  assert.equal(clock.pending, 0);
});

test("one key is never reconciled twice at once; another key runs alongside", async () => {
  const gate = deferred();
  let inA = 0;
  let maxInA = 0;
  const order: string[] = [];
  const { c } = controller(
    async (k) => {
      order.push(k);
      if (k === "a") {
        inA++;
        maxInA = Math.max(maxInA, inA);
        await gate.promise;
        inA--;
      }
    },
    { workers: 3 },
  );
  await c.start();
  c.add("a");
  await settle();
  c.add("a");
  c.add("b");
  await settle();
  assert.deepEqual(order, ["a", "b"], "b runs while a is busy; the second a waits");
  gate.resolve();
  await c.idle();
  assert.deepEqual(order, ["a", "b", "a"], "a added while busy runs once more afterwards");
  assert.equal(maxInA, 1);
  await c.stop();
});

test("stop aborts the reconcile in progress through its signal and waits for it", async () => {
  let aborted = false;
  const { c, clock, logs } = controller(async (_k, { signal }) => {
    await new Promise<void>((_res, rej) =>
      signal.addEventListener("abort", () => {
        aborted = true;
        rej(new Error("aborted"));
      }),
    );
  });
  await c.start();
  c.add("k");
  await settle();
  await c.stop();
  assert.equal(aborted, true);
  assert.equal(clock.pending, 0, "no retry scheduled by a stop");
  assert.equal(logs.warnings().length, 0, "a stop is no failure");
  c.add("k");
  assert.equal(c.queue.depth, 0, "a stopped controller takes no keys");
});

test("metrics: adds, depth and durations by result", async () => {
  const { c, clock, registry } = controller(async (k) => {
    await clock.advance(0);
    if (k === "later") return { requeueAfterMs: 1_000 };
  });
  await c.start();
  c.add("a");
  c.add("later");
  await c.idle();
  assert.equal(await metric(registry, "warmstart_controller_adds_total", { controller: "test" }), 2);
  assert.equal(await metric(registry, "warmstart_controller_queue_depth", { controller: "test" }), 1);
  for (const result of ["success", "requeue_after"])
    assert.equal(
      await metric(registry, "warmstart_controller_reconcile_duration_seconds_count", {
        controller: "test",
        result,
      }),
      1,
      result,
    );
  await c.stop();
});
