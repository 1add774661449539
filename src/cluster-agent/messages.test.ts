import assert from "node:assert/strict";
import { test } from "node:test";
import type {
  DeploymentRequest,
  QueueMessage,
  StatusReport,
  TerminationRequest,
} from "../control-plane/api.js";
import { memoryLogger } from "../../test/support/testing.js";
import { InstructionHandler } from "./instructions.js";
import type { GpuInventory } from "./inventory.js";
import { MessageHandler } from "./messages.js";
import { createMetrics } from "./metrics.js";
import { RequestLock } from "./request-lock.js";
import { OwnershipError, type RequestRecord } from "./workloads.js";

const H100x8: GpuInventory = {
  total: 8,
  byType: [{ gpuType: "H100", count: 8 }],
  nodes: [{ node: "n1", gpuType: "H100", count: 8 }],
};

const deployBody = (over: Partial<DeploymentRequest> = {}): DeploymentRequest => ({
  kind: "deploy",
  requestId: "r1",
  name: "llama",
  namespace: "serving",
  model: "m",
  image: "i",
  args: ["--model", "m"],
  gpus: 1,
  gpuType: "H100",
  replicas: 1,
  submittedAt: "2026-01-01T00:00:00.000Z",
  ...over,
});

const terminateBody = (over: Partial<TerminationRequest> = {}): TerminationRequest => ({
  kind: "terminate",
  requestId: "r1",
  name: "llama",
  namespace: "serving",
  requestedAt: "2026-01-01T00:00:00.000Z",
  ...over,
});

let deliveries = 0;
const message = (body: QueueMessage["body"], messageId = "m1"): QueueMessage => ({
  messageId,
  receiptHandle: `receipt-${++deliveries}`,
  receiveCount: 1,
  body,
});

/** A cluster side held in memory: records, applied workloads, reports and queue calls. */
function world(opts: { taking?: boolean; inventory?: GpuInventory | undefined; namespaces?: string[] } = {}) {
  const records = new Map<string, RequestRecord>();
  const applied = new Set<string>();
  const calls: string[] = [];
  const reports: { requestId: string; report: StatusReport }[] = [];
  const outcomes: string[] = [];
  const namespaces = opts.namespaces ?? ["serving"];
  const fail: { apply?: Error; ack?: Error; read?: Error } = {};
  const logs = memoryLogger();
  const workloads = {
    targetNamespace: (req: { namespace: string }): string => req.namespace,
    allows: (ns: string): boolean => namespaces.includes(ns),
    refusal: (req: { namespace: string }): string | undefined =>
      namespaces.includes(req.namespace) ? undefined : `namespace ${req.namespace} is not allowed`,
    readRecord: (id: string): Promise<RequestRecord | undefined> =>
      fail.read ? Promise.reject(fail.read) : Promise.resolve(records.get(id)),
    listRecords: (): Promise<RequestRecord[]> => Promise.resolve([...records.values()]),
    writeRecord: (rec: RequestRecord): Promise<void> => {
      records.set(rec.requestId, rec);
      return Promise.resolve();
    },
    apply: (req: DeploymentRequest): Promise<void> => {
      if (fail.apply) return Promise.reject(fail.apply);
      applied.add(req.requestId);
      return Promise.resolve();
    },
    remove: (requestId: string): Promise<void> => {
      calls.push(`remove ${requestId}`);
      applied.delete(requestId);
      return Promise.resolve();
    },
  };
  const status = {
    reportNow: (requestId: string, report: StatusReport): Promise<void> => {
      reports.push({ requestId, report });
      return Promise.resolve();
    },
    enqueue: (requestId: string): void => void calls.push(`enqueue ${requestId}`),
    forget: (requestId: string): void => void calls.push(`forget ${requestId}`),
  };
  const requestLock = new RequestLock();
  const handler = new MessageHandler({
    log: logs.log,
    workloads,
    status,
    requestLock,
    metrics: createMetrics(),
    takingDeployments: () => opts.taking ?? true,
    inventory: () => ("inventory" in opts ? opts.inventory : H100x8),
    controlPlane: {
      ack: (handle) => {
        calls.push(`ack ${handle}`);
        return fail.ack ? Promise.reject(fail.ack) : Promise.resolve({ acknowledged: [handle], failed: [] });
      },
      release: (handle, delaySeconds) => {
        calls.push(`release ${handle} ${delaySeconds}`);
        return Promise.resolve();
      },
    },
    hooks: { handled: (_q, _m, outcome) => void outcomes.push(outcome) },
  });
  const instructions = new InstructionHandler({
    log: logs.log,
    workloads,
    status,
    requestLock,
    cordon: (on) => void calls.push(`cordon ${on}`),
  });
  return { handler, instructions, records, applied, calls, reports, outcomes, fail, logs };
}

void test("a deployment request is recorded, applied, acknowledged and reported Accepted", async () => {
  const w = world();
  const msg = message(deployBody());
  await w.handler.handle("deploy", msg);
  assert.deepEqual(w.outcomes, ["accepted"]);
  assert.ok(w.applied.has("r1"));
  assert.equal(w.records.get("r1")?.state, "applied");
  assert.equal(w.records.get("r1")?.messageId, "m1");
  assert.deepEqual(w.calls, [`ack ${msg.receiptHandle}`, "enqueue r1"]);
  assert.deepEqual(w.reports, [
    { requestId: "r1", report: { phase: "Accepted", message: "Deployment serving/llama", instances: [] } },
  ]);
});

void test("a redelivery is acknowledged without deploying again: in memory, and from the durable record", async () => {
  const w = world();
  await w.handler.handle("deploy", message(deployBody()));
  w.applied.clear();
  const again = message(deployBody());
  await w.handler.handle("deploy", again);
  assert.deepEqual(w.outcomes, ["accepted", "duplicate"]);
  assert.equal(w.applied.size, 0, "not applied a second time");
  assert.equal(w.calls.at(-1), `ack ${again.receiptHandle}`);

  // Another run of the agent: nothing in memory, an applied (or terminated) record on the cluster.
  const later = world();
  later.records.set("r1", { ...w.records.get("r1")!, state: "terminated" });
  await later.handler.handle("deploy", message(deployBody(), "m-other"));
  assert.deepEqual(later.outcomes, ["duplicate"]);
  assert.equal(later.applied.size, 0);
  assert.equal(later.records.get("r1")?.state, "terminated", "the tombstone stays");
});

void test("a record left 'accepted' by an earlier delivery is applied, not skipped", async () => {
  const w = world();
  w.records.set("r1", {
    requestId: "r1",
    messageId: "m1",
    name: "llama",
    namespace: "serving",
    state: "accepted",
    updatedAt: "2026-01-01T00:00:00.000Z",
  });
  await w.handler.handle("deploy", message(deployBody()));
  assert.deepEqual(w.outcomes, ["accepted"]);
  assert.ok(w.applied.has("r1"));
});

void test("while not taking deployments a request is released at once; without room, released for 10 s", async () => {
  const paused = world({ taking: false });
  const a = message(deployBody());
  await paused.handler.handle("deploy", a);
  assert.deepEqual(paused.outcomes, ["released"]);
  assert.deepEqual(paused.calls, [`release ${a.receiptHandle} 0`]);

  const full = world();
  const big = message(deployBody({ gpus: 4, replicas: 3 }));
  await full.handler.handle("deploy", big);
  assert.deepEqual(full.outcomes, ["skipped"]);
  assert.deepEqual(full.calls, [`release ${big.receiptHandle} 10`]);
  assert.equal(full.records.size, 0, "nothing recorded for a request this cluster cannot hold");

  const unknown = world({ inventory: undefined });
  await unknown.handler.handle("deploy", message(deployBody()));
  assert.deepEqual(unknown.outcomes, ["skipped"], "no inventory yet: no room");
});

void test("a request outside the agent's namespaces is refused: reported Failed, acknowledged, never recorded", async () => {
  const w = world({ namespaces: ["serving"] });
  const msg = message(deployBody({ namespace: "kube-system" }));
  await w.handler.handle("deploy", msg);
  assert.deepEqual(w.outcomes, ["refused"]);
  assert.equal(w.records.size, 0);
  assert.equal(w.applied.size, 0);
  assert.equal(w.reports[0]?.report.phase, "Failed");
  assert.match(w.reports[0]?.report.message ?? "", /kube-system is not allowed/);
  assert.deepEqual(w.calls, [`ack ${msg.receiptHandle}`]);
  // A redelivery of the same message is acknowledged from memory.
  await w.handler.handle("deploy", message(deployBody({ namespace: "kube-system" })));
  assert.deepEqual(w.outcomes, ["refused", "duplicate"]);
});

void test("a terminal apply error records the request failed and reports it; a passing one releases for a retry", async () => {
  const w = world();
  w.fail.apply = new OwnershipError("a Deployment llama exists that this agent did not create");
  const msg = message(deployBody());
  await w.handler.handle("deploy", msg);
  assert.deepEqual(w.outcomes, ["failed"]);
  assert.equal(w.records.get("r1")?.state, "failed");
  assert.equal(w.reports[0]?.report.phase, "Failed");
  assert.match(w.reports[0]?.report.message ?? "", /did not create/);
  assert.deepEqual(w.calls, [`ack ${msg.receiptHandle}`]);

  const passing = world();
  passing.fail.apply = new Error("connect ECONNREFUSED");
  const m2 = message(deployBody());
  await passing.handler.handle("deploy", m2);
  assert.deepEqual(passing.outcomes, ["retry"]);
  assert.equal(passing.records.get("r1")?.state, "accepted", "recorded before the apply, left for the retry");
  assert.deepEqual(passing.calls, [`release ${m2.receiptHandle} 5`]);
  assert.ok(passing.logs.warnings().some((e) => /will be retried/.test(e.msg)));
});

void test("a failed acknowledgement of a taken request does not release it", async () => {
  const w = world();
  w.fail.ack = new Error("control plane unreachable");
  const msg = message(deployBody());
  await w.handler.handle("deploy", msg);
  assert.deepEqual(w.outcomes, ["accepted"]);
  assert.ok(!w.calls.some((c) => c.startsWith("release")), "never released: another cluster could take it");
  assert.ok(w.logs.warnings().some((e) => /comes back after its visibility timeout/.test(e.msg)));
});

void test("a termination removes the workload, leaves a tombstone, forgets its status and reports Terminated", async () => {
  const w = world();
  await w.handler.handle("deploy", message(deployBody()));
  const term = message(terminateBody(), "m2");
  await w.handler.handle("termination", term);
  assert.deepEqual(w.outcomes, ["accepted", "terminated"]);
  assert.equal(w.applied.size, 0);
  assert.equal(w.records.get("r1")?.state, "terminated");
  assert.equal(w.records.get("r1")?.messageId, "m1", "the tombstone keeps the deployment's message id");
  assert.deepEqual(w.calls.slice(-3), ["remove r1", "forget r1", `ack ${term.receiptHandle}`]);
  assert.equal(w.reports.at(-1)?.report.phase, "Terminated");

  // Outside the namespaces nothing was created: only the tombstone is written.
  const other = world({ namespaces: ["serving"] });
  await other.handler.handle("termination", message(terminateBody({ namespace: "elsewhere" })));
  assert.ok(!other.calls.some((c) => c.startsWith("remove")));
  assert.equal(other.records.get("r1")?.state, "terminated");
});

void test("instructions: cordon and none toggle taking work; drain removes applied workloads once, reported Failed", async () => {
  const w = world();
  await w.handler.handle("deploy", message(deployBody()));
  await w.handler.handle("deploy", message(deployBody({ requestId: "r2", name: "other" }), "m2"));
  w.calls.length = 0;
  w.reports.length = 0;

  await w.instructions.apply("cordon");
  assert.deepEqual(w.calls, ["cordon true"]);
  assert.equal(w.applied.size, 2, "a cordon removes nothing");

  await w.instructions.apply("drain");
  assert.equal(w.applied.size, 0);
  assert.equal(w.records.get("r1")?.state, "terminated");
  assert.equal(w.records.get("r2")?.state, "terminated");
  assert.deepEqual(
    w.reports.map((r) => [r.requestId, r.report.phase, r.report.message]),
    [
      ["r1", "Failed", "removed: the cluster was drained"],
      ["r2", "Failed", "removed: the cluster was drained"],
    ],
  );

  // A drain repeated on the next heartbeat does nothing more; none resumes and re-arms it.
  w.calls.length = 0;
  await w.handler.handle("deploy", message(deployBody({ requestId: "r3", name: "third" }), "m3"));
  await w.instructions.apply("drain");
  assert.ok(w.applied.has("r3"), "the same drain instruction runs once");
  await w.instructions.apply("none");
  assert.ok(w.calls.includes("cordon false"));
  await w.instructions.apply("drain");
  assert.ok(!w.applied.has("r3"), "a new drain after none removes it");
});

void test("a drain that fails is tried again by the next drain instruction", async () => {
  const w = world();
  await w.handler.handle("deploy", message(deployBody()));
  w.fail.read = new Error("API server unreachable");
  await assert.rejects(w.instructions.apply("drain"), /API server unreachable/);
  assert.ok(w.applied.has("r1"));
  delete w.fail.read;
  await w.instructions.apply("drain");
  assert.equal(w.applied.size, 0);
});
