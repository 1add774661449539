import assert from "node:assert/strict";
import { test } from "node:test";
import type { HeartbeatRequest } from "../control-plane/api.js";
import { Gate } from "../core/gate.js";
import { FakeClock, memoryLogger, settle } from "../../test/support/testing.js";
import { Heartbeat } from "./heartbeat.js";

function beating(gate: Gate, capacity: () => number): { hb: Heartbeat; sent: number[]; clock: FakeClock } {
  const clock = new FakeClock();
  const sent: number[] = [];
  const hb = new Heartbeat({
    clock,
    log: memoryLogger().log,
    intervalMs: () => 1000,
    snapshot: (): HeartbeatRequest => ({
      inventory: [{ gpuType: "A", count: capacity() }],
      ready: true,
      paused: false,
    }),
    send: (h) => {
      sent.push(h.inventory[0]!.count);
      return Promise.resolve("none");
    },
    onInstruction: () => Promise.resolve(),
    exclusive: (fn, signal) => gate.run(fn, signal),
  });
  return { hb, sent, clock };
}

void test("a beat waits for a registration in progress and reports the capacity it registered, not the one before", async () => {
  const gate = new Gate();
  let capacity = 4;
  const { hb, sent, clock } = beating(gate, () => capacity);
  // A registration of 8 GPUs holds the gate (request, answer, credentials installed).
  const release = await gate.acquire();
  hb.start();
  await clock.advance(0);
  assert.deepEqual(sent, [], "no beat while the registration runs");
  capacity = 8;
  release();
  await settle();
  assert.deepEqual(sent, [8], "the beat's snapshot is taken after it");
  await clock.advance(1000);
  assert.deepEqual(sent, [8, 8]);
  await hb.stop();
  assert.equal(clock.pending, 0);
});

void test("stopping while a beat waits for the gate sends nothing and leaves no timer", async () => {
  const gate = new Gate();
  const { hb, sent, clock } = beating(gate, () => 4);
  const release = await gate.acquire();
  hb.start();
  await clock.advance(0);
  await hb.stop();
  release();
  await settle();
  assert.deepEqual(sent, []);
  assert.equal(clock.pending, 0);
  assert.equal(gate.waiting, 0);
});
