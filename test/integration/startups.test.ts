/**
 * Each pod's start, as its engine logged it (SPEC 1.8; the engine stand-in prints vLLM's own phase
 * lines): the node agent of the pod's node reads them from the kubelet's log files and records
 * the phases and the compile cache's hit or miss on the cache's record, where `warmstart pods`
 * and the dashboard show them, with an Event on the pod. A restore on a node whose GPUs are
 * another product misses its compile cache, as real engines' do, and is told why.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import * as k8s from "@kubernetes/client-node";
import { getModelCache } from "../../src/common/modelcache.js";
import { ANN_ROLE, LABEL_HASH } from "../../src/core/contract.js";
import { DEFAULT_REAL_NODE_PRODUCT, setRealNodeGpuProduct } from "../../tools/localcluster/realnode.js";
import { isPodReady, kube, listPods, tempNamespace, uniqueName, waitFor } from "../harness.js";
import { createEngines, eventsOf, realNodeOrSkip, startupsOf, warmstartPods } from "../realnode.js";

const READY_MS = 240_000;
const jsonPatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch);
const role = (p: k8s.V1Pod): string => p.metadata?.annotations?.[ANN_ROLE] ?? "";

async function readyPods(ns: string, n: number): Promise<k8s.V1Pod[]> {
  return waitFor(
    `${n} Ready engine pods in ${ns}`,
    async () => {
      const pods = (await listPods(ns, "app=engine")).filter((p) => !p.metadata?.deletionTimestamp);
      return pods.length === n && pods.every(isPodReady) ? pods : undefined;
    },
    READY_MS,
  );
}

test("each pod's start is read from its engine's log: the leader compiles, the restore finds its compile cache; the record, `warmstart pods` and an Event say so", async (t) => {
  const node = await realNodeOrSkip(t);
  if (!node) return;
  const ns = await tempNamespace(t, "start");
  await createEngines(t, node, ns, { replicas: 2, model: `synthetic/${uniqueName("m")}` });
  const pods = await readyPods(ns, 2);
  const leader = pods.find((p) => role(p) === "leader")!;
  const restored = pods.find((p) => p !== leader)!;
  assert.ok(leader && restored, `a leader and a restore: ${pods.map(role).join(", ")}`);

  const startups = await startupsOf(pods);
  const l = startups.get(leader.metadata!.uid!)!;
  const r = startups.get(restored.metadata!.uid!)!;
  t.diagnostic(`leader ${JSON.stringify(l)}`);
  t.diagnostic(`restored ${JSON.stringify(r)}`);
  assert.equal(l.engine, "vllm", "the stand-in speaks vLLM's lines");
  assert.equal(l.compileCache, "miss", "the leader compiled");
  assert.ok((l.seconds.compile ?? 0) >= 1, `the leader's compile took its 1 s: ${l.seconds.compile}`);
  assert.ok(typeof l.seconds.weightLoad === "number", "weight load read");
  assert.equal(l.gpuProduct, DEFAULT_REAL_NODE_PRODUCT, "the node's GPU product kept");
  assert.equal(r.compileCache, "hit", "the restore loaded its compiled graphs");
  assert.equal(r.cause, undefined, "a hit needs no cause");
  assert.ok((r.seconds.download ?? 0) < 0.5, `the restore downloaded nothing: ${r.seconds.download}`);

  const { table, json } = await warmstartPods();
  const row = json.pods.find((p) => p.name === restored.metadata!.name);
  assert.deepEqual(
    (row?.startup as { compileCache?: string } | null)?.compileCache,
    "hit",
    "warmstart pods -o json",
  );
  assert.match(table, /COMPILE CACHE/);
  assert.match(
    table.split("\n").find((x) => x.includes(restored.metadata!.name!)) ?? "",
    /\bhit\b/,
    "the table's row of the restore",
  );
  const events = await waitFor("the restore's EngineStarted Event", async () => {
    const evs = await eventsOf(ns, restored);
    return evs.some((e) => e.reason === "EngineStarted") ? evs : undefined;
  });
  assert.match(events.find((e) => e.reason === "EngineStarted")!.message ?? "", /compile cache hit/);
});

test("a restore on a node whose GPUs are another product misses its compile cache, and says why: on the record, in `warmstart pods` and as a Warning", async (t) => {
  const node = await realNodeOrSkip(t);
  if (!node) return;
  const { apps, core, custom } = await kube();
  const ns = await tempNamespace(t, "miss");
  await createEngines(t, node, ns, { replicas: 1, model: `synthetic/${uniqueName("m")}` });
  const [leader] = await readyPods(ns, 1);
  const short = leader!.metadata!.labels![LABEL_HASH]!;
  await startupsOf([leader!]);
  await waitFor(
    "the cache Ready",
    async () => (await getModelCache(custom, short))?.status?.phase === "Ready",
    READY_MS,
  );

  // The node's GPUs swapped for another product: what its containers see, and its label.
  const other = "NVIDIA-H100-80GB-HBM3";
  t.after(() => setRealNodeGpuProduct(core, node.name, DEFAULT_REAL_NODE_PRODUCT));
  await setRealNodeGpuProduct(core, node.name, other);
  await apps.patchNamespacedDeploymentScale(
    { name: "engine", namespace: ns, body: [{ op: "replace", path: "/spec/replicas", value: 2 }] },
    jsonPatch,
  );
  const restored = (await readyPods(ns, 2)).find((p) => p.metadata!.uid !== leader!.metadata!.uid)!;
  assert.notEqual(role(restored), "leader");
  const entry = (await startupsOf([restored])).get(restored.metadata!.uid!)!;
  t.diagnostic(JSON.stringify(entry));
  assert.equal(entry.compileCache, "miss", "the compiled graphs of another GPU are not loaded");
  assert.equal(entry.gpuProduct, other);
  assert.match(entry.cause ?? "", /GPU product differs/);
  assert.ok(entry.cause?.includes(other) && entry.cause.includes(DEFAULT_REAL_NODE_PRODUCT), entry.cause);

  const { table, json } = await warmstartPods();
  const row = json.pods.find((p) => p.name === restored.metadata!.name);
  assert.match(String((row?.startup as { cause?: string } | null)?.cause), /GPU product differs/);
  assert.match(
    table,
    new RegExp(`compile cache missed on ${ns}/${restored.metadata!.name}: GPU product differs`),
  );
  const warning = await waitFor("the CompileCacheMiss Warning", async () =>
    (await eventsOf(ns, restored)).find((e) => e.reason === "CompileCacheMiss"),
  );
  assert.equal(warning.type, "Warning");
  assert.match(warning.message ?? "", new RegExp(`GPU product differs.*${other}`));
});
