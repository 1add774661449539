import assert from "node:assert/strict";
import { EventEmitter } from "node:events";
import { test } from "node:test";
import { createLogger } from "./log.js";
import { onShutdown, runClosers } from "./shutdown.js";

const log = createLogger("shutdown-test", "silent");

function harness(closers: Parameters<typeof onShutdown>[0]["closers"], deadlineMs = 1000) {
  const proc = new EventEmitter();
  const exits: number[] = [];
  let exited: (code: number) => void = () => undefined;
  const done = new Promise<number>((resolve) => (exited = resolve));
  const s = onShutdown({
    log,
    closers,
    deadlineMs,
    process: proc,
    exit: (code) => {
      exits.push(code);
      exited(code);
    },
  });
  return { proc, exits, done, s };
}

void test("SIGTERM closes everything in order, then exits 0", async () => {
  const order: string[] = [];
  const h = harness([
    { name: "a", close: () => Promise.resolve(void order.push("a")) },
    { name: "b", close: () => void order.push("b") },
  ]);
  h.proc.emit("SIGTERM", "SIGTERM");
  assert.equal(await h.done, 0);
  assert.deepEqual(order, ["a", "b"]);
  h.s.dispose();
});

void test("a failed close still runs the others and exits 1", async () => {
  const order: string[] = [];
  const h = harness([
    {
      name: "a",
      close: () => {
        throw new Error("boom");
      },
    },
    { name: "b", close: () => Promise.resolve(void order.push("b")) },
  ]);
  h.proc.emit("SIGINT", "SIGINT");
  assert.equal(await h.done, 1);
  assert.deepEqual(order, ["b"]);
  h.s.dispose();
});

void test("a second signal exits at once, without waiting for the closers", () => {
  let release: () => void = () => undefined;
  const h = harness([{ name: "slow", close: () => new Promise<void>((r) => (release = r)) }]);
  h.proc.emit("SIGTERM", "SIGTERM");
  h.proc.emit("SIGTERM", "SIGTERM");
  assert.deepEqual(h.exits, [1]);
  release();
  h.s.dispose();
});

void test("closers past the deadline end in exit 1", async () => {
  const code = await runClosers([{ name: "stuck", close: () => new Promise(() => undefined) }], log, 20);
  assert.equal(code, 1);
});

void test("begin starts the same shutdown a signal does, once, with the caller's code", async () => {
  let closed = 0;
  const h = harness([{ name: "a", close: () => void closed++ }]);
  const a = h.s.begin("fatal", 1);
  const b = h.s.begin("again");
  assert.equal(await a, 1);
  assert.equal(await b, 1);
  assert.equal(closed, 1);
  assert.deepEqual(h.exits, [1]);
  h.s.dispose();
});
