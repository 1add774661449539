/**
 * Every node starts warm (SPEC 1.5 node-store, "Replication between nodes"): on two real kubelet
 * nodes whose agents serve store.warmstart.dev and their committed trees to each other, a chart's
 * replicas spread over both nodes download the model once; the follower lands on the node that
 * does not hold the tree, and its kubelet's publish has that node's agent fill the tree from the
 * leader's node (checked against the record's digest) before mounting it read-only.
 */
import assert from "node:assert/strict";
import { readdir } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { getModelCache } from "../../src/common/modelcache.js";
import { ANN_ROLE, LABEL_HASH, MANIFEST_FILE, READY_MARKER } from "../../src/core/contract.js";
import { engineDeployment } from "../../tools/localcluster/engine-chart.js";
import { REAL_NODE_LABEL } from "../../tools/localcluster/realnode.js";
import { isPodReady, kube, listPods, tempNamespace, uniqueName, waitFor } from "../harness.js";
import { engineReport, hubStats, modelBytes, realNodesOrSkip, serveStoreDriver } from "../realnode.js";

const READY_MS = 300_000;

test("two real nodes: replicas spread over both download once; the follower's node fills the tree from the leader's node through its store driver, fetches nothing from the hub and joins status.replicas", async (t) => {
  const nodes = await realNodesOrSkip(t, 2);
  if (!nodes) return;
  const { apps, custom } = await kube();
  await serveStoreDriver(t, nodes, { peers: true });

  const ns = await tempNamespace(t, "spread");
  const model = `synthetic/${uniqueName("m")}`;
  const body = engineDeployment({
    replicas: 2,
    model,
    node: nodes[0]!.name,
    hub: nodes[0]!.hub,
    image: nodes[0]!.images.engine,
    compileSeconds: 1,
  });
  // Spread over the real nodes, one replica each, as a chart's anti-affinity or topology spread does.
  const spec = body.spec!.template.spec!;
  spec.nodeSelector = { [REAL_NODE_LABEL]: "true" };
  spec.affinity = {
    podAntiAffinity: {
      requiredDuringSchedulingIgnoredDuringExecution: [
        { topologyKey: "kubernetes.io/hostname", labelSelector: { matchLabels: { app: "engine" } } },
      ],
    },
  };
  await apps.createNamespacedDeployment({ namespace: ns, body });
  t.after(() =>
    apps
      .deleteNamespacedDeployment({ namespace: ns, name: body.metadata!.name!, gracePeriodSeconds: 0 })
      .then(() => undefined)
      .catch(() => undefined),
  );
  const pods = await waitFor(
    "2 Ready engine pods on two nodes",
    async () => {
      const ps = (await listPods(ns, "app=engine")).filter((p) => !p.metadata?.deletionTimestamp);
      return ps.length === 2 && ps.every(isPodReady) ? ps : undefined;
    },
    READY_MS,
  );
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
