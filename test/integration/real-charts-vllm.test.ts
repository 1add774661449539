/**
 * The vLLM charts of the compatibility corpus on real vLLM (its CPU build, SPEC 5 "The real
 * engine"): production-stack's replicas and llm-d's prefill and decode, as their charts make them,
 * with only what the CPU build needs adapted: the image, the model (the hub's tiny one), the
 * context length, each server's own port on the node's network, readiness by vLLM's /health, and
 * what needs a GPU (llm-d's NIXL KV transfer, its routing sidecar). The image's environment sizes
 * the KV cache. Each test: one download from the hub, the restored server answers a completion,
 * and vLLM's own lines say what the restore saved.
 */
import assert from "node:assert/strict";
import { test, type TestContext } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { getModelCache } from "../../src/common/modelcache.js";
import { ANN_ROLE, LABEL_HASH } from "../../src/core/contract.js";
import { readEngineLog } from "../../src/core/engine-log.js";
import { REAL_NODE_TAINT } from "../../tools/localcluster/realnode.js";
import { corpus, createReferenced } from "../corpus.js";
import { isPodReady, kube, localCluster, tempNamespace, uniqueName, waitFor } from "../harness.js";
import {
  containerLog,
  hubStats,
  modelBytes,
  realNodeOrSkip,
  startupsOf,
  type RealNode,
} from "../realnode.js";

const READY_MS = 420_000;
const GPU = /^nvidia\.com\/(gpu|mig-)/;
/** Flags whose value needs what the CPU build lacks (NIXL over UCX on GPUs). */
const GPU_ONLY_FLAGS = new Set(["--kv-transfer-config"]);

interface Vllm {
  node: RealNode;
  image: string;
  model: string;
}

async function vllmOrSkip(t: TestContext): Promise<Vllm | undefined> {
  const node = await realNodeOrSkip(t);
  const st = await localCluster();
  if (!node || !st?.images?.vllm || !st.models?.tiny) {
    if (node) t.skip("this cluster has no real vLLM (images.vllm)");
    return undefined;
  }
  return { node, image: st.images.vllm, model: st.models.tiny };
}

/**
 * A corpus pod's vLLM container on the real engine. Its argv is the chart's, but for the model
 * after `serve`, `--port` and the flags that need a GPU; its env (HF_HOME, the chart's own) stays,
 * with the hub's address and the run's own value (a fresh cache per run) added.
 */
function onRealVllm(source: k8s.V1Pod, v: Vllm, o: { name: string; port: number; run: string }): k8s.V1Pod {
  const spec = structuredClone(source.spec as k8s.V1PodSpec);
  const engine = spec.containers.find((c) =>
    Object.keys({ ...c.resources?.limits, ...c.resources?.requests }).some((k) => GPU.test(k)),
  );
  assert.ok(engine, "the corpus pod has a GPU container");
  // The model is the word after `serve`, in the command or first in the args.
  let model = false;
  let prev = "";
  const adapt = (argv: string[] | undefined): string[] | undefined => {
    if (!argv) return argv;
    const out: string[] = [];
    for (let i = 0; i < argv.length; i++) {
      const a = argv[i]!;
      if (GPU_ONLY_FLAGS.has(a)) {
        i++;
      } else if (a === "--port") {
        out.push(a, String(o.port));
        i++;
      } else if (prev === "serve" && !model) {
        out.push(v.model);
        model = true;
      } else out.push(a);
      prev = a;
    }
    return out;
  };
  const command = adapt(engine.command);
  const args = [...(adapt(engine.args) ?? []), "--max-model-len", "256"];
  assert.ok(model, `the model after serve in ${JSON.stringify([engine.command, engine.args])}`);
  const hasShm = (engine.volumeMounts ?? []).some((m) => m.mountPath === "/dev/shm");
  const gpu = Object.fromEntries(Object.entries(engine.resources?.limits ?? {}).filter(([k]) => GPU.test(k)));
  const health = `import urllib.request; urllib.request.urlopen('http://127.0.0.1:${o.port}/health', timeout=2)`;
  const keep = (spec.volumes ?? []).filter((vol) => !vol.name.startsWith("kube-api-access-"));
  const container: k8s.V1Container = {
    name: engine.name,
    image: v.image,
    imagePullPolicy: "IfNotPresent",
    ...(command ? { command } : {}),
    args,
    env: [
      ...(engine.env ?? []),
      { name: "HF_ENDPOINT", value: v.node.hub },
      { name: "TEST_RUN", value: o.run },
    ],
    resources: { limits: gpu },
    readinessProbe: { exec: { command: ["python3", "-c", health] }, periodSeconds: 1, timeoutSeconds: 5 },
    volumeMounts: [
      ...(engine.volumeMounts ?? []).filter((m) => !m.name.startsWith("kube-api-access-")),
      ...(hasShm ? [] : [{ name: "shm", mountPath: "/dev/shm" }]),
    ],
  };
  return {
    metadata: { name: o.name, labels: { ...(source.metadata?.labels ?? {}), "real-charts": "vllm" } },
    spec: {
      containers: [container],
      volumes: [
        ...keep,
        ...(hasShm ? [] : [{ name: "shm", emptyDir: { medium: "Memory", sizeLimit: "1Gi" } }]),
      ],
      nodeSelector: { "kubernetes.io/hostname": v.node.name },
      tolerations: [{ key: REAL_NODE_TAINT.key, operator: "Exists", effect: REAL_NODE_TAINT.effect }],
      hostNetwork: true,
      automountServiceAccountToken: false,
      terminationGracePeriodSeconds: 2,
    },
  };
}

const role = (p: k8s.V1Pod): string | undefined => p.metadata?.annotations?.[ANN_ROLE];

/** Runs corpus pods (our name, its id, its port) on real vLLM in a fresh namespace, until all are Ready. */
async function runOnVllm(
  t: TestContext,
  v: Vllm,
  prefix: string,
  file: string,
  pods: Array<[string, string, number]>,
): Promise<k8s.V1Pod[]> {
  const { core } = await kube();
  const namespace = await tempNamespace(t, prefix);
  const c = corpus(file);
  const run = uniqueName("run");
  for (const [name, id, port] of pods) {
    const body = onRealVllm(c.get(id)!, v, { name, port, run });
    await createReferenced(namespace, body);
    await core.createNamespacedPod({ namespace, body });
  }
  return waitFor(
    `${pods.length} vLLM servers Ready in ${namespace}`,
    async () => {
      const list = (await core.listNamespacedPod({ namespace, labelSelector: "real-charts=vllm" })).items;
      return list.length === pods.length && list.every(isPodReady) ? list : undefined;
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
  return ((await res.json()) as { choices: { text: string }[] }).choices[0]!.text;
}

/** One hash, one leader that downloaded, the cache Ready, the others restored; the hub served one model. */
async function assertOneDownload(v: Vllm, pods: k8s.V1Pod[], before: number): Promise<k8s.V1Pod> {
  assert.equal(new Set(pods.map((p) => p.metadata?.labels?.[LABEL_HASH])).size, 1, "one hash");
  const leaders = pods.filter((p) => role(p) === "leader");
  assert.equal(leaders.length, 1, `one leader (${pods.map(role).join(", ")})`);
  for (const p of pods) if (p !== leaders[0]) assert.ok(["follower", "restore"].includes(role(p) ?? ""));
  const { custom } = await kube();
  const cache = await getModelCache(custom, pods[0]!.metadata!.labels![LABEL_HASH]!);
  assert.equal(cache?.status?.phase, "Ready");
  const served = ((await hubStats(v.node)).repos[v.model]?.bytes ?? 0) - before;
  assert.equal(served, await modelBytes(v.node, v.model), "the hub served one model");
  return leaders[0]!;
}

test("production-stack on real vLLM (HF_HOME=/tmp): two replicas, one download, the restored one starts on the leader's compile cache and answers", async (t) => {
  const v = await vllmOrSkip(t);
  if (!v) return;
  const before = (await hubStats(v.node)).repos[v.model]?.bytes ?? 0;
  const pods = await runOnVllm(
    t,
    v,
    "prodstack-vllm",
    "vllm-production-stack/minimal-opt125m-hf-home-tmp.yaml",
    [
      ["engine-a", "engine-a", 18401],
      ["engine-b", "engine-b", 18402],
    ],
  );
  const leader = await assertOneDownload(v, pods, before);
  const restored = pods.find((p) => p !== leader)!;
  const [cold, warmText] = [
    readEngineLog(await containerLog(v.node, leader, "vllm")),
    await containerLog(v.node, restored, "vllm"),
  ];
  const warm = readEngineLog(warmText);
  t.diagnostic(`leader ${JSON.stringify(cold.seconds)}; restored ${JSON.stringify(warm.seconds)}`);
  assert.equal(warm.engine, "vllm");
  assert.ok(
    warm.seconds.engineInit! <= cold.seconds.engineInit! / 2,
    `the restored "init engine ... took" ${warm.seconds.engineInit} s is at most half the leader's ${cold.seconds.engineInit} s`,
  );
  assert.doesNotMatch(warmText, /Compiling model again/);
  const starts = await startupsOf(pods);
  assert.equal(starts.get(restored.metadata!.uid!)?.compileCache, "hit", "on the record");
  const port = restored.metadata!.name === "engine-a" ? 18401 : 18402;
  assert.ok((await completion(port, v.model)).length > 0, "the restored server answers");
});

test("llm-d prefill and decode on real vLLM (--enforce-eager, HF_HOME on the chart's emptyDir): one download, both answer", async (t) => {
  const v = await vllmOrSkip(t);
  if (!v) return;
  const before = (await hubStats(v.node)).repos[v.model]?.bytes ?? 0;
  const pods = await runOnVllm(t, v, "llmd-vllm", "llm-d/pd-opt125m.yaml", [
    ["prefill", "prefill", 18411],
    ["decode", "decode", 18412],
  ]);
  const leader = await assertOneDownload(v, pods, before);
  const restored = pods.find((p) => p !== leader)!;
  const warm = readEngineLog(await containerLog(v.node, restored, "vllm"));
  t.diagnostic(`restored ${JSON.stringify(warm.seconds)}`);
  assert.equal(warm.engine, "vllm");
  assert.equal(warm.seconds.compile, undefined, "the chart runs eager: nothing compiled");
  // The chart serves the model under its own name (--served-model-name), as its router asks for it.
  for (const port of [18411, 18412]) assert.ok((await completion(port, "facebook/opt-125m")).length > 0);
});
