/**
 * The node-store backend on a real kubelet (SPEC 1.5, ADR 0011): the node agent serves
 * `store.warmstart.dev` and registers it with the kubelet's plugin watcher; a cache's restore
 * claims name the driver with the full hash as handle and no node affinity, and the kubelet
 * publishes them through the node agent: a read-only bind of the committed tree. A pod that mounts
 * the claim by hand, as root and without `readOnly`, cannot write it.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import { getModelCache } from "../../src/common/modelcache.js";
import { ANN_ROLE, LABEL_HASH, READY_MARKER, claimName } from "../../src/core/contract.js";
import { isPodReady, kube, listPods, tempNamespace, uniqueName, waitFor } from "../harness.js";
import {
  STORE_DRIVER,
  createEngines,
  engineReport,
  hubStats,
  modelBytes,
  mountByHand,
  realNodeOrSkip,
  serveStoreDriver,
} from "../realnode.js";

const READY_MS = 240_000;

test("node-store on a real kubelet: the restore's claim names store.warmstart.dev with no node affinity, the kubelet publishes it through the node agent, the follower fetches nothing; root cannot write a hand-made mount", async (t) => {
  const node = await realNodeOrSkip(t);
  if (!node) return;
  const { core, custom } = await kube();
  await serveStoreDriver(t, [node], { peers: true });

  const ns = await tempNamespace(t, "nstore");
  const model = `synthetic/${uniqueName("m")}`;
  const before = await hubStats(node);
  await createEngines(t, node, ns, { replicas: 2, model });
  const pods = await waitFor(
    "2 Ready engine pods",
    async () => {
      const ps = (await listPods(ns, "app=engine")).filter((p) => !p.metadata?.deletionTimestamp);
      return ps.length === 2 && ps.every(isPodReady) ? ps : undefined;
    },
    READY_MS,
  );
  const follower = pods.find((p) => p.metadata?.annotations?.[ANN_ROLE] === "follower")!;
  assert.ok(follower, `a follower: ${pods.map((p) => p.metadata?.annotations?.[ANN_ROLE]).join(", ")}`);
  const short = follower.metadata!.labels![LABEL_HASH]!;
  const cache = await getModelCache(custom, short);
  assert.equal(cache?.status?.backend, "node-store", "a node-local store behind the driver is node-store");

  const claim = await core.readNamespacedPersistentVolumeClaim({ name: claimName(short), namespace: ns });
  const pv = await core.readPersistentVolume({ name: claim.spec!.volumeName! });
  assert.equal(pv.spec?.csi?.driver, STORE_DRIVER);
  assert.equal(pv.spec?.csi?.volumeHandle, cache.spec.hash, "handle = the full hash");
  assert.deepEqual(pv.spec?.accessModes, ["ReadOnlyMany"]);
  assert.equal(pv.spec?.nodeAffinity, undefined, "no node affinity: a follower may run on any node");

  const report = await engineReport(node, follower);
  assert.equal(report.fetchedBytes, 0, "the follower fetched nothing");
  assert.equal(report.compileCache, "hit", "and found its compile cache");
  const served = (await hubStats(node)).repos[model]?.bytes ?? 0;
  assert.equal(served - (before.repos[model]?.bytes ?? 0), await modelBytes(node, model), "one download");

  const byHand = await mountByHand(t, node, ns, claimName(short));
  assert.ok(
    byHand.entries.includes(READY_MARKER),
    `the tree itself at the mount: ${byHand.entries.join(", ")}`,
  );
  assert.match(
    byHand.write,
    /Read-only file system \(30\)/,
    "root cannot write a claim mounted without readOnly",
  );
});
