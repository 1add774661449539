import assert from "node:assert/strict";
import { test } from "node:test";
import { Backoff, backoffDelay } from "./backoff.js";

void test("starts at the initial wait, doubles, and stops at the cap", () => {
  const b = new Backoff({ initialMs: 1000, maxMs: 10_000 });
  assert.deepEqual(
    Array.from({ length: 7 }, () => b.next()),
    [1000, 2000, 4000, 8000, 10_000, 10_000, 10_000],
  );
  assert.equal(b.failures, 7);
});

void test("reset starts over from the initial wait", () => {
  const b = new Backoff({ initialMs: 500, maxMs: 60_000 });
  b.next();
  b.next();
  b.next();
  assert.equal(b.peek(), 4000);
  b.reset();
  assert.equal(b.next(), 500);
  assert.equal(b.next(), 1000);
});

void test("a cap below the initial wait never shortens a deliberately slow interval", () => {
  const b = new Backoff({ initialMs: 600_000, maxMs: 300_000 });
  assert.equal(b.next(), 600_000);
  assert.equal(b.next(), 600_000);
  b.reset();
  assert.equal(b.next(), 600_000);
});

void test("a long outage stays at the cap instead of overflowing", () => {
  assert.equal(backoffDelay(10_000, { initialMs: 5, maxMs: 30_000 }), 30_000);
  assert.equal(backoffDelay(0, { initialMs: 5, maxMs: 30_000, factor: 3 }), 5);
  assert.equal(backoffDelay(2, { initialMs: 5, maxMs: 30_000, factor: 3 }), 45);
});

void test("refuses nonsense settings", () => {
  assert.throws(() => new Backoff({ initialMs: 0, maxMs: 10 }), /positive/);
  assert.throws(() => new Backoff({ initialMs: 10, maxMs: 10, factor: 0.5 }), /factor/);
});
