/**
 * Every node starts warm (SPEC 1.5 node-store, "Replication between nodes"): on two real kubelet
 * nodes whose agents serve store.warmstart.dev and their committed trees to each other, a chart's
 * replicas spread over both nodes download the model once; the follower lands on the node that
 * does not hold the tree, and its kubelet's publish has that node's agent fill the tree from the
 * leader's node (checked against the record's digest) before mounting it read-only.
 */
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { open, readFile, readdir, stat } from "node:fs/promises";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { getModelCache, type ModelCacheObject } from "../../src/common/modelcache.js";
import { ANN_ROLE, LABEL_HASH, MANIFEST_FILE, READY_MARKER } from "../../src/core/contract.js";
import { DEFAULT_CHUNK_BYTES } from "../../src/node-agent/replication/plan.js";
import { engineDeployment } from "../../tools/localcluster/engine-chart.js";
import { readState } from "../../tools/localcluster/cluster.js";
import { REAL_NODE_LABEL } from "../../tools/localcluster/realnode.js";
import { isPodReady, kube, listPods, tempNamespace, uniqueName, waitFor } from "../harness.js";
import {
  engineReport,
  hubStats,
  modelBytes,
  mountByHand,
  realNodesOrSkip,
  serveStoreDriver,
  shapeLinks,
  type RealNode,
} from "../realnode.js";

const READY_MS = 300_000;

test("two real nodes: replicas spread over both download once; the follower's node fills the tree from the leader's node through its store driver, fetches nothing from the hub and joins status.replicas", async (t) => {
  const nodes = await realNodesOrSkip(t, 2);
  if (!nodes) return;
  const { custom } = await kube();
  const two = nodes.slice(0, 2);
  await serveStoreDriver(t, two, { peers: true });

  const ns = await tempNamespace(t, "spread");
  const model = `synthetic/${uniqueName("m")}`;
  // Spread over two real nodes, one replica each, as a chart's topology spread does.
  await deploy(
    t,
    ns,
    engines(
      two,
      model,
      2,
      two.map((n) => n.name),
    ),
  );
  const pods = await readyEngines(ns, 2);
  const leader = pods.find((p) => p.metadata?.annotations?.[ANN_ROLE] === "leader")!;
  const follower = pods.find((p) => p !== leader)!;
  assert.ok(leader, "a leader");
  assert.notEqual(follower.spec?.nodeName, leader.spec?.nodeName, "the replicas run on two nodes");
  const there = nodes.find((n) => n.name === follower.spec?.nodeName)!;
  const short = leader.metadata!.labels![LABEL_HASH]!;

  const cache = await waitFor(
    "both nodes' copies on the record",
    async () => {
      const c = await getModelCache(custom, short);
      return Object.keys(c?.status?.replicas ?? {}).length === 2 ? c : undefined;
    },
    60_000,
  );
  t.diagnostic(`replicas: ${JSON.stringify(cache.status?.replicas)}`);
  assert.equal(cache.status?.backend, "node-store");
  assert.equal(cache.status?.node, leader.spec?.nodeName, "captured on the leader's node");
  const filled = await readdir(join(there.kubeletRoot, "..", "store", short));
  assert.ok(
    filled.includes(MANIFEST_FILE) && filled.includes(READY_MARKER),
    `a committed copy: ${filled.join(", ")}`,
  );

  const report = await engineReport(there, follower);
  assert.equal(report.fetchedBytes, 0, "the follower fetched nothing from the hub");
  assert.equal(report.compileCache, "hit", "and found its compile cache");
  assert.equal(
    (await hubStats(there)).repos[model]?.bytes,
    await modelBytes(there, model),
    "the hub was asked once",
  );
});

// ---------------------------------------------------------------------------------------------
// Three real nodes (SPEC 1.5 "Replication between nodes"): a chart spread over every node, a
// source killed mid-fill, a source that lies.

const storeOf = (node: RealNode): string => join(node.kubeletRoot, "..", "store");

/** The engine chart's pods on the real nodes; `only` narrows them to some nodes. */
function engines(nodes: RealNode[], model: string, replicas: number, only?: string[]): k8s.V1Deployment {
  const body = engineDeployment({
    replicas,
    model,
    node: nodes[0]!.name,
    hub: nodes[0]!.hub,
    image: nodes[0]!.images.engine,
    compileSeconds: 1,
  });
  const spec = body.spec!.template.spec!;
  spec.nodeSelector = { [REAL_NODE_LABEL]: "true" };
  if (only)
    spec.affinity = {
      nodeAffinity: {
        requiredDuringSchedulingIgnoredDuringExecution: {
          nodeSelectorTerms: [
            { matchExpressions: [{ key: "kubernetes.io/hostname", operator: "In", values: only }] },
          ],
        },
      },
    };
  // Spread over the nodes as charts do: at most one replica more on any node than on another.
  spec.topologySpreadConstraints = [
    {
      maxSkew: 1,
      topologyKey: "kubernetes.io/hostname",
      whenUnsatisfiable: "DoNotSchedule",
      labelSelector: { matchLabels: { app: "engine" } },
    },
  ];
  return body;
}

async function deploy(t: TestContext, ns: string, body: k8s.V1Deployment): Promise<void> {
  const { apps } = await kube();
  await apps.createNamespacedDeployment({ namespace: ns, body });
  t.after(() =>
    apps
      .deleteNamespacedDeployment({ namespace: ns, name: body.metadata!.name!, gracePeriodSeconds: 0 })
      .then(() => undefined)
      .catch(() => undefined),
  );
}

async function readyEngines(ns: string, n: number): Promise<k8s.V1Pod[]> {
  return waitFor(
    `${n} Ready engine pods`,
    async () => {
      const ps = (await listPods(ns, "app=engine")).filter((p) => !p.metadata?.deletionTimestamp);
      return ps.length === n && ps.every(isPodReady) ? ps : undefined;
    },
    READY_MS,
  );
}

async function withCopies(short: string, nodes: string[]): Promise<ModelCacheObject> {
  const { custom } = await kube();
  return waitFor(
    `committed copies on ${nodes.join(", ")} in the record`,
    async () => {
      const c = await getModelCache(custom, short);
      return nodes.every((n) => c?.status?.replicas?.[n] && !c.status.replicas[n].filling) ? c : undefined;
    },
    READY_MS,
  );
}

/** sha256 of every file of a committed tree, by path (not its ready marker: each copy's own). */
async function treeDigests(dir: string, rel = ""): Promise<Record<string, string>> {
  const out: Record<string, string> = {};
  for (const e of await readdir(join(dir, rel), { withFileTypes: true })) {
    const path = join(rel, e.name);
    if (e.isDirectory()) Object.assign(out, await treeDigests(dir, path));
    else if (e.isFile() && path !== READY_MARKER)
      out[path] = createHash("sha256")
        .update(await readFile(join(dir, path)))
        .digest("hex");
  }
  return out;
}

/** The paths where two trees differ (missing on one side, or other bytes). */
function differences(a: Record<string, string>, b: Record<string, string>): string[] {
  return [...new Set([...Object.keys(a), ...Object.keys(b)])].filter((k) => a[k] !== b[k]);
}

/** What a node agent logged when its driver filled a tree from peers (its JSON log line). */
interface FillLog {
  bySource: Record<string, number>;
  dropped: { node: string; reason: string }[];
}
async function fillLog(node: RealNode, short: string): Promise<FillLog> {
  const rec = (await readState())!.processes.find((p) => p.name === `node-agent-${node.name}`)!;
  return waitFor(`the fill of ${short} in ${node.name}'s log`, async () => {
    const line = (await readFile(rec.log, "utf8"))
      .split("\n")
      .find((l) => l.includes('"replicated the tree from peers"') && l.includes(`"hash":"${short}"`));
    return line ? (JSON.parse(line) as FillLog) : undefined;
  });
}

/** One more replica, a pod of the chart's template alone on `node` (as a scale-up lands there). */
async function oneMoreOn(
  t: TestContext,
  ns: string,
  body: k8s.V1Deployment,
  node: RealNode,
): Promise<string> {
  const { core } = await kube();
  const name = uniqueName("engine-extra");
  const template = body.spec!.template;
  await core.createNamespacedPod({
    namespace: ns,
    body: {
      metadata: { name, labels: template.metadata!.labels },
      spec: { ...template.spec!, affinity: undefined, nodeSelector: { "kubernetes.io/hostname": node.name } },
    },
  });
  t.after(() =>
    core
      .deleteNamespacedPod({ namespace: ns, name, gracePeriodSeconds: 0 })
      .then(() => undefined)
      .catch(() => undefined),
  );
  return name;
}

/** The tree on two nodes (leader's and one follower's), the third node without it. */
async function onTwoNodes(
  t: TestContext,
  nodes: RealNode[],
  what: string,
): Promise<{ ns: string; body: k8s.V1Deployment; short: string; model: string; holders: RealNode[] }> {
  const ns = await tempNamespace(t, what);
  const model = `synthetic/${uniqueName("m")}`;
  const body = engines(nodes, model, 2, [nodes[0]!.name, nodes[1]!.name]);
  await deploy(t, ns, body);
  const pods = await readyEngines(ns, 2);
  const short = pods[0]!.metadata!.labels![LABEL_HASH]!;
  const cache = await withCopies(short, [nodes[0]!.name, nodes[1]!.name]);
  const leaderNode = nodes.find((n) => n.name === cache.status?.node)!;
  const other = nodes.find((n) => n !== leaderNode && n !== nodes[2])!;
  return { ns, body, short, model, holders: [leaderNode, other] };
}

test("three real nodes: a chart of 6 replicas spread over them downloads once; two nodes fill from their peers; every follower is Ready with 0 bytes fetched and its compile cache found; a root pod mounting the claim by hand cannot write it", async (t) => {
  const nodes = await realNodesOrSkip(t, 3);
  if (!nodes) return;
  await serveStoreDriver(t, nodes.slice(0, 3), { peers: true });
  const ns = await tempNamespace(t, "spread6");
  const model = `synthetic/${uniqueName("m")}`;
  await deploy(
    t,
    ns,
    engines(
      nodes,
      model,
      6,
      nodes.slice(0, 3).map((n) => n.name),
    ),
  );
  const pods = await readyEngines(ns, 6);

  const perNode = new Map<string, number>();
  for (const p of pods) perNode.set(p.spec!.nodeName!, (perNode.get(p.spec!.nodeName!) ?? 0) + 1);
  assert.deepEqual(
    [...perNode.values()],
    [2, 2, 2],
    `two replicas per node: ${JSON.stringify([...perNode])}`,
  );
  const leader = pods.find((p) => p.metadata?.annotations?.[ANN_ROLE] === "leader")!;
  assert.ok(leader, "a leader");
  const short = leader.metadata!.labels![LABEL_HASH]!;
  const cache = await withCopies(
    short,
    nodes.slice(0, 3).map((n) => n.name),
  );
  assert.equal(cache.status?.backend, "node-store");
  assert.equal(cache.status?.node, leader.spec?.nodeName, "captured on the leader's node");
  const filled = nodes.slice(0, 3).filter((n) => n.name !== leader.spec?.nodeName);
  assert.equal(filled.length, 2, "two nodes filled from their peers");
  const leaderTree = await treeDigests(
    join(storeOf(nodes.find((n) => n.name === leader.spec?.nodeName)!), short),
  );
  for (const n of filled) {
    const entries = await readdir(join(storeOf(n), short));
    assert.ok(
      entries.includes(MANIFEST_FILE) && entries.includes(READY_MARKER),
      `${n.name}: a committed copy`,
    );
    const copy = await treeDigests(join(storeOf(n), short));
    assert.deepEqual(differences(copy, leaderTree), [], `${n.name}: the leader's tree`);
  }
  for (const p of pods.filter((x) => x !== leader)) {
    const node: RealNode = nodes.find((n) => n.name === p.spec?.nodeName)!;
    const report = await engineReport(node, p);
    assert.equal(report.fetchedBytes, 0, `${p.metadata?.name} on ${node.name} fetched nothing from the hub`);
    assert.equal(report.compileCache, "hit", `${p.metadata?.name} found its compile cache`);
  }
  assert.equal(
    (await hubStats(nodes[0]!)).repos[model]?.bytes,
    await modelBytes(nodes[0]!, model),
    "the hub was asked once",
  );
  // The claim the followers mount, mounted by hand on a node that filled it: read-only for root.
  const byHand = await mountByHand(t, filled[0]!, ns, `rox-${short}`);
  assert.ok(byHand.entries.includes(READY_MARKER), `the tree itself: ${byHand.entries.join(", ")}`);
  assert.match(byHand.write, /Read-only file system/);
});

test("three real nodes: a source node agent killed while a third node fills mounts nothing half-made, and the fill completes from the other source", async (t) => {
  const nodes = await realNodesOrSkip(t, 3);
  if (!nodes) return;
  const agents = await serveStoreDriver(t, nodes.slice(0, 3), { peers: true });
  const { ns, body, short, model, holders } = await onTwoNodes(t, nodes, "kill-source");
  const [killed, survivor] = holders as [RealNode, RealNode];
  const third = nodes[2]!;
  // Slow links, so the fill takes seconds and the kill lands in its middle.
  await shapeLinks(t, nodes.slice(0, 3), 100);
  const { core } = await kube();
  const extra = await oneMoreOn(t, ns, body, third);
  const size = await modelBytes(third, model);
  const staged = await waitFor(
    `${third.name} to fill a tenth of the tree`,
    async () => {
      const tmp = (await readdir(storeOf(third))).find((e) => e.startsWith(`${short}.tmp-`));
      if (!tmp) return undefined;
      const bytes = await stagedBytes(join(storeOf(third), tmp));
      return bytes > size / 10 ? { tmp, bytes } : undefined;
    },
    120_000,
  );
  // Its progress is on the record, where peers find the copy and `warmstart caches` shows it.
  const { custom } = await kube();
  const progress = await waitFor(`${third.name}'s filling copy on the record`, async () => {
    const c = await getModelCache(custom, short);
    return c?.status?.replicas?.[third.name]?.filling;
  });
  assert.ok(progress.doneBytes > 0 && progress.doneBytes < progress.totalBytes, JSON.stringify(progress));
  const during = await core.readNamespacedPod({ namespace: ns, name: extra });
  await agents.get(killed.name)!.kill("SIGKILL");
  assert.notEqual(during.status?.phase, "Running", "nothing is mounted while the tree fills");
  t.diagnostic(`killed ${killed.name}'s agent with ${staged.bytes} of ${size} bytes staged on ${third.name}`);

  const pod = await waitFor(
    "the third node's replica Ready",
    async () => {
      const p = await core.readNamespacedPod({ namespace: ns, name: extra });
      return isPodReady(p) ? p : undefined;
    },
    READY_MS,
  );
  const fill = await fillLog(third, short);
  t.diagnostic(`fill: ${JSON.stringify(fill)}`);
  assert.ok((fill.bySource[survivor.name] ?? 0) > 0, "the rest came from the surviving source");
  assert.ok(
    fill.dropped.some((d) => d.node === killed.name),
    `the killed source was dropped: ${JSON.stringify(fill.dropped)}`,
  );
  // Committed, its entry is a copy like the others.
  await waitFor(`${third.name}'s committed copy on the record`, async () => {
    const r = (await getModelCache(custom, short))?.status?.replicas?.[third.name];
    return r && !r.filling;
  });
  const left = (await readdir(storeOf(third))).filter((e) => e.startsWith(`${short}.tmp-`));
  assert.deepEqual(left, [], "no staging left behind");
  assert.deepEqual(
    differences(
      await treeDigests(join(storeOf(third), short)),
      await treeDigests(join(storeOf(survivor), short)),
    ),
    [],
    "the committed tree is the leader's",
  );
  const report = await engineReport(third, pod);
  assert.equal(report.fetchedBytes, 0, "the replica fetched nothing from the hub");
  assert.equal(report.compileCache, "hit");
});

test("three real nodes: a peer serving a corrupted byte is caught by the digest, dropped, and its chunks fetched from the other source", async (t) => {
  const nodes = await realNodesOrSkip(t, 3);
  if (!nodes) return;
  await serveStoreDriver(t, nodes.slice(0, 3), { peers: true });
  const { ns, body, short, holders } = await onTwoNodes(t, nodes, "liar");
  const [honest, liar] = holders as [RealNode, RealNode];
  const third = nodes[2]!;
  const truth = await treeDigests(join(storeOf(honest), short));
  // The liar's copy: bytes flipped in every data file (its manifest still says the truth).
  const liarTree = join(storeOf(liar), short);
  for (const rel of Object.keys(truth)) {
    if (rel === MANIFEST_FILE) continue;
    const path = join(liarTree, rel);
    if ((await stat(path)).size === 0) continue;
    // In every chunk a peer may be asked for, so whatever the liar serves is wrong.
    const fh = await open(path, "r+");
    const b = Buffer.alloc(1);
    for (let at = 0; at < (await fh.stat()).size; at += DEFAULT_CHUNK_BYTES) {
      await fh.read(b, 0, 1, at);
      b[0] = b[0]! ^ 0xff;
      await fh.write(b, 0, 1, at);
    }
    await fh.close();
  }
  const { core } = await kube();
  const extra = await oneMoreOn(t, ns, body, third);
  await waitFor(
    "the third node's replica Ready",
    async () => isPodReady(await core.readNamespacedPod({ namespace: ns, name: extra })),
    READY_MS,
  );
  const fill = await fillLog(third, short);
  t.diagnostic(`fill: ${JSON.stringify(fill)}`);
  assert.ok(
    fill.dropped.some((d) => d.node === liar.name && d.reason === "corrupt"),
    `the liar was dropped for a corrupt chunk: ${JSON.stringify(fill.dropped)}`,
  );
  // Said as what it is: tampering, on the record, naming the node that served another tree.
  const tampered = await waitFor("a TreeTampered Warning on the record", async () => {
    const events = await core.listNamespacedEvent({
      namespace: "default",
      fieldSelector: `involvedObject.name=${short},reason=TreeTampered`,
    });
    return events.items.find((e) => e.message?.includes(liar.name));
  });
  assert.equal(tampered.type, "Warning");
  assert.equal(tampered.involvedObject.kind, "ModelCache");
  assert.deepEqual(
    differences(await treeDigests(join(storeOf(third), short)), truth),
    [],
    "the committed tree is the true one",
  );
});

/** Bytes written so far under a staging folder (its files are made at full size, sparse). */
async function stagedBytes(dir: string): Promise<number> {
  let n = 0;
  for (const e of await readdir(dir, { withFileTypes: true, recursive: true }).catch(() => [])) {
    if (!e.isFile()) continue;
    const st = await stat(join(e.parentPath ?? e.path, e.name)).catch(() => undefined);
    n += (st?.blocks ?? 0) * 512;
  }
  return n;
}
