import assert from "node:assert/strict";
import { test } from "node:test";
import { IdleWorkers } from "./idle-workers.js";

void test("a change wakes one idle worker, the end wakes them all, and one that timed out costs no wake", async () => {
  const idle = new IdleWorkers();
  const woken: string[] = [];
  const waitAs = (name: string, ms = 60_000): Promise<void> =>
    idle.wait(ms).then(() => void woken.push(name));
  const a = waitAs("a");
  const b = waitAs("b");
  const c = waitAs("c");
  idle.wake();
  await a;
  assert.deepEqual(woken, ["a"], "the longest waiting, and only it");
  assert.equal(idle.waiting, 2);
  // One that looked on its own (its time ran out) is no longer waiting: the next wake reaches b.
  const early = waitAs("early", 5);
  await early;
  assert.equal(idle.waiting, 2);
  idle.wake();
  await b;
  assert.deepEqual(woken, ["a", "early", "b"]);
  const d = waitAs("d");
  idle.wake(true);
  await Promise.all([c, d]);
  assert.deepEqual(woken, ["a", "early", "b", "c", "d"]);
  assert.equal(idle.waiting, 0);
  idle.wake(); // nobody waits: nothing happens
});
