import assert from "node:assert/strict";
import { test } from "node:test";
import { Gate, isAbortError } from "./gate.js";

function deferred(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

void test("one holder at a time, first come first served", async () => {
  const gate = new Gate();
  const order: string[] = [];
  const hold = deferred();
  const a = gate.run(async () => {
    order.push("a start");
    await hold.promise;
    order.push("a end");
  });
  const b = gate.run(() => {
    order.push("b");
  });
  const c = gate.run(() => {
    order.push("c");
  });
  await new Promise((r) => setImmediate(r));
  assert.deepEqual(order, ["a start"]);
  assert.equal(gate.waiting, 2);
  hold.resolve();
  await Promise.all([a, b, c]);
  assert.deepEqual(order, ["a start", "a end", "b", "c"]);
  assert.equal(gate.locked, false);
});

void test("a waiter cancelled while another holds the gate leaves without running", async () => {
  const gate = new Gate();
  const hold = deferred();
  let sideEffects = 0;
  const holder = gate.run(() => hold.promise);
  const ac = new AbortController();
  const waiter = gate.run(() => {
    sideEffects++;
  }, ac.signal);
  const after = gate.run(() => "after");
  await new Promise((r) => setImmediate(r));
  ac.abort();
  await assert.rejects(waiter, (err) => isAbortError(err));
  assert.equal(gate.waiting, 1, "the cancelled waiter left the queue");
  hold.resolve();
  await holder;
  assert.equal(await after, "after");
  assert.equal(sideEffects, 0);
  assert.equal(gate.locked, false);
});

void test("a waiter whose signal aborts as the gate is handed over still does not run", async () => {
  const gate = new Gate();
  const ac = new AbortController();
  let ran = false;
  const release = await gate.acquire();
  const waiter = gate.run(() => {
    ran = true;
  }, ac.signal);
  // Hand over and abort in the same turn: the grant is already resolved when the abort lands.
  release();
  ac.abort();
  await assert.rejects(waiter, (err) => isAbortError(err));
  assert.equal(ran, false);
  assert.equal(gate.locked, false, "the gate was released, not leaked");
});

void test("an already aborted signal is refused at once", async () => {
  const gate = new Gate();
  await assert.rejects(
    gate.run(() => 1, AbortSignal.abort()),
    (err) => isAbortError(err),
  );
  assert.equal(gate.locked, false);
});

void test("the holder's failure releases the gate; release is idempotent", async () => {
  const gate = new Gate();
  await assert.rejects(
    gate.run(() => {
      throw new Error("boom");
    }),
    /boom/,
  );
  assert.equal(gate.locked, false);
  const r1 = await gate.acquire();
  const next = gate.acquire();
  r1();
  r1();
  const r2 = await next;
  assert.equal(gate.locked, true);
  r2();
  assert.equal(gate.locked, false);
});
