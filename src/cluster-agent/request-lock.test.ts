import { test } from "node:test";
import assert from "node:assert/strict";
import { RequestLock } from "./request-lock.js";
import { deferred, settle } from "../../test/support/testing.js";

void test("operations on one request run one at a time, in arrival order; other requests do not wait", async () => {
  const waited: string[] = [];
  const lock = new RequestLock((id) => waited.push(id));
  const order: string[] = [];
  const first = deferred();
  const deploy = lock.run("r1", async () => {
    order.push("deploy:start");
    await first.promise;
    order.push("deploy:end");
  });
  const terminate = lock.run("r1", () => {
    order.push("terminate");
    return Promise.resolve();
  });
  const other = lock.run("r2", () => {
    order.push("other");
    return Promise.resolve();
  });
  await other;
  await settle();
  assert.deepEqual(order, ["deploy:start", "other"], "r1's termination waits; r2 does not");
  assert.deepEqual(waited, ["r1"]);
  first.resolve();
  await Promise.all([deploy, terminate]);
  assert.deepEqual(order, ["deploy:start", "other", "deploy:end", "terminate"]);
  assert.equal(lock.active, 0, "nothing kept once done");
});

void test("a failed operation releases the lock for the next", async () => {
  const lock = new RequestLock();
  await assert.rejects(
    lock.run("r1", () => Promise.reject(new Error("boom"))),
    /boom/,
  );
  assert.equal(await lock.run("r1", () => Promise.resolve(42)), 42);
  assert.equal(lock.active, 0);
});
