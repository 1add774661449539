import { test } from "node:test";
import assert from "node:assert/strict";
import { TtlCache } from "./lookups.js";

test("a value is read once per TTL, concurrent readers share one read, a failed read keeps the last value", async () => {
  let now = 0;
  let reads = 0;
  let fail = false;
  const stale: string[] = [];
  const cache = new TtlCache<string>(
    5_000,
    (key) => {
      reads++;
      return fail ? Promise.reject(new Error("api down")) : Promise.resolve(`${key}@${now}`);
    },
    (key) => stale.push(key),
    () => now,
  );
  assert.deepEqual(await Promise.all([cache.get("a"), cache.get("a")]), ["a@0", "a@0"]);
  assert.equal(reads, 1);
  now = 4_999;
  assert.equal(await cache.get("a"), "a@0");
  assert.equal(reads, 1);
  now = 5_000;
  fail = true;
  assert.equal(await cache.get("a"), "a@0", "the last value read stands through an API blip");
  assert.deepEqual(stale, ["a"]);
  await assert.rejects(cache.get("b"), /api down/, "nothing known yet: the error is the caller's");
  fail = false;
  assert.equal(await cache.get("a"), "a@5000");
  cache.invalidate("a");
  now = 5_001;
  assert.equal(await cache.get("a"), "a@5001");
});
