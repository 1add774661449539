import { test } from "node:test";
import assert from "node:assert/strict";
import { registerAgent, sleep, startHarness } from "../../test/support/control-plane.js";
import { ControlPlaneClient } from "./client.js";

void test("requests are queued only for GPU types a cluster registered; Pending until one does", async (t) => {
  const h = await startHarness(t);
  const a = await registerAgent(h.cp.url, "alpha", [{ gpuType: "H100", count: 8 }]);
  const { id, status } = await h.operator.submit({
    name: "on-a100",
    model: "m",
    image: "i",
    gpuType: "A100",
  });
  assert.equal(status, "Pending");
  assert.match((await h.operator.getRequest(id)).message ?? "", /of type A100/);
  assert.deepEqual((await a.client.receive("alpha", { queue: "deploy", maxMessages: 10 })).messages, []);
  assert.equal((await h.operator.listClusters())[0]?.queueDepth.deploy, 0);

  const b = await registerAgent(h.cp.url, "beta", [{ gpuType: "A100", count: 2 }]);
  const queued = await h.operator.getRequest(id);
  assert.equal(queued.status, "Queued", "queued as soon as a cluster with that type registers");
  assert.equal(queued.clusterId, "beta");
  assert.equal(queued.assignedGpuType, "A100");
  const [msg] = (await b.client.receive("beta", { queue: "deploy" })).messages;
  assert.equal(msg?.body.kind, "deploy");
  assert.equal(msg?.body.kind === "deploy" ? msg.body.gpuType : undefined, "A100");
  assert.deepEqual((await a.client.receive("alpha", { queue: "deploy" })).messages, []);

  // No GPU type given: any type, on the cluster with the most free GPUs.
  const any = await h.operator.submit({ name: "anywhere", model: "m", image: "i", gpus: 2 });
  const placed = await h.operator.getRequest(any.id);
  assert.equal(placed.clusterId, "alpha");
  assert.equal(placed.assignedGpuType, "H100");
});

void test("capacity: a request that does not fit waits, and is queued when GPUs free up", async (t) => {
  const h = await startHarness(t);
  const a = await registerAgent(h.cp.url, "alpha", [{ gpuType: "H100", count: 4 }]);
  const first = await h.operator.submit({ name: "big", model: "m", image: "i", gpus: 2, replicas: 2 });
  assert.equal(first.status, "Queued");
  const second = await h.operator.submit({ name: "next", model: "m", image: "i", gpus: 1 });
  assert.equal(second.status, "Pending", "all 4 GPUs are held by the first request");
  assert.equal((await h.operator.listClusters())[0]?.allocated, 4);

  const [msg] = (await a.client.receive("alpha", { queue: "deploy" })).messages;
  assert.ok(msg);
  await a.client.ack("alpha", [msg.receiptHandle]);
  await h.operator.terminate(first.id);
  const [term] = (await a.client.receive("alpha", { queue: "termination" })).messages;
  assert.ok(term);
  await a.client.ack("alpha", [term.receiptHandle]);
  assert.equal(
    (await h.operator.getRequest(second.id)).status,
    "Pending",
    "still held until the agent reports",
  );
  await a.client.reportStatus(first.id, { phase: "Terminated", instances: [] });
  assert.equal((await h.operator.getRequest(second.id)).status, "Queued");

  // Growing the inventory (re-registration) places what waits.
  const third = await h.operator.submit({ name: "third", model: "m", image: "i", gpus: 8 });
  assert.equal(third.status, "Pending");
  await a.client.register({ clusterId: "alpha", inventory: [{ gpuType: "H100", count: 16 }] });
  assert.equal((await h.operator.getRequest(third.id)).status, "Queued");
});

void test("an inventory that loses a GPU type takes back that type's undelivered requests", async (t) => {
  const h = await startHarness(t);
  const a = await registerAgent(h.cp.url, "alpha", [
    { gpuType: "H100", count: 4 },
    { gpuType: "L40S", count: 4 },
  ]);
  const { id } = await h.operator.submit({ name: "l40s", model: "m", image: "i", gpuType: "L40S" });
  assert.equal((await h.operator.getRequest(id)).status, "Queued");
  const hb = { inventory: [{ gpuType: "H100", count: 4 }], ready: true, paused: false };
  await a.client.heartbeat("alpha", hb);
  const back = await h.operator.getRequest(id);
  assert.equal(back.status, "Pending");
  assert.equal(back.clusterId, null);
  assert.deepEqual((await a.client.receive("alpha", { queue: "deploy", maxMessages: 10 })).messages, []);
});

void test("receive: batches, visibility timeout, redelivery with a new receipt, ack, stale ack, release", async (t) => {
  const h = await startHarness(t);
  const a = await registerAgent(h.cp.url, "alpha", [{ gpuType: "H100", count: 8 }]);
  const ids = [];
  for (const name of ["r1", "r2", "r3"])
    ids.push((await h.operator.submit({ name, model: "m", image: "i" })).id);

  const batch = await a.client.receive("alpha", {
    queue: "deploy",
    maxMessages: 2,
    visibilityTimeoutSeconds: 1,
  });
  assert.deepEqual(
    batch.messages.map((m) => m.body.requestId),
    ids.slice(0, 2),
    "oldest first, at most maxMessages",
  );
  assert.deepEqual(
    batch.messages.map((m) => m.receiveCount),
    [1, 1],
  );
  const rest = await a.client.receive("alpha", {
    queue: "deploy",
    maxMessages: 10,
    visibilityTimeoutSeconds: 30,
  });
  assert.deepEqual(
    rest.messages.map((m) => m.body.requestId),
    [ids[2]],
    "received messages are invisible",
  );
  const [m1, m2] = batch.messages;
  assert.ok(m1 && m2);

  const acked = await a.client.ack("alpha", [m1.receiptHandle]);
  assert.deepEqual(acked, { acknowledged: [m1.receiptHandle], failed: [] });

  await sleep(1100);
  const again = await a.client.receive("alpha", {
    queue: "deploy",
    maxMessages: 10,
    visibilityTimeoutSeconds: 30,
  });
  assert.equal(again.messages.length, 1, "only the unacknowledged message comes back");
  const redelivered = again.messages[0];
  assert.ok(redelivered);
  assert.equal(redelivered.messageId, m2.messageId);
  assert.equal(redelivered.receiveCount, 2);
  assert.notEqual(redelivered.receiptHandle, m2.receiptHandle);

  // The old receipt is stale: reported per handle, alongside a good one, not a 500.
  const mixed = await a.client.ack("alpha", [m2.receiptHandle, redelivered.receiptHandle, m1.receiptHandle]);
  assert.deepEqual(mixed.acknowledged, [redelivered.receiptHandle]);
  assert.deepEqual(
    mixed.failed.map((f) => f.receiptHandle),
    [m2.receiptHandle, m1.receiptHandle],
  );
  assert.match(mixed.failed[0]?.reason ?? "", /stale/);

  // Release makes the third visible at once, ahead of its 30 s timeout.
  const third = rest.messages[0];
  assert.ok(third);
  assert.deepEqual(await a.client.release("alpha", third.receiptHandle), { released: true });
  const now = await a.client.receive("alpha", { queue: "deploy" });
  assert.equal(now.messages[0]?.messageId, third.messageId);
  assert.equal(now.messages[0]?.receiveCount, 2);
  const stale = await a.client.release("alpha", third.receiptHandle);
  assert.equal(stale.released, false);
  assert.match(stale.reason ?? "", /stale/);

  // Another cluster cannot acknowledge this cluster's messages, even with a current receipt.
  const b = await registerAgent(h.cp.url, "beta", [{ gpuType: "H100", count: 1 }]);
  const foreign = await b.client.ack("beta", [now.messages[0]?.receiptHandle ?? ""]);
  assert.equal(foreign.failed.length, 1);
  assert.equal((await h.operator.listClusters()).find((c) => c.clusterId === "alpha")?.queueDepth.deploy, 1);
});

void test("gpuTypes on receive: only the types the agent asks for", async (t) => {
  const h = await startHarness(t);
  const a = await registerAgent(h.cp.url, "alpha", [
    { gpuType: "H100", count: 4 },
    { gpuType: "L40S", count: 4 },
  ]);
  await h.operator.submit({ name: "h", model: "m", image: "i", gpuType: "H100" });
  await h.operator.submit({ name: "l", model: "m", image: "i", gpuType: "L40S" });
  const got = await a.client.receive("alpha", { queue: "deploy", gpuTypes: ["L40S"], maxMessages: 10 });
  assert.deepEqual(
    got.messages.map((m) => (m.body.kind === "deploy" ? m.body.gpuType : "")),
    ["L40S"],
  );
  assert.deepEqual(
    (await a.client.receive("alpha", { queue: "deploy", gpuTypes: [], maxMessages: 10 })).messages,
    [],
  );
});

void test("long poll returns as soon as a message is enqueued, or when a delivery times out", async (t) => {
  const h = await startHarness(t);
  const a = await registerAgent(h.cp.url, "alpha", [{ gpuType: "H100", count: 8 }]);

  const started = Date.now();
  const waiting = a.client.receive("alpha", { queue: "deploy", waitSeconds: 15, maxMessages: 10 });
  await sleep(200);
  const { id } = await h.operator.submit({ name: "wake", model: "m", image: "i" });
  const got = await waiting;
  const took = Date.now() - started;
  assert.equal(got.messages[0]?.body.requestId, id);
  assert.ok(took < 2000, `long poll woke promptly (${took} ms)`);

  // Nothing arrives: it answers empty at the deadline.
  const t0 = Date.now();
  assert.deepEqual((await a.client.receive("alpha", { queue: "termination", waitSeconds: 1 })).messages, []);
  const waited = Date.now() - t0;
  assert.ok(waited >= 900 && waited < 3000, `waited about 1 s (${waited} ms)`);

  // A delivery that is not acknowledged wakes a waiting poll when it becomes visible again.
  const m = got.messages[0];
  assert.ok(m);
  await a.client.release("alpha", m.receiptHandle, { delaySeconds: 1 });
  const t1 = Date.now();
  const redelivered = await a.client.receive("alpha", { queue: "deploy", waitSeconds: 10 });
  assert.equal(redelivered.messages[0]?.messageId, m.messageId);
  assert.ok(Date.now() - t1 < 3000);

  // The caller's AbortSignal ends a long poll, and the server carries on.
  const ac = new AbortController();
  const aborted = a.client.receive("alpha", { queue: "termination", waitSeconds: 20 }, { signal: ac.signal });
  setTimeout(() => ac.abort(new Error("agent stopping")), 100);
  await assert.rejects(aborted, /agent stopping/);
  assert.equal((await fetch(`${h.cp.url}/healthz`)).status, 200);
});

void test("termination queue: deleting a request queues a termination to the cluster that has it", async (t) => {
  const h = await startHarness(t);
  const a = await registerAgent(h.cp.url, "alpha", [{ gpuType: "H100", count: 8 }]);
  const { id } = await h.operator.submit({ name: "llama", namespace: "serving", model: "m", image: "i" });
  const [deploy] = (await a.client.receive("alpha", { queue: "deploy" })).messages;
  assert.ok(deploy);
  await a.client.ack("alpha", [deploy.receiptHandle]);
  await a.client.reportStatus(id, {
    phase: "Running",
    instances: [{ name: "llama-0", phase: "Running", ready: true }],
  });

  // Termination is served to a long poll waiting on the termination queue.
  const waiting = a.client.receive("alpha", { queue: "termination", waitSeconds: 10 });
  await sleep(100);
  const res = await h.operator.terminate(id);
  assert.deepEqual(res, { id, status: "Terminating" });
  const [term] = (await waiting).messages;
  assert.deepEqual(term && { ...term.body, requestedAt: "x" }, {
    kind: "terminate",
    requestId: id,
    name: "llama",
    namespace: "serving",
    requestedAt: "x",
  });
  assert.deepEqual(await h.operator.terminate(id), { id, status: "Terminating" }, "idempotent");
  assert.equal(
    (await h.operator.listClusters())[0]?.queueDepth.termination,
    1,
    "no second termination message",
  );

  // A late Running report does not undo the termination; Terminated ends it.
  await a.client.reportStatus(id, { phase: "Running", instances: [] });
  assert.equal((await h.operator.getRequest(id)).status, "Terminating");
  await a.client.ack("alpha", [term?.receiptHandle ?? ""]);
  await a.client.reportStatus(id, { phase: "Terminated", instances: [] });
  assert.equal((await h.operator.getRequest(id)).status, "Terminated");
  assert.equal((await h.operator.listClusters())[0]?.allocated, 0);

  // A request no cluster received yet is terminated at once, with nothing queued.
  const early = await h.operator.submit({ name: "early", model: "m", image: "i" });
  assert.deepEqual(await h.operator.terminate(early.id), { id: early.id, status: "Terminated" });
  const pending = await h.operator.submit({ name: "never", model: "m", image: "i", gpuType: "B200" });
  assert.deepEqual(await h.operator.terminate(pending.id), { id: pending.id, status: "Terminated" });
  assert.deepEqual((await a.client.receive("alpha", { queue: "deploy", maxMessages: 10 })).messages, []);
  assert.deepEqual((await a.client.receive("alpha", { queue: "termination", maxMessages: 10 })).messages, []);

  // The name is free again once its request is Terminated.
  assert.equal(
    (await h.operator.submit({ name: "llama", namespace: "serving", model: "m", image: "i" })).status,
    "Queued",
  );
});

void test("restart: clusters, credentials, queued and unacknowledged messages survive", async (t) => {
  const h = await startHarness(t, { credentialTtlSeconds: 600 });
  const a = await registerAgent(h.cp.url, "alpha", [{ gpuType: "H100", count: 8 }]);
  const r1 = await h.operator.submit({ name: "first", model: "m", image: "i" });
  const r2 = await h.operator.submit({ name: "second", model: "m", image: "i" });
  const pending = await h.operator.submit({ name: "later", model: "m", image: "i", gpuType: "A100" });
  const [inflight] = (await a.client.receive("alpha", { queue: "deploy", visibilityTimeoutSeconds: 2 }))
    .messages;
  assert.equal(inflight?.body.requestId, r1.id);
  await h.cp.close();

  const cp2 = await h.restart();
  const agent = new ControlPlaneClient({ baseUrl: cp2.url, token: a.credential });
  const operator = new ControlPlaneClient({
    baseUrl: cp2.url,
    token: (await import("../../test/support/control-plane.js")).OPERATOR_TOKEN,
  });

  // The credential issued before the restart still works; the cluster is still registered.
  assert.deepEqual(
    await agent.heartbeat("alpha", {
      inventory: [{ gpuType: "H100", count: 8 }],
      ready: true,
      paused: false,
    }),
    { instruction: "none" },
  );
  const clusters = await operator.listClusters();
  assert.deepEqual(
    clusters.map((c) => [c.clusterId, c.capacity, c.queueDepth.deploy]),
    [["alpha", 8, 2]],
  );

  // The queued message is there at once; the unacknowledged one comes back after its timeout.
  const first = await agent.receive("alpha", { queue: "deploy", maxMessages: 10 });
  assert.deepEqual(
    first.messages.map((m) => [m.body.requestId, m.receiveCount]),
    [[r2.id, 1]],
  );
  const second = await agent.receive("alpha", { queue: "deploy", maxMessages: 10, waitSeconds: 10 });
  assert.deepEqual(
    second.messages.map((m) => [m.messageId, m.receiveCount]),
    [[inflight?.messageId, 2]],
  );
  const acked = await agent.ack(
    "alpha",
    [...first.messages, ...second.messages].map((m) => m.receiptHandle),
  );
  assert.equal(acked.acknowledged.length, 2);

  // Requests and their statuses survive, and Pending ones are still placed when a type arrives.
  const statuses = Object.fromEntries((await operator.listRequests()).map((r) => [r.name, r.status]));
  assert.deepEqual(statuses, { first: "Accepted", second: "Accepted", later: "Pending" });
  const b = await registerAgent(cp2.url, "beta", [{ gpuType: "A100", count: 1 }]);
  assert.equal((await operator.getRequest(pending.id)).clusterId, "beta");
  assert.equal((await b.client.receive("beta", { queue: "deploy" })).messages[0]?.body.requestId, pending.id);
});

void test("close() ends waiting long polls promptly with an empty answer", async (t) => {
  const h = await startHarness(t);
  const a = await registerAgent(h.cp.url, "alpha", [{ gpuType: "H100", count: 1 }]);
  const waiting = a.client.receive("alpha", { queue: "deploy", waitSeconds: 20 });
  await sleep(100);
  const t0 = Date.now();
  await h.cp.close();
  assert.deepEqual((await waiting).messages, []);
  assert.ok(Date.now() - t0 < 2000, "shutdown did not wait for the long poll's deadline");
});
