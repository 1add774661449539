import assert from "node:assert/strict";
import { test } from "node:test";
import { loadNodeAgentConfig } from "./config.js";
import { Slots } from "./slots.js";

void test("slots bound concurrency and hand over in order", async () => {
  const slots = new Slots(2);
  const a = await slots.acquire();
  const b = await slots.acquire();
  assert.equal(slots.available, 0);
  const order: string[] = [];
  const c = slots.acquire().then((r) => (order.push("c"), r));
  const d = slots.acquire().then((r) => (order.push("d"), r));
  assert.equal(slots.waiting, 2);
  a();
  a(); // releasing twice gives back one slot only
  const rc = await c;
  assert.deepEqual(order, ["c"]);
  b();
  const rd = await d;
  assert.deepEqual(order, ["c", "d"]);
  rc();
  rd();
  assert.equal(slots.available, 2);
});

void test("a waiter that gives up leaves no trace and never takes a slot later", async () => {
  const slots = new Slots(1);
  const held = await slots.acquire();
  const ac = new AbortController();
  const waiting = slots.acquire(ac.signal);
  ac.abort("pod-deleted");
  await assert.rejects(waiting, (e) => e instanceof Error && e.cause === "pod-deleted");
  assert.equal(slots.waiting, 0);
  held();
  assert.equal(slots.available, 1, "the slot went back, not to the cancelled waiter");
  await assert.rejects(slots.acquire(ac.signal), (e) => e instanceof Error && e.cause === "pod-deleted");
});

void test("config: durations, defaults and clear errors", () => {
  const cfg = loadNodeAgentConfig(
    { node: "gpu-0", kubeletRoot: "/k", store: "/s", warmupMs: "1500ms", resyncMs: "2m" },
    {},
  );
  assert.equal(cfg.warmupMs, 1500);
  assert.equal(cfg.resyncMs, 120_000);
  assert.equal(cfg.concurrency, 2);
  assert.equal(cfg.port, 9464);
  assert.equal(cfg.durable, true);
  assert.equal(
    loadNodeAgentConfig({ kubeletRoot: "/k", store: "/s" }, { NODE_NAME: "from-env" }).node,
    "from-env",
  );
  assert.equal(
    loadNodeAgentConfig({ node: "n", kubeletRoot: "/k", store: "/s", warmupMs: "2" }, {}).warmupMs,
    2000,
  );
  assert.throws(
    () => loadNodeAgentConfig({ node: "n", kubeletRoot: "/k", store: "/s", warmupMs: "soon" }, {}),
    /--warmup \(WARMSTART_WARMUP\): not a duration/,
  );
  assert.throws(
    () => loadNodeAgentConfig({ node: "n", kubeletRoot: "relative", store: "/s" }, {}),
    /--kubelet-root \(WARMSTART_KUBELET_ROOT\): .*absolute/,
  );
  assert.throws(() => loadNodeAgentConfig({ kubeletRoot: "/k", store: "/s" }, {}), /--node/);
  assert.throws(
    () => loadNodeAgentConfig({ node: "n", kubeletRoot: "/k", store: "/s", storeClaim: "no-slash" }, {}),
    /--store-claim \(WARMSTART_STORE_CLAIM\): must be namespace\/name/,
  );
  assert.throws(
    () => loadNodeAgentConfig({ node: "n", kubeletRoot: "/k", store: "/s", concurrency: "0" }, {}),
    /--concurrency/,
  );
});
