/**
 * The restore path in real containers on the local cluster's real node (SPEC 1.5, 1.6, 4): a
 * chart of engine replicas downloads its model once from the local model hub; the followers'
 * init containers (seed, which first waits for the ready marker, and prewarm) run in the Warmstart image and their engines find
 * the model and the compile caches in place, fetching nothing.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { getModelCache } from "../../src/common/modelcache.js";
import {
  ANN_ROLE,
  INIT_PREWARM,
  INIT_SEED,
  LABEL_HASH,
  READY_MARKER,
  claimName,
  shortHash,
} from "../../src/core/contract.js";
import { isPodReady, kube, listPods, tempNamespace, uniqueName, waitFor } from "../harness.js";
import {
  containerLog,
  createEngines,
  engineReport,
  hubStats,
  initExits,
  modelBytes,
  mountByHand,
  realNodeOrSkip,
  type EngineChartOptions,
  type RealNode,
} from "../realnode.js";

const READY_TIMEOUT_MS = 240_000;

async function allReady(namespace: string, app: string, n: number): Promise<k8s.V1Pod[]> {
  return waitFor(
    `${n} ready ${app} pods in ${namespace}`,
    async () => {
      const pods = (await listPods(namespace, `app=${app}`)).filter((p) => !p.metadata?.deletionTimestamp);
      return pods.length === n && pods.every(isPodReady) ? pods : undefined;
    },
    READY_TIMEOUT_MS,
  );
}

const role = (p: k8s.V1Pod): string | undefined => p.metadata?.annotations?.[ANN_ROLE];

/** A restored pod ran every init container to success and its engine fetched nothing and found its caches. */
async function assertRestored(node: RealNode, pod: k8s.V1Pod): Promise<void> {
  const name = pod.metadata?.name;
  assert.deepEqual(initExits(pod), { [INIT_SEED]: 0, [INIT_PREWARM]: 0 }, `${name}: init containers`);
  // Prewarm ran after seed and looked only at the model files seed left in place. (A file the
  // hub client wrote private to the leader's UID is an error it counts and passes over.)
  const prewarmed = await containerLog(node, pod, INIT_PREWARM);
  assert.match(
    prewarmed,
    /prewarm: read \d+ files.*; only the model files used in place/,
    `${name}: ${prewarmed}`,
  );
  const r = await engineReport(node, pod);
  assert.equal(r.fetchedBytes, 0, `${name} fetched nothing from the hub`);
  assert.equal(r.compileCache, "hit", `${name} found its compile cache intact (${r.compileDetail ?? ""})`);
  assert.equal(r.besideModel.writable, true, `${name} writes beside the model: ${r.besideModel.error ?? ""}`);
  assert.equal(r.modelStore.writable, false, `${name} cannot write into the read-only tree`);
  assert.equal(r.modelStore.error, "Read-only file system");
}

test("a chart of 3 engine replicas downloads once; 2 followers restore in containers; a second namespace restores", async (t) => {
  const node = await realNodeOrSkip(t);
  if (!node) return;
  const { custom } = await kube();
  const ns = await tempNamespace(t, "real");
  const model = `synthetic/${uniqueName("m")}`;
  const chart: EngineChartOptions = { replicas: 3, model };
  await createEngines(t, node, ns, chart);

  const pods = await allReady(ns, "engine", 3);
  const size = await modelBytes(node, model);
  const served = (await hubStats(node)).repos[model]?.bytes ?? 0;
  assert.equal(served, size, `the hub served one model (${size} B), not ${served} B`);

  const leaders = pods.filter((p) => role(p) === "leader");
  const followers = pods.filter((p) => role(p) === "follower");
  assert.equal(leaders.length, 1, "one leader");
  assert.equal(followers.length, 2, "two followers");
  const leader = await engineReport(node, leaders[0]!);
  assert.equal(leader.fetchedBytes, size, "the leader downloaded the model");
  assert.equal(leader.compileCache, "rebuilt");

  const short = pods[0]!.metadata!.labels![LABEL_HASH]!;
  const cache = await getModelCache(custom, short);
  assert.equal(cache?.status?.phase, "Ready");
  for (const f of followers) await assertRestored(node, f);

  // The same chart in another namespace: admitted as a restore of the Ready cache.
  const ns2 = await tempNamespace(t, "real2");
  await createEngines(t, node, ns2, { ...chart, replicas: 1 });
  const [restored] = await allReady(ns2, "engine", 1);
  assert.equal(role(restored!), "restore");
  assert.equal(shortHash(restored!.metadata!.labels![LABEL_HASH]!), short);
  await assertRestored(node, restored!);
  assert.equal((await hubStats(node)).repos[model]?.bytes, size, "still one model's worth from the hub");
  // The attacker: a root pod mounting the claim itself without readOnly cannot write the tree
  // (the node mounts it read-only, SPEC 1.9), and sees the tree, not the store.
  const seen = await mountByHand(t, node, ns2, claimName(short));
  assert.ok(seen.entries.includes(READY_MARKER), `the tree's root: ${seen.entries.join(", ")}`);
  assert.match(seen.write, /Read-only file system/);
});

test("followers run as the workload's UID: from the image's USER, and from the container's security context", async (t) => {
  const node = await realNodeOrSkip(t);
  if (!node) return;
  const ns = await tempNamespace(t, "uid");
  const model = `synthetic/${uniqueName("u")}`;
  // Two charts of one model that hash apart (different images): two elections, two restores.
  await createEngines(t, node, ns, {
    name: "image-user",
    replicas: 2,
    model,
    image: node.images.engineAsUser,
  });
  await createEngines(t, node, ns, {
    name: "context-user",
    replicas: 2,
    model,
    securityContext: { runAsUser: 2000, runAsGroup: 2000 },
  });
  const byImage = await allReady(ns, "image-user", 2);
  const byContext = await allReady(ns, "context-user", 2);

  for (const [pods, uid] of [
    [byImage, 1000],
    [byContext, 2000],
  ] as const) {
    const follower = pods.find((p) => role(p) === "follower");
    assert.ok(follower, "one follower per chart");
    const r = await engineReport(node, follower);
    assert.equal(r.uid, uid, "the engine ran as its own UID");
    await assertRestored(node, follower);
  }
  // Where the UID is known at admission, the init containers run as it.
  const ctxFollower = byContext.find((p) => role(p) === "follower")!;
  for (const c of ctxFollower.spec?.initContainers ?? []) {
    assert.equal(c.securityContext?.runAsUser, 2000, `${c.name} runs as the workload's UID`);
  }
});
