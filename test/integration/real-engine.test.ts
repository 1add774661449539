/**
 * Real vLLM (its CPU build, SPEC 5 "The real engine") on the local cluster's real node: a leader
 * downloads the hub's real tiny model and compiles; a follower restores the captured tree and
 * vLLM's own log lines say what it saved. Nothing here is the stand-in.
 */
import assert from "node:assert/strict";
import { test, type TestContext } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { readEngineLog } from "../../src/core/engine-log.js";
import { ANN_ROLE, LABEL_HASH } from "../../src/core/contract.js";
import { getModelCache } from "../../src/common/modelcache.js";
import { REAL_NODE_TAINT } from "../../tools/localcluster/realnode.js";
import { isPodReady, kube, localCluster, tempNamespace, waitFor } from "../harness.js";
import { containerLog, hubStats, modelBytes, realNodeOrSkip, type RealNode } from "../realnode.js";

const READY_MS = 300_000;
const role = (p: k8s.V1Pod): string | undefined => p.metadata?.annotations?.[ANN_ROLE];

/**
 * One vLLM server as a chart writes it (`vllm serve MODEL ...`), on its own port of the node's
 * network (pods there share it), sized for the CPU build: a short context and 1 GiB of KV cache
 * (the image's env).
 */
function vllmPod(node: RealNode, image: string, model: string, name: string, port: number): k8s.V1Pod {
  const health = `import urllib.request; urllib.request.urlopen('http://127.0.0.1:${port}/health', timeout=2)`;
  return {
    metadata: { name, labels: { app: "vllm" } },
    spec: {
      hostNetwork: true,
      nodeSelector: { "kubernetes.io/hostname": node.name },
      tolerations: [{ key: REAL_NODE_TAINT.key, operator: "Exists", effect: REAL_NODE_TAINT.effect }],
      terminationGracePeriodSeconds: 2,
      containers: [
        {
          name: "vllm",
          image,
          imagePullPolicy: "IfNotPresent",
          command: ["vllm", "serve"],
          args: [model, "--max-model-len", "256", "--dtype", "bfloat16", "--port", String(port)],
          env: [{ name: "HF_ENDPOINT", value: node.hub }],
          resources: { limits: { "nvidia.com/gpu": "1" } },
          readinessProbe: {
            exec: { command: ["python3", "-c", health] },
            periodSeconds: 2,
            timeoutSeconds: 5,
          },
        },
      ],
    },
  };
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

async function completion(port: number, model: string): Promise<string> {
  const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ model, prompt: "Hello, how are", max_tokens: 5 }),
  });
  assert.equal(res.status, 200, await res.clone().text());
  const body = (await res.json()) as { choices: { text: string }[] };
  return body.choices[0]!.text;
}

async function vllmOrSkip(
  t: TestContext,
): Promise<{ node: RealNode; image: string; model: string } | undefined> {
  const node = await realNodeOrSkip(t);
  const st = await localCluster();
  if (!node || !st?.images?.vllm || !st.models?.tiny) {
    if (node) t.skip("this cluster has no real vLLM (images.vllm)");
    return undefined;
  }
  return { node, image: st.images.vllm, model: st.models.tiny };
}

test("real vLLM: two servers of one model download once; the restored one starts on the leader's compile cache and answers", async (t) => {
  const v = await vllmOrSkip(t);
  if (!v) return;
  const { core, custom } = await kube();
  const ns = await tempNamespace(t, "vllm");
  const before = (await hubStats(v.node)).repos[v.model]?.bytes ?? 0;
  const leader = await core.createNamespacedPod({
    namespace: ns,
    body: vllmPod(v.node, v.image, v.model, "a", 18101),
  });
  const follower = await core.createNamespacedPod({
    namespace: ns,
    body: vllmPod(v.node, v.image, v.model, "b", 18102),
  });
  assert.deepEqual([role(leader), role(follower)], ["leader", "follower"], "--port does not split the cache");
  const a = await readyPod(ns, "a");
  const b = await readyPod(ns, "b");

  const leaderLog = readEngineLog(await containerLog(v.node, a, "vllm"));
  const restoredText = await containerLog(v.node, b, "vllm");
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
  const c = await core.createNamespacedPod({
    namespace: ns2,
    body: vllmPod(v.node, v.image, v.model, "c", 18103),
  });
  assert.equal(role(c), "restore");
  const cReady = await readyPod(ns2, "c");
  const third = readEngineLog(await containerLog(v.node, cReady, "vllm"));
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
});
