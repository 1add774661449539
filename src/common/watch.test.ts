import assert from "node:assert/strict";
import { test } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { ResilientWatch } from "./watch.js";
import { FakeClock, memoryLogger, settle } from "../../test/support/testing.js";

/**
 * Stands in for client-node's informer object (not for the API server): it fails the way the real
 * one does, by calling its error handlers and then staying stopped until start() is called again.
 */
class FlakyInformer {
  starts = 0;
  stops = 0;
  failFirst: number;
  private readonly handlers = new Map<string, ((arg?: unknown) => void)[]>();

  constructor(failFirst: number) {
    this.failFirst = failFirst;
  }

  on(verb: string, cb: (arg?: unknown) => void): void {
    this.handlers.set(verb, [...(this.handlers.get(verb) ?? []), cb]);
  }

  off(): void {}

  emit(verb: string, arg?: unknown): void {
    for (const cb of this.handlers.get(verb) ?? []) cb(arg);
  }

  start(): Promise<void> {
    this.starts++;
    if (this.starts <= this.failFirst) return Promise.reject(new Error("connect ECONNREFUSED"));
    this.emit("connect");
    return Promise.resolve();
  }

  stop(): Promise<void> {
    this.stops++;
    return Promise.resolve();
  }
}

void test("a watch that fails is restarted with capped backoff, and stop clears the pending restart", async () => {
  const clock = new FakeClock();
  const logs = memoryLogger();
  const inf = new FlakyInformer(4);
  let connects = 0;
  const changes: string[] = [];
  const w = new ResilientWatch<k8s.V1Node>({
    name: "nodes",
    clock,
    log: logs.log,
    informer: inf as unknown as k8s.Informer<k8s.V1Node>,
    onChange: (n, kind) => changes.push(`${kind} ${n.metadata?.name}`),
    onConnect: () => connects++,
    backoff: { initialMs: 500, maxMs: 2000 },
  });
  w.start();
  await settle();
  assert.equal(inf.starts, 1);
  const waits: number[] = [];
  for (let i = 0; i < 4; i++) {
    const [wait] = clock.deadlines;
    assert.ok(wait !== undefined);
    waits.push(wait);
    await clock.advance(wait);
  }
  assert.deepEqual(waits, [500, 1000, 2000, 2000]);
  assert.equal(inf.starts, 5);
  assert.equal(connects, 1, "connected on the fifth start");
  assert.ok(logs.warnings().every((e) => e.msg === "watch failed; restarting"));
  assert.equal(logs.errors().length, 0);

  inf.emit("add", { metadata: { name: "n1" } });
  inf.emit("delete", { metadata: { name: "n1" } });
  assert.deepEqual(changes, ["add n1", "delete n1"]);

  // A healthy watch that later errors (as the informer does mid-watch) starts over from 500 ms.
  await clock.advance(120_000);
  inf.emit("error", new Error("watch closed: 500"));
  assert.deepEqual(clock.deadlines, [500]);
  await w.stop();
  assert.equal(clock.pending, 0);
  assert.equal(inf.stops, 1);
  inf.emit("error", new Error("late"));
  assert.equal(clock.pending, 0, "nothing restarts after stop");
});
