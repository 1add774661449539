/**
 * Never deadlock a gang (SPEC 1.3 "Groups and gangs"), on the local cluster's real nodes with
 * Kubernetes' own gang scheduling (the Workload API, `cluster up` switches it on): gang members
 * and the ranks of a multi-node group are never gated; they wait running, and their node's agent
 * fills their tree once their cache is Ready. Plain replicas on the default scheduler still gate.
 */
import assert from "node:assert/strict";
import { test, type TestContext } from "node:test";
import * as k8s from "@kubernetes/client-node";
import { getModelCache } from "../../src/common/modelcache.js";
import {
  ANN_REASON,
  ANN_ROLE,
  INIT_PREWARM,
  INIT_SEED,
  LABEL_GATED,
  LABEL_HASH,
  LABEL_WAITING,
  SCHEDULING_GATE,
} from "../../src/core/contract.js";
import { seedOutcome } from "../../src/core/waiting.js";
import { engineDeployment } from "../../tools/localcluster/engine-chart.js";
import { REAL_NODE_LABEL, REAL_NODE_TAINT } from "../../tools/localcluster/realnode.js";
import {
  cleanupHash,
  createRaw,
  gpuContainer,
  isPodReady,
  kube,
  listPods,
  tempNamespace,
  uniqueName,
  waitFor,
} from "../harness.js";
import {
  engineReport,
  hubStats,
  initExits,
  modelBytes,
  realNodeOrSkip,
  realNodesOrSkip,
  serveStoreDriver,
  type RealNode,
} from "../realnode.js";

const READY_MS = 300_000;
const role = (p: k8s.V1Pod): string | undefined => p.metadata?.annotations?.[ANN_ROLE];
const gated = (p: k8s.V1Pod): boolean =>
  (p.spec?.schedulingGates ?? []).some((g) => g.name === SCHEDULING_GATE);

/**
 * Every pod of the namespace as the API server admitted it (the first event a watch sees of it):
 * a gate taken off later would hide that it was ever gated.
 */
async function admittedPods(t: TestContext, namespace: string): Promise<Map<string, k8s.V1Pod>> {
  const { kc } = await kube();
  const seen = new Map<string, k8s.V1Pod>();
  const req = await new k8s.Watch(kc).watch(
    `/api/v1/namespaces/${namespace}/pods`,
    {},
    (_type: string, pod: k8s.V1Pod) => {
      if (pod.metadata?.uid && !seen.has(pod.metadata.uid)) seen.set(pod.metadata.uid, pod);
    },
    () => undefined,
  );
  t.after(() => req.abort());
  return seen;
}

/** A Workload whose one pod group is a gang of `minCount` (scheduling.k8s.io/v1alpha1, Kubernetes 1.35). */
async function gangWorkload(namespace: string, name: string, minCount: number): Promise<void> {
  const { custom } = await kube();
  await custom.createNamespacedCustomObject({
    group: "scheduling.k8s.io",
    version: "v1alpha1",
    namespace,
    plural: "workloads",
    body: {
      apiVersion: "scheduling.k8s.io/v1alpha1",
      kind: "Workload",
      metadata: { name },
      spec: { podGroups: [{ name: "engines", policy: { gang: { minCount } } }] },
    },
  });
}

async function readyPods(namespace: string, selector: string, n: number): Promise<k8s.V1Pod[]> {
  return waitFor(
    `${n} Ready pods ${selector} in ${namespace}`,
    async () => {
      const ps = (await listPods(namespace, selector)).filter((p) => !p.metadata?.deletionTimestamp);
      return ps.length === n && ps.every(isPodReady) ? ps : undefined;
    },
    READY_MS,
  );
}

/** A restored waiting follower: its seed waited for the fill and restored, its engine fetched nothing. */
async function assertFilled(node: RealNode, pod: k8s.V1Pod, container = "engine"): Promise<void> {
  const name = pod.metadata?.name;
  assert.equal(seedOutcome(pod)?.outcome, "restored", `${name}: its seed restored the filled tree`);
  assert.deepEqual(initExits(pod), { [INIT_SEED]: 0, [INIT_PREWARM]: 0 }, `${name}: init containers`);
  const r = await engineReport(node, pod, container);
  assert.equal(r.fetchedBytes, 0, `${name} fetched nothing from the hub`);
  assert.equal(r.compileCache, "hit", `${name} found its compile cache (${r.compileDetail ?? ""})`);
}

test("a gang of 3 engines of one model (Kubernetes' Workload API) starts on a real node: no member ever gated, one download", async (t) => {
  const node = await realNodeOrSkip(t);
  if (!node) return;
  const { apps } = await kube();
  const ns = await tempNamespace(t, "gang");
  const admitted = await admittedPods(t, ns);
  const model = `synthetic/${uniqueName("gang")}`;
  await gangWorkload(ns, "engines", 3);
  const body = engineDeployment({
    replicas: 3,
    model,
    node: node.name,
    hub: node.hub,
    image: node.images.engine,
    compileSeconds: 1,
  });
  // The gang: the scheduler places the three together or none (its GangScheduling plugin).
  (body.spec!.template.spec as unknown as Record<string, unknown>).workloadRef = {
    name: "engines",
    podGroup: "engines",
  };
  await createRaw(`/apis/apps/v1/namespaces/${ns}/deployments`, body);
  t.after(() =>
    apps
      .deleteNamespacedDeployment({ namespace: ns, name: "engine", gracePeriodSeconds: 0 })
      .catch(() => undefined),
  );

  const pods = await readyPods(ns, "app=engine", 3);
  assert.equal(admitted.size, 3, "three pods, none replaced");
  for (const p of admitted.values()) {
    assert.ok(!gated(p), `${p.metadata?.name} was admitted without the cache-ready gate`);
    assert.equal(p.metadata?.labels?.[LABEL_GATED], undefined);
  }
  const leader = pods.find((p) => role(p) === "leader");
  const followers = pods.filter((p) => p !== leader);
  assert.ok(leader, `a leader among ${pods.map(role).join(", ")}`);
  for (const f of followers) {
    assert.equal(role(f), "follower");
    assert.equal(f.metadata?.labels?.[LABEL_WAITING], "true");
    assert.match(
      f.metadata?.annotations?.[ANN_REASON] ?? "",
      /waits running: gang member \(workload engines\/engines/,
    );
    await assertFilled(node, f);
  }
  assert.equal(
    (await hubStats(node)).repos[model]?.bytes,
    await modelBytes(node, model),
    "the hub served one model",
  );
});

test("a gang spread over three real nodes: the followers' nodes fill the tree from the leader's node, and nothing comes from the hub twice", async (t) => {
  const nodes = await realNodesOrSkip(t, 3);
  if (!nodes) return;
  await serveStoreDriver(t, nodes, { peers: true });
  const ns = await tempNamespace(t, "gang-spread");
  const admitted = await admittedPods(t, ns);
  const model = `synthetic/${uniqueName("spread")}`;
  await gangWorkload(ns, "engines", 3);
  const body = engineDeployment({
    replicas: 3,
    model,
    node: nodes[0]!.name,
    hub: nodes[0]!.hub,
    image: nodes[0]!.images.engine,
    compileSeconds: 1,
  });
  const spec = body.spec!.template.spec as k8s.V1PodSpec & Record<string, unknown>;
  spec.workloadRef = { name: "engines", podGroup: "engines" };
  spec.nodeSelector = { [REAL_NODE_LABEL]: "true" };
  // One per node, as a chart's topology spread puts them.
  spec.topologySpreadConstraints = [
    {
      maxSkew: 1,
      topologyKey: "kubernetes.io/hostname",
      whenUnsatisfiable: "DoNotSchedule",
      labelSelector: { matchLabels: { app: "engine" } },
    },
  ];
  await createRaw(`/apis/apps/v1/namespaces/${ns}/deployments`, body);
  const pods = await readyPods(ns, "app=engine", 3);
  for (const p of admitted.values()) assert.ok(!gated(p), `${p.metadata?.name} was never gated`);
  assert.equal(new Set(pods.map((p) => p.spec?.nodeName)).size, 3, "one per node");
  const leader = pods.find((p) => role(p) === "leader")!;
  for (const f of pods.filter((p) => p !== leader)) {
    const node = nodes.find((n) => n.name === f.spec?.nodeName)!;
    assert.notEqual(node.name, leader.spec?.nodeName);
    await assertFilled(node, f);
  }
  assert.equal((await hubStats(nodes[0]!)).repos[model]?.bytes, await modelBytes(nodes[0]!, model));
});

test("a 2-rank SGLang group (LWS) never waits on itself; a second group's ranks wait running and restore rank by rank", async (t) => {
  const node = await realNodeOrSkip(t);
  if (!node) return;
  const { core, custom } = await kube();
  const ns = await tempNamespace(t, "lws");
  const admitted = await admittedPods(t, ns);
  const model = `synthetic/${uniqueName("lws")}`;
  // Two groups of a LeaderWorkerSet `sg` (size 2), as its controller and webhook create their pods
  // (kubernetes-sigs/lws docs/examples/sglang/lws.yaml, test/corpus/lws/sglang-multinode.yaml).
  const rank = (group: number, worker: number): k8s.V1Pod => {
    const leaderName = `sg-${group}`;
    const name = worker === 0 ? leaderName : `${leaderName}-${worker}`;
    const lws = "leaderworkerset.sigs.k8s.io/";
    return {
      metadata: {
        name,
        labels: {
          app: "sg",
          [`${lws}name`]: "sg",
          [`${lws}worker-index`]: String(worker),
          [`${lws}group-index`]: String(group),
          "apps.kubernetes.io/pod-index": String(worker === 0 ? group : worker),
        },
        annotations: {
          [`${lws}size`]: "2",
          ...(worker === 0 ? {} : { [`${lws}leader-name`]: leaderName }),
        },
      },
      spec: {
        hostNetwork: true,
        nodeSelector: { "kubernetes.io/hostname": node.name },
        tolerations: [{ key: REAL_NODE_TAINT.key, operator: "Exists", effect: REAL_NODE_TAINT.effect }],
        terminationGracePeriodSeconds: 2,
        containers: [
          {
            ...gpuContainer("sglang", []),
            image: "lmsysorg/sglang:latest",
            imagePullPolicy: "IfNotPresent",
            command: [
              "python3",
              "-m",
              "sglang.launch_server",
              "--model-path",
              model,
              "--tp",
              "2",
              "--dist-init-addr",
              "$(LWS_LEADER_ADDRESS):20000",
              "--nnodes",
              "$(LWS_GROUP_SIZE)",
              "--node-rank",
              "$(LWS_WORKER_INDEX)",
            ],
            env: [
              { name: "LWS_LEADER_ADDRESS", value: `${leaderName}.sg.${ns}` },
              { name: "LWS_GROUP_SIZE", value: "2" },
              { name: "LWS_WORKER_INDEX", value: String(worker) },
              { name: "HF_ENDPOINT", value: node.hub },
            ],
            readinessProbe: { exec: { command: ["cat", "/tmp/engine-ready"] }, periodSeconds: 1 },
          },
        ],
      },
    };
  };
  const create = (p: k8s.V1Pod): Promise<k8s.V1Pod> => core.createNamespacedPod({ namespace: ns, body: p });
  // The first group, then the second while the first still downloads.
  const first = [await create(rank(0, 0)), await create(rank(0, 1))];
  const second = [await create(rank(1, 0)), await create(rank(1, 1))];
  assert.deepEqual(first.map(role), ["leader", "leader"], "the first group is elected as a whole");
  assert.notEqual(
    first[0]!.metadata!.labels![LABEL_HASH],
    first[1]!.metadata!.labels![LABEL_HASH],
    "one cache per rank",
  );
  for (const [k, p] of second.entries()) {
    assert.equal(role(p), "follower", `group 1 rank ${k}`);
    assert.equal(
      p.metadata?.labels?.[LABEL_HASH],
      first[k]!.metadata!.labels![LABEL_HASH],
      `rank ${k} follows rank ${k}`,
    );
    assert.equal(p.metadata?.labels?.[LABEL_WAITING], "true");
  }
  for (const p of admitted.values()) assert.ok(!gated(p), `${p.metadata?.name} was never gated`);

  const pods = await readyPods(ns, "app=sg", 4);
  for (const p of pods.filter((x) => x.metadata!.name!.startsWith("sg-1")))
    await assertFilled(node, p, "sglang");
  for (const p of first) {
    const cache = await getModelCache(custom, p.metadata!.labels![LABEL_HASH]!);
    assert.equal(cache?.status?.phase, "Ready");
    assert.equal(
      (cache?.spec.inputs as { rank?: string } | undefined)?.rank,
      p.metadata!.name === "sg-0" ? "0" : "1",
      "the rank is in the hash",
    );
  }
  assert.equal(
    (await hubStats(node)).repos[model]?.bytes,
    2 * (await modelBytes(node, model)),
    "the hub served the first group's two ranks, and nothing to the second",
  );
});

test("a waiting follower whose leader goes away starts cold at once, its decision saying why; nothing is evicted", async (t) => {
  const node = await realNodeOrSkip(t);
  if (!node) return;
  const { core } = await kube();
  const ns = await tempNamespace(t, "wait-cold");
  const model = `synthetic/${uniqueName("cold")}`;
  await gangWorkload(ns, "pair", 2);
  const engine = (name: string): k8s.V1Pod => {
    const d = engineDeployment({
      replicas: 1,
      model,
      node: node.name,
      hub: node.hub,
      image: node.images.engine,
      // Long enough for the leader to go before it is captured.
      compileSeconds: 20,
    });
    const spec = d.spec!.template.spec!;
    (spec as unknown as Record<string, unknown>).workloadRef = { name: "pair", podGroup: "engines" };
    return { metadata: { name, labels: { app: "pair" } }, spec };
  };
  const create = (body: k8s.V1Pod): Promise<k8s.V1Pod> => createRaw(`/api/v1/namespaces/${ns}/pods`, body);
  const leader = await create(engine("a"));
  const follower = await create(engine("b"));
  assert.deepEqual([role(leader), role(follower)], ["leader", "follower"]);
  assert.ok(!gated(follower));
  // Both placed (the gang), the follower's seed waiting: the leader goes.
  await waitFor(
    "the follower's seed to wait",
    async () => {
      const p = await core.readNamespacedPod({ namespace: ns, name: "b" });
      return p.status?.initContainerStatuses?.find((s) => s.name === INIT_SEED)?.state?.running !== undefined;
    },
    READY_MS,
  );
  const goneAt = Date.now();
  await core.deleteNamespacedPod({ namespace: ns, name: "a", gracePeriodSeconds: 0 });

  const b = await waitFor(
    "the follower Ready, settled cold",
    async () => {
      const p = await core.readNamespacedPod({ namespace: ns, name: "b" });
      return isPodReady(p) && role(p) === "cold" ? p : undefined;
    },
    READY_MS,
  );
  assert.equal(b.metadata?.uid, follower.metadata?.uid, "the same pod: never evicted");
  const outcome = seedOutcome(b);
  assert.equal(outcome?.outcome, "cold");
  assert.match(outcome?.reason ?? "", /election of cache [0-9a-f]{16} failed: LeaderGone/);
  assert.ok((outcome?.waitedMs ?? Infinity) < Date.now() - goneAt + 60_000, "it stopped waiting soon after");
  assert.match(b.metadata?.annotations?.[ANN_REASON] ?? "", /then started cold: the election of cache/);
  const r = await engineReport(node, b);
  assert.ok(r.fetchedBytes > 0, "it downloaded for itself");
  const events = await core.listNamespacedEvent({ namespace: ns, fieldSelector: "involvedObject.name=b" });
  assert.ok(
    events.items.some((e) => e.reason === "WarmstartCold"),
    `a WarmstartCold Event: ${events.items.map((e) => e.reason).join(", ")}`,
  );
});

test("plain replicas on the default scheduler still gate: the follower holds no node and no GPU", async (t) => {
  const { core } = await kube();
  const ns = await tempNamespace(t, "plain");
  const model = `org/plain-${uniqueName("m")}`;
  const pod = (name: string): k8s.V1Pod => ({
    metadata: { name },
    // A leader that is never placed, so the follower's gate stays on.
    spec: {
      containers: [gpuContainer("vllm", ["--model", model])],
      nodeSelector: { "kubernetes.io/hostname": "nowhere" },
    },
  });
  const leader = await core.createNamespacedPod({ namespace: ns, body: pod("leader") });
  const follower = await core.createNamespacedPod({ namespace: ns, body: pod("follower") });
  await cleanupHash(t, leader.metadata!.labels![LABEL_HASH]!);
  assert.equal(role(follower), "follower");
  assert.ok(gated(follower), "gated");
  assert.equal(follower.metadata?.labels?.[LABEL_GATED], "true");
  assert.equal(follower.metadata?.labels?.[LABEL_WAITING], undefined);
  assert.match(follower.metadata?.annotations?.[ANN_REASON] ?? "", /gated: nothing waits for it/);
  const later = await core.readNamespacedPod({ namespace: ns, name: "follower" });
  assert.equal(later.spec?.nodeName, undefined, "no node");
});
