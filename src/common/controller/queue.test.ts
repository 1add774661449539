import assert from "node:assert/strict";
import { test } from "node:test";
import { FakeClock } from "../../../test/support/testing.js";
import { WorkQueue } from "./queue.js";

const queue = (clock = new FakeClock()): { q: WorkQueue; clock: FakeClock; depths: number[] } => {
  const depths: number[] = [];
  return { q: new WorkQueue({ clock, onDepth: (d) => depths.push(d) }), clock, depths };
};

test("a key added many times is handed out once", async () => {
  const { q } = queue();
  q.add("a");
  q.add("a");
  q.add("b");
  assert.equal(q.depth, 2);
  assert.equal(await q.get(), "a");
  assert.equal(await q.get(), "b");
  assert.equal(q.depth, 0);
});

test("a key being worked on is never handed out twice; added meanwhile, it comes back once done", async () => {
  const { q } = queue();
  q.add("a");
  assert.equal(await q.get(), "a");
  q.add("a");
  q.add("a");
  let second: string | undefined;
  void q.get().then((k) => (second = k));
  await new Promise((r) => setImmediate(r));
  assert.equal(second, undefined, "not handed out while active");
  q.done("a");
  await new Promise((r) => setImmediate(r));
  assert.equal(second, "a");
  q.done("a");
  assert.ok(q.idle);
});

test("a delayed add keeps the earlier of two due times", async () => {
  const { q, clock } = queue();
  q.addAfter("a", 10_000);
  q.addAfter("a", 3_000);
  q.addAfter("a", 7_000);
  assert.equal(q.dueAt("a"), clock.now() + 3_000);
  assert.equal(clock.pending, 1, "one timer per key");
  await clock.advance(2_999);
  assert.equal(q.depth, 1);
  assert.ok(q.idle, "not ready yet");
  await clock.advance(1);
  assert.equal(await q.get(), "a");
  assert.equal(clock.pending, 0);
});

test("add makes a delayed key ready now; addAfter on a ready key changes nothing", async () => {
  const { q, clock } = queue();
  q.addAfter("a", 60_000);
  q.add("a");
  assert.equal(clock.pending, 0, "the delay's timer is cancelled");
  q.addAfter("a", 5);
  assert.equal(clock.pending, 0);
  assert.equal(await q.get(), "a");
  q.done("a");
  assert.equal(q.depth, 0);
});

test("failures back off per key, doubling to the cap; forget starts over", () => {
  const clock = new FakeClock();
  const q = new WorkQueue({ clock, backoffInitialMs: 5, backoffMaxMs: 40 });
  assert.deepEqual(
    [1, 2, 3, 4, 5].map(() => {
      const w = q.addRateLimited("a");
      return w;
    }),
    [5, 10, 20, 40, 40],
  );
  assert.equal(q.retries("a"), 5);
  assert.equal(q.addRateLimited("b"), 5, "another key has its own backoff");
  q.forget("a");
  assert.equal(q.retries("a"), 0);
  assert.equal(q.addRateLimited("a"), 5);
});

test("shutdown wakes waiting workers with nothing and drops the timers", async () => {
  const { q, clock } = queue();
  q.addAfter("x", 1_000);
  const waiting = q.get();
  q.shutdown();
  assert.equal(await waiting, undefined);
  assert.equal(clock.pending, 0);
  q.add("y");
  assert.equal(await q.get(), undefined);
});

test("depth counts ready and delayed keys", async () => {
  const { q, depths } = queue();
  q.add("a");
  q.addAfter("b", 100);
  assert.equal(q.depth, 2);
  await q.get();
  assert.equal(q.depth, 1);
  assert.equal(depths.at(-1), 1);
});
