/**
 * The vLLM charts of the compatibility corpus on real vLLM (its CPU build, SPEC 5 "The real
 * engine"): production-stack's replicas, llm-d's prefill and decode, and KServe's
 * LLMInferenceService (its bash entry, HTTPS, a storage initializer filling /mnt/models), as their
 * charts and controllers make them, with only what the CPU build and one node need adapted: the
 * image, the model (the hub's tiny one), the context length, each server's own port on the node's
 * network, readiness by vLLM's /health, what needs a GPU (NIXL KV transfer, routing sidecars),
 * a self-signed certificate where the chart mounts one, and a UID where the chart asks for a
 * non-root one its image would give. The image's environment sizes the KV cache. Each test: one
 * download from the hub, the restored server answers a completion, and vLLM's own lines and the
 * record say what the restore saved.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { promisify } from "node:util";
import type * as k8s from "@kubernetes/client-node";
import { getModelCache } from "../../src/common/modelcache.js";
import { ANN_ROLE, LABEL_HASH } from "../../src/core/contract.js";
import { readEngineLog } from "../../src/core/engine-log.js";
import { REAL_IMAGES, qualifiedImageName } from "../../tools/localcluster/images/standins.js";
import { REAL_NODE_TAINT } from "../../tools/localcluster/realnode.js";
import { parseEngineReport } from "../../tools/localcluster/engine-chart.js";
import { corpus, createReferenced } from "../corpus.js";
import { isPodReady, kube, localCluster, tempNamespace, uniqueName, waitFor } from "../harness.js";
import {
  completion,
  containerLog,
  hubStats,
  modelBytes,
  realNodeOrSkip,
  startupsOf,
  type RealNode,
} from "../realnode.js";

const READY_MS = 420_000;
const STAND_INS = new Set(REAL_IMAGES.map((i) => qualifiedImageName(i.name)));
const GPU = /^nvidia\.com\/(gpu|mig-)/;
/** Flags whose value needs what the CPU build lacks (NIXL over UCX on GPUs). */
const GPU_ONLY_FLAGS = new Set(["--kv-transfer-config"]);
const GPU_ONLY_IN_ENV = /--kv[-_]transfer[-_]config/;

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
 * after `serve` (or, where a storage initializer fetches it, the initializer's `hf://` source),
 * the port and the flags that need a GPU; its env (HF_HOME, the chart's own) stays, with the hub's
 * address and the run's own value (a fresh cache per run) added. A chart's HTTPS stays HTTPS.
 */
function onRealVllm(source: k8s.V1Pod, v: Vllm, o: { name: string; port: number; run: string }): k8s.V1Pod {
  const spec = structuredClone(source.spec as k8s.V1PodSpec);
  const engine = spec.containers.find((c) =>
    Object.keys({ ...c.resources?.limits, ...c.resources?.requests }).some((k) => GPU.test(k)),
  );
  assert.ok(engine, "the corpus pod has a GPU container");
  let model = false;
  // KServe's initializer fetches the model into the folder vLLM serves: its source names the model.
  const inits = (spec.initContainers ?? [])
    .filter((c) => STAND_INS.has(qualifiedImageName(c.image ?? "")))
    .map((c) => ({
      ...withoutApiAccess(c),
      imagePullPolicy: "IfNotPresent",
      args: (c.args ?? []).map((a) => {
        if (!a.startsWith("hf://")) return a;
        model = true;
        return `hf://${v.model}`;
      }),
      env: [...(c.env ?? []), { name: "HF_ENDPOINT", value: v.node.hub }],
      resources: {},
    }));
  // The model is the word after `serve`, in the command or first in the args; a shell script
  // (`bash -c`) keeps its own, and gets its port in its text.
  let prev = "";
  const adapt = (argv: string[] | undefined): string[] | undefined => {
    if (!argv) return argv;
    if (argv[1] === "-c" && argv[2] !== undefined)
      return [argv[0]!, "-c", argv[2].replace(/--port \d+/g, `--port ${o.port}`), ...argv.slice(3)];
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
  const https = engine.readinessProbe?.httpGet?.scheme === "HTTPS";
  const health = `import ssl, urllib.request; urllib.request.urlopen('${https ? "https" : "http"}://127.0.0.1:${o.port}/health', timeout=2, context=ssl._create_unverified_context())`;
  const keep = (spec.volumes ?? []).filter((vol) => !vol.name.startsWith("kube-api-access-"));
  const container: k8s.V1Container = {
    ...withoutApiAccess(engine),
    image: v.image,
    imagePullPolicy: "IfNotPresent",
    ...(command ? { command } : {}),
    args,
    env: [
      // A GPU-only flag passed through the env (KServe's VLLM_ADDITIONAL_ARGS) goes with its value.
      ...(engine.env ?? []).map((e) =>
        GPU_ONLY_IN_ENV.test(e.value ?? "") ? { name: e.name, value: "" } : e,
      ),
      { name: "HF_ENDPOINT", value: v.node.hub },
      { name: "TEST_RUN", value: o.run },
    ],
    resources: { limits: gpu },
    readinessProbe: { exec: { command: ["python3", "-c", health] }, periodSeconds: 1, timeoutSeconds: 5 },
    volumeMounts: [
      ...(withoutApiAccess(engine).volumeMounts ?? []),
      ...(hasShm ? [] : [{ name: "shm", mountPath: "/dev/shm" }]),
    ],
    // The chart's image runs as a user of its own (runAsNonRoot); the vLLM image's user is root.
    ...(engine.securityContext?.runAsNonRoot
      ? { securityContext: { ...engine.securityContext, runAsUser: 2000, runAsGroup: 2000 } }
      : {}),
  };
  delete container.livenessProbe;
  delete container.startupProbe;
  delete container.ports;
  return {
    metadata: { name: o.name, labels: { ...(source.metadata?.labels ?? {}), "real-charts": "vllm" } },
    spec: {
      initContainers: inits,
      containers: [container],
      volumes: [
        ...keep,
        ...(hasShm ? [] : [{ name: "shm", emptyDir: { medium: "Memory", sizeLimit: "1Gi" } }]),
      ],
      ...(spec.securityContext ? { securityContext: spec.securityContext } : {}),
      nodeSelector: { "kubernetes.io/hostname": v.node.name },
      tolerations: [{ key: REAL_NODE_TAINT.key, operator: "Exists", effect: REAL_NODE_TAINT.effect }],
      hostNetwork: true,
      automountServiceAccountToken: false,
      terminationGracePeriodSeconds: 2,
    },
  };
}

function withoutApiAccess(c: k8s.V1Container): k8s.V1Container {
  return { ...c, volumeMounts: (c.volumeMounts ?? []).filter((m) => !m.name.startsWith("kube-api-access-")) };
}

const role = (p: k8s.V1Pod): string | undefined => p.metadata?.annotations?.[ANN_ROLE];

/** Runs corpus pods (our name, its id, its port) on real vLLM in a fresh namespace, until all are Ready. */
async function runOnVllm(
  t: TestContext,
  v: Vllm,
  prefix: string,
  file: string,
  pods: Array<[string, string, number]>,
  prepare?: (namespace: string) => Promise<void>,
): Promise<k8s.V1Pod[]> {
  const { core } = await kube();
  const namespace = await tempNamespace(t, prefix);
  await prepare?.(namespace);
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

/**
 * The restored server of a pair started on the leader's compile cache: vLLM's own lines (a shorter
 * warm-up, no "Compiling model again") and the record (hit: it compiled no file again). The
 * timing bar (at most half the leader's init) is real-engine.test.ts's.
 */
async function assertRestoredWarm(
  t: TestContext,
  v: Vllm,
  pods: k8s.V1Pod[],
  leader: k8s.V1Pod,
  container: string,
): Promise<k8s.V1Pod> {
  const restored = pods.find((p) => p !== leader)!;
  const [cold, warmText] = [
    readEngineLog(await containerLog(v.node, leader, container)),
    await containerLog(v.node, restored, container),
  ];
  const warm = readEngineLog(warmText);
  t.diagnostic(`leader ${JSON.stringify(cold.seconds)}; restored ${JSON.stringify(warm.seconds)}`);
  assert.equal(warm.engine, "vllm");
  assert.ok(
    warm.seconds.compile! < cold.seconds.compile!,
    `the restored warm-up ${warm.seconds.compile} s is shorter than the leader's ${cold.seconds.compile} s`,
  );
  assert.doesNotMatch(warmText, /Compiling model again/);
  const starts = await startupsOf(pods);
  assert.equal(starts.get(restored.metadata!.uid!)?.compileCache, "hit", "on the record");
  return restored;
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
  const restored = await assertRestoredWarm(t, v, pods, leader, "vllm");
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

/** A self-signed certificate for localhost in the Secret a chart mounts (tls.crt, tls.key). */
async function tlsSecret(namespace: string, name: string): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "tls-"));
  try {
    const [crt, key] = [join(dir, "tls.crt"), join(dir, "tls.key")];
    await promisify(execFile)("openssl", [
      "req",
      "-x509",
      "-newkey",
      "rsa:2048",
      "-nodes",
      "-days",
      "1",
      "-subj",
      "/CN=localhost",
      "-keyout",
      key,
      "-out",
      crt,
    ]);
    const { core } = await kube();
    await core.createNamespacedSecret({
      namespace,
      body: {
        metadata: { name },
        type: "kubernetes.io/tls",
        stringData: { "tls.crt": await readFile(crt, "utf8"), "tls.key": await readFile(key, "utf8") },
      },
    });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

test("KServe LLMInferenceService on real vLLM (its bash entry, HTTPS, non-root, the storage initializer into /mnt/models): two prefill replicas, one download, the restored one's initializer fetches nothing and it answers", async (t) => {
  const v = await vllmOrSkip(t);
  if (!v) return;
  const before = (await hubStats(v.node)).repos[v.model]?.bytes ?? 0;
  const pods = await runOnVllm(
    t,
    v,
    "llmisvc-vllm",
    "kserve/llmisvc-pd-qwen2-7b.yaml",
    [
      ["prefill-a", "prefill-a", 18421],
      ["prefill-b", "prefill-b", 18422],
    ],
    (ns) => tlsSecret(ns, "qwen2-7b-instruct-pd-kserve-self-signed-certs"),
  );
  const leader = await assertOneDownload(v, pods, before);
  const restored = await assertRestoredWarm(t, v, pods, leader, "main");
  const init = parseEngineReport(await containerLog(v.node, restored, "storage-initializer"));
  assert.equal(init?.fetchedBytes, 0, "the restored pod's initializer fetched nothing");
  const port = restored.metadata!.name === "prefill-a" ? 18421 : 18422;
  assert.ok(
    (await completion(port, "Qwen/Qwen2.5-7B-Instruct", "https")).length > 0,
    "the restored server answers",
  );
});
