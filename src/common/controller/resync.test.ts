import assert from "node:assert/strict";
import { test } from "node:test";
import { FakeClock } from "../../../test/support/testing.js";
import { resyncEvery } from "./resync.js";

test("resyncEvery enqueues each key the caches name once per period, and nothing once stopped", async () => {
  const clock = new FakeClock(0);
  const added: string[] = [];
  let keys = ["a", "b", "a"];
  const stop = resyncEvery({ clock, periodMs: 1_000, keys: () => keys, add: (k) => added.push(k) });
  await clock.advance(999);
  assert.deepEqual(added, [], "not before the first period ends");
  await clock.advance(1);
  assert.deepEqual(added, ["a", "b"]);
  keys = ["c"];
  await clock.advance(1_000);
  assert.deepEqual(added, ["a", "b", "c"], "the keys read when the period ends");
  stop();
  stop();
  await clock.advance(5_000);
  assert.deepEqual(added, ["a", "b", "c"]);
  assert.equal(clock.pending, 0, "no timer left behind");
});
