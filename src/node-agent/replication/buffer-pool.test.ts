import assert from "node:assert/strict";
import { test } from "node:test";
import { BufferPool } from "./buffer-pool.js";

void test("a buffer handed back is the one the next take of its size class gets", () => {
  const pool = new BufferPool(1 << 20);
  const a = pool.take(200 * 1024);
  assert.equal(a.length, 256 * 1024, "sizes round up to a power of two");
  pool.give(a);
  assert.equal(pool.kept, 256 * 1024);
  assert.equal(pool.take(256 * 1024), a, "the same size class reuses it");
  assert.equal(pool.kept, 0);
  assert.notEqual(pool.take(256 * 1024), a, "taken once, it is not handed out twice");
  assert.equal(pool.take(1).length, 4096, "the smallest class");
});

void test("the pool keeps no more than its limit, and nothing it did not make", () => {
  const pool = new BufferPool(512 * 1024);
  const [a, b, c] = [pool.take(256 * 1024), pool.take(256 * 1024), pool.take(256 * 1024)];
  pool.give(a);
  pool.give(b);
  pool.give(c);
  assert.equal(pool.kept, 512 * 1024, "the third is left to the collector");
  pool.give(Buffer.alloc(300 * 1024));
  assert.equal(pool.kept, 512 * 1024, "a buffer of no size class is not kept");
});

void test("free buffers are let go once the pool has been idle for its idle time, not before", async () => {
  const pool = new BufferPool(1 << 20, 60);
  pool.give(pool.take(64 * 1024));
  await new Promise((r) => setTimeout(r, 30));
  const b = pool.take(64 * 1024); // in use again: the idle time starts over
  pool.give(b);
  await new Promise((r) => setTimeout(r, 40));
  assert.equal(pool.kept, 64 * 1024, "kept while in use");
  await new Promise((r) => setTimeout(r, 80));
  assert.equal(pool.kept, 0, "let go after the idle time");
  assert.notEqual(pool.take(64 * 1024), b, "a fresh buffer after that");
});
