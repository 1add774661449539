/**
 * Real vLLM (its CPU build, SPEC 5 "The real engine") on the local cluster's real node: a leader
 * downloads the hub's real tiny model and compiles; a follower restores the captured tree and
 * vLLM's own log lines say what it saved. Nothing here is the stand-in.
 *
 * The servers read their settings from a config file (`vllm serve MODEL --config FILE`, a
 * ConfigMap as charts mount one): a file's content is outside the pod spec, so a namespace whose
 * file asks for another dtype restores the same cache, and vLLM compiles again. That restore is
 * shown as a miss, with what vLLM's own config line says differs.
 */
import assert from "node:assert/strict";
import { test, type TestContext } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { readEngineLog } from "../../src/core/engine-log.js";
import { ANN_ROLE, LABEL_HASH } from "../../src/core/contract.js";
import { getModelCache } from "../../src/common/modelcache.js";
import { vllmServerPod, type VllmServer } from "../../tools/localcluster/engine-chart.js";
import { isPodReady, kube, localCluster, tempNamespace, waitFor } from "../harness.js";
import {
  completion,
  containerLog,
  eventsOf,
  hubStats,
  modelBytes,
  realNodeOrSkip,
  startupsOf,
  warmstartPods,
  type RealNode,
} from "../realnode.js";

const READY_MS = 300_000;
const role = (p: k8s.V1Pod): string | undefined => p.metadata?.annotations?.[ANN_ROLE];

/** The servers' config file, as a chart's ConfigMap holds it. */
async function serveConfig(namespace: string, dtype: string): Promise<void> {
  const { core } = await kube();
  await core.createNamespacedConfigMap({
    namespace,
    body: { metadata: { name: "serve" }, data: { "serve.yaml": `dtype: ${dtype}\nmax-model-len: 256\n` } },
  });
}

async function readyPod(namespace: string, name: string): Promise<k8s.V1Pod> {
  const { core } = await kube();
  return waitFor(
    `${namespace}/${name} Ready`,
    async () => {
      const p = await core.readNamespacedPod({ namespace, name });
      return isPodReady(p) ? p : undefined;
    },
    READY_MS,
  );
}

async function vllmOrSkip(
  t: TestContext,
): Promise<{ node: RealNode; model: string; server: Omit<VllmServer, "name" | "port"> } | undefined> {
  const node = await realNodeOrSkip(t);
  const st = await localCluster();
  if (!node || !st?.images?.vllm || !st.models?.tiny) {
    if (node) t.skip("this cluster has no real vLLM (images.vllm)");
    return undefined;
  }
  const server = { node: node.name, image: st.images.vllm, model: st.models.tiny, hub: node.hub };
  return { node, model: st.models.tiny, server };
}

test("real vLLM: two servers of one model download once; the restored ones start on the leader's compile cache and answer, and one made for another dtype is shown as a miss", async (t) => {
  const v = await vllmOrSkip(t);
  if (!v) return;
  const { core, custom } = await kube();
  const ns = await tempNamespace(t, "vllm");
  await serveConfig(ns, "bfloat16");
  const before = (await hubStats(v.node)).repos[v.model]?.bytes ?? 0;
  const leader = await core.createNamespacedPod({
    namespace: ns,
    body: vllmServerPod({ ...v.server, name: "a", port: 18101, configMap: "serve" }),
  });
  const follower = await core.createNamespacedPod({
    namespace: ns,
    body: vllmServerPod({ ...v.server, name: "b", port: 18102, configMap: "serve" }),
  });
  assert.deepEqual([role(leader), role(follower)], ["leader", "follower"], "--port does not split the cache");
  const a = await readyPod(ns, "a");
  const b = await readyPod(ns, "b");

  const leaderLog = readEngineLog(await containerLog(v.node, a, "engine"));
  const restoredText = await containerLog(v.node, b, "engine");
  const restored = readEngineLog(restoredText);
  t.diagnostic(`leader: ${JSON.stringify(leaderLog.seconds)}; restored: ${JSON.stringify(restored.seconds)}`);
  assert.equal(leaderLog.engine, "vllm");
  const [cold, warm] = [leaderLog.seconds.engineInit!, restored.seconds.engineInit!];
  assert.ok(
    warm <= cold / 2,
    `the restored "init engine ... took" ${warm} s is at most half the leader's ${cold} s`,
  );
  assert.doesNotMatch(restoredText, /Compiling model again/);
  const short = a.metadata!.labels![LABEL_HASH]!;
  const cache = await getModelCache(custom, short);
  assert.equal(cache?.status?.phase, "Ready");
  const model = await modelBytes(v.node, v.model);
  assert.equal((await hubStats(v.node)).repos[v.model]?.bytes, before + model, "the hub served one model");
  assert.ok((await completion(18102, v.model)).length > 0, "the restored server answers a completion");

  // A restore in another namespace, of the same cache.
  const ns2 = await tempNamespace(t, "vllm-other");
  await serveConfig(ns2, "bfloat16");
  const c = await core.createNamespacedPod({
    namespace: ns2,
    body: vllmServerPod({ ...v.server, name: "c", port: 18103, configMap: "serve" }),
  });
  assert.equal(role(c), "restore");
  const cReady = await readyPod(ns2, "c");
  const third = readEngineLog(await containerLog(v.node, cReady, "engine"));
  assert.ok(
    third.seconds.engineInit! <= cold / 2,
    `restored in another namespace: ${third.seconds.engineInit} s`,
  );
  assert.equal(
    (await hubStats(v.node)).repos[v.model]?.bytes,
    before + model,
    "still one model from the hub",
  );
  assert.ok((await completion(18103, v.model)).length > 0);
  const starts = await startupsOf([a, b, cReady]);
  t.diagnostic(JSON.stringify([...starts.values()]));
  assert.equal(starts.get(a.metadata!.uid!)?.config?.dtype, "torch.bfloat16", "vLLM's config line, read");
  for (const p of [b, cReady])
    assert.equal(starts.get(p.metadata!.uid!)?.compileCache, "hit", `${p.metadata!.name}: on the record`);

  // A namespace whose config file asks for float32: the same cache, restored, and compiled again.
  const ns3 = await tempNamespace(t, "vllm-fp32");
  await serveConfig(ns3, "float32");
  const d = await core.createNamespacedPod({
    namespace: ns3,
    body: vllmServerPod({ ...v.server, name: "d", port: 18104, configMap: "serve" }),
  });
  assert.equal(role(d), "restore");
  assert.equal(d.metadata!.labels![LABEL_HASH], short, "a config file is outside the hash");
  const dReady = await readyPod(ns3, "d");
  const miss = (await startupsOf([dReady])).get(dReady.metadata!.uid!)!;
  t.diagnostic(JSON.stringify(miss));
  assert.equal(miss.config?.dtype, "torch.float32");
  assert.equal(miss.compileCache, "miss");
  const why = "dtype torch.float32 here, torch.bfloat16 for the leader";
  assert.ok(miss.cause?.includes(why), miss.cause);
  const { table } = await warmstartPods();
  assert.ok(table.includes(`compile cache missed on ${ns3}/d: `) && table.includes(why), table);
  const warning = await waitFor("the CompileCacheMiss Warning", async () =>
    (await eventsOf(ns3, dReady)).find((e) => e.reason === "CompileCacheMiss"),
  );
  assert.ok(warning.message?.includes(why), warning.message);
  assert.ok((await completion(18104, v.model)).length > 0);
});
