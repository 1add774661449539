/**
 * Node agents in tests: a simulated node of the test's own (its kubelet root and store in a
 * temporary folder), an in-process agent for it talking to the API server through a fault proxy,
 * leaders whose warmed cache is written where the kubelet keeps their emptyDir, and the cache
 * record and claims they lead to.
 */
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import * as k8s from "@kubernetes/client-node";
import { gpuContainer, isPodReady, kube, uniqueName, waitFor } from "./harness.js";
import { FaultProxy } from "./fault-proxy.js";
import {
  ANN_REASON,
  ANN_ROLE,
  CACHE_VOLUME,
  LABEL_HASH,
  MODELCACHE,
  claimName,
} from "../src/core/contract.js";
import { SYSTEM_NAMESPACE, isNotFound } from "../src/common/kube.js";
import { createLogger } from "../src/common/log.js";
import { ensureSimulatedNode } from "../tools/localcluster/nodes.js";
import { NodeAgent, type NodeAgentHooks } from "../src/node-agent/agent.js";
import { loadNodeAgentConfig } from "../src/node-agent/config.js";
import { emptyDirPath } from "../src/node-agent/store.js";
import type { ModelCacheObject } from "../src/common/modelcache.js";

export const MANUAL_READY = "sim.warmstart.dev/manual-ready";
export const READY = "sim.warmstart.dev/ready";
export const mergePatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
export const mcRef = { group: MODELCACHE.group, version: MODELCACHE.version, plural: MODELCACHE.plural };

export interface Tree {
  files: number;
  modelFiles: number;
  modelBytes: number;
  cacheBytes: number;
}

/** A warmed cache root: a hub model (blobs, a snapshot symlink, refs) under model/, compile caches under cache/. */
export async function writeCacheTree(root: string): Promise<Tree> {
  const weights = randomBytes(2 * 1024 * 1024 + 17);
  const config = Buffer.from('{"model_type":"llama"}\n');
  const sha = (b: Buffer): string => createHash("sha256").update(b).digest("hex");
  const hub = "model/hub/models--org--m";
  const model: [string, Buffer][] = [
    [`${hub}/blobs/${sha(weights)}`, weights],
    [`${hub}/blobs/${sha(config)}`, config],
    [`${hub}/refs/main`, Buffer.from("rev1")],
  ];
  const cache: [string, Buffer][] = [
    ["cache/triton/abc/kernel.cubin", randomBytes(64 * 1024)],
    ["cache/torchinductor/fx/graph.py", Buffer.from("def graph(): pass\n")],
  ];
  for (const [rel, body] of [...model, ...cache]) {
    await mkdir(dirname(join(root, rel)), { recursive: true });
    await writeFile(join(root, rel), body);
  }
  await mkdir(join(root, `${hub}/snapshots/rev1`), { recursive: true });
  await symlink(`../../blobs/${sha(weights)}`, join(root, `${hub}/snapshots/rev1/model.safetensors`));
  const bytes = (xs: [string, Buffer][]): number => xs.reduce((n, [, b]) => n + b.length, 0);
  return {
    files: model.length + cache.length,
    modelFiles: model.length,
    modelBytes: bytes(model),
    cacheBytes: bytes(cache),
  };
}

export function workerPod(
  name: string,
  model: string,
  opts: { manualReady?: boolean; node?: string } = {},
): k8s.V1Pod {
  return {
    metadata: { name, ...(opts.manualReady ? { annotations: { [MANUAL_READY]: "true" } } : {}) },
    spec: {
      containers: [gpuContainer("vllm", ["--model", model, "--tensor-parallel-size", "1"])],
      ...(opts.node ? { nodeSelector: { "kubernetes.io/hostname": opts.node } } : {}),
    },
  };
}

export async function createPod(namespace: string, pod: k8s.V1Pod): Promise<k8s.V1Pod> {
  const { core } = await kube();
  return core.createNamespacedPod({ namespace, body: pod });
}

export async function readPod(namespace: string, name: string): Promise<k8s.V1Pod> {
  const { core } = await kube();
  return core.readNamespacedPod({ namespace, name });
}

export async function getCache(short: string): Promise<ModelCacheObject | undefined> {
  const { custom } = await kube();
  try {
    return (await custom.getClusterCustomObject({ ...mcRef, name: short })) as ModelCacheObject;
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

export const ignoreNotFound = (err: unknown): void => {
  if (!isNotFound(err)) throw err;
};

/** Everything cluster-scoped (and on disk) a test's cache leaves behind goes with the test. */
export function cleanupCache(
  t: { after: (fn: () => Promise<void>) => void },
  short: string,
  stores: string[],
): void {
  t.after(async () => {
    const { core, coordination, custom } = await kube();
    await coordination
      .deleteNamespacedLease({ name: `warmstart-capture-${short}`, namespace: SYSTEM_NAMESPACE })
      .catch(ignoreNotFound);
    await custom.deleteClusterCustomObject({ ...mcRef, name: short }).catch(ignoreNotFound);
    // The finalizers are honoured by the agents and the server; a test's agent may be gone first.
    await custom
      .patchClusterCustomObject(
        { ...mcRef, name: short, body: { metadata: { finalizers: null } } },
        mergePatch,
      )
      .catch(ignoreNotFound);
    const pvs = await core.listPersistentVolume({ labelSelector: `${LABEL_HASH}=${short}` });
    for (const pv of pvs.items)
      await core.deletePersistentVolume({ name: pv.metadata!.name! }).catch(ignoreNotFound);
    for (const s of stores) await rm(join(s, short), { recursive: true, force: true });
  });
}

/** Waits until the pod is bound to a node and has its UID; returns it. */
export async function bound(namespace: string, name: string): Promise<k8s.V1Pod> {
  return waitFor(`${namespace}/${name} bound to a node`, async () => {
    const p = await readPod(namespace, name);
    return p.spec?.nodeName && p.status?.phase === "Running" ? p : undefined;
  });
}

export async function makeReady(namespace: string, name: string): Promise<number> {
  const { core } = await kube();
  await core.patchNamespacedPod(
    { namespace, name, body: { metadata: { annotations: { [READY]: "true" } } } },
    mergePatch,
  );
  // Poll tightly: this is the start of the measured interval.
  for (;;) {
    if (isPodReady(await readPod(namespace, name))) return Date.now();
    await sleep(20);
  }
}

/** Polls the cache until `until` holds; records every phase seen on the way. */
export async function watchCache(
  short: string,
  until: (c: ModelCacheObject) => boolean,
  timeoutMs = 60_000,
): Promise<{ cache: ModelCacheObject; at: number; phases: string[] }> {
  const phases: string[] = [];
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const c = await getCache(short);
    const phase = c?.status?.phase;
    if (phase && phases[phases.length - 1] !== phase) phases.push(phase);
    if (c && until(c)) return { cache: c, at: Date.now(), phases };
    if (Date.now() > deadline)
      throw new Error(
        `ModelCache ${short}: timed out; phases seen ${phases.join(" → ") || "none"}; status ${JSON.stringify(c?.status)}`,
      );
    await sleep(25);
  }
}

export async function claimIn(
  namespace: string,
  short: string,
): Promise<k8s.V1PersistentVolumeClaim | undefined> {
  const { core } = await kube();
  return core
    .readNamespacedPersistentVolumeClaim({ namespace, name: claimName(short) })
    .catch((err: unknown) => {
      ignoreNotFound(err);
      return undefined;
    });
}

export interface TestAgent {
  agent: NodeAgent;
  node: string;
  kubeletRoot: string;
  store: string;
  proxy: FaultProxy;
}

export async function testNode(t: {
  after: (fn: () => Promise<void>) => void;
}): Promise<{ node: string; kubeletRoot: string; store: string }> {
  const { core } = await kube();
  const node = uniqueName("wt");
  const dir = await mkdtemp(join(tmpdir(), `ws-${node}-`));
  const kubeletRoot = join(dir, "kubelet");
  await mkdir(join(kubeletRoot, "pods"), { recursive: true });
  await ensureSimulatedNode(core, { name: node, gpus: 4, kubeletRoot });
  await waitFor(`node ${node} Ready`, async () => {
    const n = await core.readNode({ name: node });
    return n.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True");
  });
  t.after(async () => {
    await core.deleteNode({ name: node }).catch(ignoreNotFound);
    await rm(dir, { recursive: true, force: true });
  });
  return { node, kubeletRoot, store: join(dir, "store") };
}

export async function startAgent(
  t: { after: (fn: () => Promise<void>) => void },
  where: { node: string; kubeletRoot: string; store: string },
  overrides: Record<string, unknown> = {},
  proxy?: FaultProxy,
  hooks?: NodeAgentHooks,
): Promise<TestAgent> {
  const { kc } = await kube();
  const p = proxy ?? (await FaultProxy.start(kc));
  const cfg = loadNodeAgentConfig(
    {
      ...where,
      warmupMs: "1s",
      resyncMs: "10m",
      claimAttempts: 4,
      claimBackoffMs: "50ms",
      durable: false,
      port: 0,
      ...overrides,
    },
    {},
  );
  const agent = new NodeAgent({
    cfg,
    kc: p.kubeConfig(),
    log: createLogger(`node-agent-${where.node}`, process.env.LOG_LEVEL ?? "warn"),
    ...(hooks ? { hooks } : {}),
  });
  await agent.start();
  t.after(async () => {
    await agent.stop();
    if (!proxy) await p.close();
  });
  await waitFor("the agent's pod watch", () => agent.health().ready);
  return { agent, ...where, proxy: p };
}

/** A leader on the test node with its cache written, made Ready. */
export async function readyLeader(
  ta: TestAgent,
  namespace: string,
  name: string,
  model: string,
): Promise<{ pod: k8s.V1Pod; tree: Tree; readyAt: number }> {
  const created = await createPod(namespace, workerPod(name, model, { manualReady: true, node: ta.node }));
  assert.equal(
    created.metadata?.annotations?.[ANN_ROLE],
    "leader",
    created.metadata?.annotations?.[ANN_REASON],
  );
  const pod = await bound(namespace, name);
  assert.equal(pod.spec?.nodeName, ta.node);
  const tree = await writeCacheTree(emptyDirPath(ta.kubeletRoot, pod.metadata!.uid!, CACHE_VOLUME));
  const readyAt = await makeReady(namespace, name);
  return { pod, tree, readyAt };
}

export const metric = async (agent: NodeAgent, name: string, labels: string): Promise<number> => {
  const text = await agent.metrics.registry.metrics();
  const prefix = labels ? `${name}{${labels}} ` : `${name} `;
  const line = text.split("\n").find((l) => l.startsWith(prefix));
  return line ? Number(line.split(" ").pop()) : 0;
};
