import assert from "node:assert/strict";
import { test } from "node:test";
import { EMPTY_INVENTORY, summarize, type GpuInventory } from "./inventory.js";
import { GpuMonitor } from "./monitor.js";
import { deferred, FakeClock, memoryLogger, settle } from "../../test/support/testing.js";

const gpus = (count: number, gpuType = "H100"): GpuInventory =>
  count === 0 ? EMPTY_INVENTORY : summarize([{ node: "n1", gpuType, count }]);

function setup(debounceMs = 30_000, pollIntervalMs = 60_000) {
  const clock = new FakeClock();
  const logs = memoryLogger();
  let world: GpuInventory | Error = gpus(0);
  let lookups = 0;
  const changes: number[] = [];
  const monitor = new GpuMonitor({
    clock,
    log: logs.log,
    pollIntervalMs,
    debounceMs,
    coalesceMs: 100,
    lookup: () => {
      lookups++;
      return world instanceof Error ? Promise.reject(world) : Promise.resolve(world);
    },
    onChange: (inv) => changes.push(inv.total),
  });
  return {
    clock,
    logs,
    monitor,
    changes,
    lookups: () => lookups,
    set: (w: GpuInventory | Error) => {
      world = w;
    },
  };
}

void test("the first state counts at once; a change counts only after holding for the debounce time", async () => {
  const s = setup(30_000);
  s.monitor.start();
  await settle();
  assert.deepEqual(s.changes, [0]);

  s.set(gpus(4));
  s.monitor.trigger();
  await s.clock.advance(100);
  assert.equal(s.monitor.pendingChange?.total, 4);
  assert.equal(s.monitor.current?.total, 0);
  await s.clock.advance(29_800);
  assert.deepEqual(s.changes, [0], "not yet: the change has held 29.9 s");
  await s.clock.advance(200);
  assert.deepEqual(s.changes, [0, 4]);
  assert.equal(s.monitor.current?.total, 4);
  await s.monitor.stop();
});

void test("a change that reverts within the debounce time never counts", async () => {
  const s = setup(30_000);
  s.set(gpus(4));
  s.monitor.start();
  await settle();
  s.set(gpus(0));
  s.monitor.trigger();
  await s.clock.advance(10_000);
  s.set(gpus(4));
  s.monitor.trigger();
  await s.clock.advance(60_000);
  assert.deepEqual(s.changes, [4]);
  assert.equal(s.monitor.pendingChange, undefined);
  assert.ok(s.logs.entries.some((e) => e.msg === "GPU change did not hold; ignored"));
  await s.monitor.stop();
});

void test("a new different state restarts the hold time", async () => {
  const s = setup(30_000);
  s.monitor.start();
  await settle();
  s.set(gpus(4));
  s.monitor.trigger();
  await s.clock.advance(20_000);
  s.set(gpus(8));
  s.monitor.trigger();
  await s.clock.advance(20_000);
  assert.deepEqual(s.changes, [0], "8 has held only 20 s");
  await s.clock.advance(10_100);
  assert.deepEqual(s.changes, [0, 8]);
  await s.monitor.stop();
});

void test("a burst of node events is coalesced into one lookup", async () => {
  const s = setup(0);
  s.monitor.start();
  await settle();
  const before = s.lookups();
  for (let i = 0; i < 25; i++) {
    s.monitor.trigger();
    await s.clock.advance(3);
  }
  await s.clock.advance(200);
  assert.equal(s.lookups() - before, 1);
  await s.monitor.stop();
});

void test("events during a slow lookup lead to exactly one more lookup, never two at once", async () => {
  const clock = new FakeClock();
  const slow = deferred<GpuInventory>();
  let inFlight = 0;
  let maxInFlight = 0;
  let calls = 0;
  const monitor = new GpuMonitor({
    clock,
    log: memoryLogger().log,
    pollIntervalMs: 60_000,
    debounceMs: 0,
    coalesceMs: 10,
    lookup: async () => {
      calls++;
      inFlight++;
      maxInFlight = Math.max(maxInFlight, inFlight);
      try {
        return calls === 1 ? await slow.promise : gpus(2);
      } finally {
        inFlight--;
      }
    },
    onChange: () => undefined,
  });
  monitor.start();
  for (let i = 0; i < 5; i++) {
    monitor.trigger();
    await clock.advance(20);
  }
  assert.equal(calls, 1);
  slow.resolve(gpus(1));
  await settle();
  assert.equal(calls, 2);
  assert.equal(maxInFlight, 1);
  assert.equal(monitor.current?.total, 2);
  await monitor.stop();
});

void test("a failed lookup keeps the last known state and warns", async () => {
  const s = setup(0);
  s.set(gpus(4));
  s.monitor.start();
  await settle();
  s.set(new Error("apiserver unreachable"));
  await s.clock.advance(60_000);
  assert.equal(s.monitor.current?.total, 4);
  assert.deepEqual(s.changes, [4]);
  const w = s.logs.warnings().find((e) => e.msg === "GPU lookup failed; keeping the last known state");
  assert.ok(w, "a warning, not an error");
  assert.equal(s.logs.errors().length, 0);
  s.set(gpus(0));
  await s.clock.advance(60_000);
  assert.deepEqual(s.changes, [4, 0], "the poll picks up again once lookups work");
  await s.monitor.stop();
});

void test("the poll runs every interval and stop leaves no timer behind", async () => {
  const s = setup(30_000, 5_000);
  s.monitor.start();
  await settle();
  await s.clock.advance(20_000);
  assert.equal(s.lookups(), 5);
  s.set(gpus(4));
  s.monitor.trigger();
  await s.clock.advance(100);
  assert.ok(s.clock.pending >= 2, "poll and debounce are armed");
  await s.monitor.stop();
  assert.equal(s.clock.pending, 0);
  s.monitor.trigger();
  assert.equal(s.clock.pending, 0, "a stopped monitor arms nothing");
});
