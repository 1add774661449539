/**
 * Rendered upstream charts on the local cluster's real node (issue "Real charts"): pods of the
 * compatibility corpus (test/corpus/), as their charts and operators make them, run in real
 * containers. The engine stand-in answers to the real image names and command lines, so only what
 * a one-node cluster without a registry, GPUs or network ports needs is adapted: pull policy,
 * placement on the real node, readiness by file instead of HTTP, CPU and memory sizes, the hub's
 * address, sidecars whose images are not there. Each test: one download per model from the hub,
 * restored replicas fetch nothing and find their compile caches, two models never share a tree.
 */
import assert from "node:assert/strict";
import { test, type TestContext } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { getModelCache } from "../../src/common/modelcache.js";
import { ANN_ROLE, LABEL_HASH } from "../../src/core/contract.js";
import {
  ENGINE_READY_FILE,
  parseEngineReport,
  type EngineReport,
} from "../../tools/localcluster/engine-chart.js";
import { REAL_IMAGES, qualifiedImageName } from "../../tools/localcluster/images/standins.js";
import { REAL_NODE_TAINT } from "../../tools/localcluster/realnode.js";
import { isPodReady, kube, tempNamespace, uniqueName, waitFor } from "../harness.js";
import {
  containerLog,
  hubStats,
  modelBytes,
  realNodeOrSkip,
  type HubStats,
  type RealNode,
} from "../realnode.js";
import { corpus, createReferenced } from "../corpus.js";

const READY_TIMEOUT_MS = 300_000;
const GPU = /^nvidia\.com\/(gpu|mig-)/;
const STAND_INS = new Set(REAL_IMAGES.map((i) => qualifiedImageName(i.name)));

/**
 * A corpus pod made runnable on the real node: nothing of what Warmstart reads (argv, env, cache
 * volumes, init containers that fill them, GPU requests) is touched.
 */
function onRealNode(source: k8s.V1Pod, node: RealNode, name: string, run: string): k8s.V1Pod {
  const p = structuredClone(source);
  const meta = p.metadata ?? {};
  p.metadata = {
    name,
    labels: { ...(meta.labels ?? {}), "real-charts": "true" },
    ...(meta.annotations ? { annotations: meta.annotations } : {}),
  };
  const spec = p.spec as k8s.V1PodSpec;
  const serviceAccountVolumes = new Set(
    (spec.volumes ?? []).filter((v) => v.name.startsWith("kube-api-access-")).map((v) => v.name),
  );
  const runnable = (c: k8s.V1Container): boolean => STAND_INS.has(qualifiedImageName(c.image ?? ""));
  const adapt = (c: k8s.V1Container, main: boolean): k8s.V1Container => {
    const requests = Object.fromEntries(
      Object.entries(c.resources?.requests ?? {}).filter(([k]) => GPU.test(k)),
    );
    const limits = Object.fromEntries(Object.entries(c.resources?.limits ?? {}).filter(([k]) => GPU.test(k)));
    const { ports: _ports, livenessProbe: _l, startupProbe: _s, readinessProbe: _r, ...rest } = c;
    return {
      ...rest,
      imagePullPolicy: "IfNotPresent",
      // The run's own value makes its own hashes, so a rerun on the same cluster elects again.
      env: [
        ...(c.env ?? []),
        { name: "HF_ENDPOINT", value: node.hub },
        ...(main ? [{ name: "TEST_RUN", value: run }] : []),
      ],
      resources: {
        ...(Object.keys(requests).length ? { requests } : {}),
        ...(Object.keys(limits).length ? { limits } : {}),
      },
      volumeMounts: (c.volumeMounts ?? []).filter((m) => !serviceAccountVolumes.has(m.name)),
      ...(main
        ? { readinessProbe: { exec: { command: ["cat", ENGINE_READY_FILE] }, periodSeconds: 1 } }
        : {}),
    };
  };
  const main = spec.containers.find((c) =>
    Object.keys({ ...c.resources?.limits, ...c.resources?.requests }).some((k) => GPU.test(k)),
  );
  p.spec = {
    ...spec,
    containers: spec.containers.filter(runnable).map((c) => adapt(c, c === main)),
    initContainers: (spec.initContainers ?? []).filter(runnable).map((c) => adapt(c, false)),
    volumes: (spec.volumes ?? []).filter((v) => !serviceAccountVolumes.has(v.name)),
    nodeSelector: { "kubernetes.io/hostname": node.name },
    tolerations: [{ key: REAL_NODE_TAINT.key, operator: "Exists", effect: REAL_NODE_TAINT.effect }],
    hostNetwork: true,
    automountServiceAccountToken: false,
    serviceAccountName: "default",
    terminationGracePeriodSeconds: 1,
  };
  for (const k of [
    "nodeName",
    "affinity",
    "runtimeClassName",
    "priorityClassName",
    "priority",
    "schedulerName",
    "serviceAccount",
    "hostname",
    "subdomain",
    "dnsPolicy",
    "preemptionPolicy",
  ] as const)
    delete (p.spec as unknown as Record<string, unknown>)[k];
  return p;
}

async function run(
  t: TestContext,
  node: RealNode,
  namespace: string,
  pods: Array<[string, k8s.V1Pod]>,
): Promise<k8s.V1Pod[]> {
  const { core } = await kube();
  const runId = uniqueName("run");
  for (const [name, source] of pods) {
    const body = onRealNode(source, node, name, runId);
    await createReferenced(namespace, body);
    await core.createNamespacedPod({ namespace, body });
  }
  t.after(async () => {
    for (const [name] of pods)
      await core.deleteNamespacedPod({ namespace, name, gracePeriodSeconds: 0 }).catch(() => undefined);
  });
  return waitFor(
    `${pods.length} ready pods in ${namespace}`,
    async () => {
      const list = (await core.listNamespacedPod({ namespace, labelSelector: "real-charts=true" })).items;
      return list.length === pods.length && list.every(isPodReady) ? list : undefined;
    },
    READY_TIMEOUT_MS,
  );
}

/**
 * Runs corpus pods (file, then our name for each and its id there) on the real node in a fresh
 * namespace, until all are Ready; undefined (the test skipped) without a real node.
 */
async function runCorpus(
  t: TestContext,
  prefix: string,
  file: string,
  ids: Record<string, string>,
): Promise<{ node: RealNode; pods: k8s.V1Pod[]; before: HubStats } | undefined> {
  const node = await realNodeOrSkip(t);
  if (!node) return undefined;
  const ns = await tempNamespace(t, prefix);
  const c = corpus(file);
  const before = await hubStats(node);
  const pods = await run(
    t,
    node,
    ns,
    Object.entries(ids).map(([name, id]) => [name, c.get(id) as k8s.V1Pod]),
  );
  return { node, pods, before };
}

const role = (p: k8s.V1Pod): string | undefined => p.metadata?.annotations?.[ANN_ROLE];

/** Where the leader's engine put its weights. */
async function leaderDownloadDir(node: RealNode, pods: k8s.V1Pod[]): Promise<string | undefined> {
  const leader = pods.find((p) => role(p) === "leader") as k8s.V1Pod;
  return (await report(node, leader, mainName(leader))).downloadDir;
}
const hashOf = (p: k8s.V1Pod): string => p.metadata?.labels?.[LABEL_HASH] ?? "";

async function report(node: RealNode, pod: k8s.V1Pod, container: string): Promise<EngineReport> {
  const log = await containerLog(node, pod, container);
  const r = parseEngineReport(log);
  if (!r) throw new Error(`no engine report from ${pod.metadata?.name}/${container}:\n${log.slice(-2000)}`);
  return r;
}

const mainName = (pod: k8s.V1Pod): string =>
  pod.spec?.containers.find((c) => Object.keys(c.resources?.limits ?? {}).some((k) => GPU.test(k)))?.name ??
  "";

/** Bytes the hub served per repository since `before`. */
async function served(node: RealNode, before: HubStats, repo: string): Promise<number> {
  return ((await hubStats(node)).repos[repo]?.bytes ?? 0) - (before.repos[repo]?.bytes ?? 0);
}

/**
 * Pods of one hash: one leader that downloaded, the rest restored (init containers seeded the
 * tree), each restored engine fetching nothing and finding its compile cache.
 */
async function assertOneDownload(node: RealNode, pods: k8s.V1Pod[], what: string): Promise<void> {
  assert.equal(new Set(pods.map(hashOf)).size, 1, `${what}: one hash`);
  const leaders = pods.filter((p) => role(p) === "leader");
  assert.equal(leaders.length, 1, `${what}: one leader (${pods.map(role).join(", ")})`);
  const { custom } = await kube();
  assert.equal(
    (await getModelCache(custom, hashOf(pods[0] as k8s.V1Pod)))?.status?.phase,
    "Ready",
    `${what}: cache Ready`,
  );
  for (const p of pods) {
    if (p === leaders[0]) continue;
    assert.ok(["follower", "restore"].includes(role(p) ?? ""), `${p.metadata?.name} restored (${role(p)})`);
    const r = await report(node, p, mainName(p));
    assert.equal(r.fetchedBytes, 0, `${p.metadata?.name}: the engine fetched nothing`);
    assert.notEqual(
      r.compileCache,
      "rebuilt",
      `${p.metadata?.name}: found its compile cache (${r.compileDetail ?? ""})`,
    );
  }
}

test("vLLM production-stack (HF_HOME=/tmp): two replicas, one download into /tmp/hub, the other restored there", async (t) => {
  const ran = await runCorpus(t, "prodstack", "vllm-production-stack/minimal-opt125m-hf-home-tmp.yaml", {
    "engine-a": "engine-a",
    "engine-b": "engine-b",
  });
  if (!ran) return;
  const { node, pods, before } = ran;
  await assertOneDownload(node, pods, "production-stack");
  const leader = pods.find((p) => role(p) === "leader") as k8s.V1Pod;
  const r = await report(node, leader, mainName(leader));
  assert.ok(
    r.downloadDir?.startsWith("/tmp/hub"),
    `the leader's engine wrote where its chart says: ${r.downloadDir}`,
  );
  const repo = r.model;
  assert.equal(
    await served(node, before, repo),
    await modelBytes(node, repo),
    "one model's worth from the hub",
  );
});

test("llm-d modelservice: prefill and decode of one model share one download on their own emptyDir", async (t) => {
  const ran = await runCorpus(t, "llmd", "llm-d/pd-opt125m.yaml", { prefill: "prefill", decode: "decode" });
  if (!ran) return;
  await assertOneDownload(ran.node, ran.pods, "llm-d prefill and decode");
  const dir = await leaderDownloadDir(ran.node, ran.pods);
  assert.ok(dir?.startsWith("/model-cache/"), `downloaded into the chart's emptyDir: ${dir}`);
});

test("KServe with hf:// storageUri: two services of two models never share a tree; a replica restores with its initializer fetching nothing", async (t) => {
  const ran = await runCorpus(t, "kserve", "kserve/isvc-hf-storageuri-two-models.yaml", {
    "llama3-a": "llama3-a",
    "llama3-b": "llama3-b",
    llama2: "llama2",
  });
  if (!ran) return;
  const { node, pods, before } = ran;
  const byName = (n: string): k8s.V1Pod => pods.find((p) => p.metadata?.name === n) as k8s.V1Pod;
  assert.notEqual(hashOf(byName("llama3-a")), hashOf(byName("llama2")), "two models, two hashes");
  await assertOneDownload(node, [byName("llama3-a"), byName("llama3-b")], "llama3 replicas");
  assert.equal(role(byName("llama2")), "leader", "the other model is its own election");
  for (const p of pods) {
    const init = await report(node, p, "storage-initializer");
    const restored = role(p) !== "leader";
    assert.equal(
      init.fetchedBytes === 0,
      restored,
      `${p.metadata?.name}: the initializer fetched ${init.fetchedBytes} B`,
    );
  }
  for (const repo of ["meta-llama/meta-llama-3-8b-instruct", "meta-llama/Llama-2-7b-chat-hf"])
    assert.equal(await served(node, before, repo), await modelBytes(node, repo), `${repo}: one download`);
});

test("nim-llm StatefulSet: two replicas of one NIM, one profile downloaded into NIM_CACHE_PATH", async (t) => {
  const ran = await runCorpus(t, "nim", "nim-llm/sts-emptydir-gpu-count.yaml", {
    "my-nim-0": "gpu1-0",
    "my-nim-1": "gpu1-1",
  });
  if (!ran) return;
  await assertOneDownload(ran.node, ran.pods, "NIM replicas");
  const dir = await leaderDownloadDir(ran.node, ran.pods);
  assert.ok(dir?.startsWith("/model-store/"), `into the chart's NIM_CACHE_PATH: ${dir}`);
});

test("LeaderWorkerSet: the leaders of group 0 and group 1 share one download", async (t) => {
  const ran = await runCorpus(t, "lws", "lws/sglang-multinode.yaml", {
    "sglang-0": "leader-group0",
    "sglang-1": "leader-group1",
  });
  if (!ran) return;
  await assertOneDownload(ran.node, ran.pods, "LWS group leaders");
});
