/**
 * Capture and promote on the real local cluster: leaders admitted through the webhook, their
 * warmed cache written where the kubelet keeps the pod's emptyDir, captured by a node agent and
 * promoted to `rox-<short>` claims. The first test uses the node agents `warmstart cluster up`
 * runs; the others run an agent in-process for a node of their own, talking to the API server
 * through a fault-injecting proxy.
 */
import { test, before } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { mkdir, mkdtemp, readFile, readdir, rm, stat, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import * as k8s from "@kubernetes/client-node";
import {
  gpuContainer,
  isPodReady,
  kube,
  listPods,
  localCluster,
  tempNamespace,
  uniqueName,
  waitFor,
} from "../harness.js";
import { pauseRole } from "../roles.js";
import {
  ANN_CACHE_SIZE_LIMIT,
  ANN_CACHE_SOURCE,
  ANN_ELECTION_ID,
  ANN_HASH,
  ANN_REASON,
  ANN_ROLE,
  CACHE_VOLUME,
  LABEL_CAPTURE,
  LABEL_HASH,
  LABEL_NAMESPACE,
  MANIFEST_FILE,
  MODELCACHE,
  claimName,
  leaseName,
  shortHash,
} from "../../src/core/contract.js";
import { SYSTEM_NAMESPACE, isNotFound } from "../../src/common/kube.js";
import { readManifest } from "../../src/datapath/manifest.js";
import { createCA, issueCert } from "../../src/common/certs.js";
import { getModelCache } from "../../src/common/modelcache.js";
import { replicateTree } from "../../src/node-agent/replication/receiver.js";
import { manifestDigestOf } from "../../src/node-agent/replication/server.js";
import { capture } from "../../src/datapath/capture.js";
import { recordElection, tryAcquire } from "../../src/webhook/election.js";
import { emptyDirPath } from "../../src/node-agent/store.js";
import { fetchSnapshot } from "../../src/server/dashboard/views.js";
import type { ModelCacheObject } from "../../src/common/modelcache.js";
import {
  MANUAL_READY,
  bound,
  claimIn,
  cleanupCache,
  createPod,
  getCache,
  ignoreNotFound,
  makeReady,
  mcRef,
  mergePatch,
  metric,
  readPod,
  readyLeader,
  startAgent,
  testNode,
  watchCache,
  workerPod,
  writeCacheTree,
} from "../agents.js";

before(async () => {
  const st = await localCluster();
  if (!st?.roles.webhook) throw new Error("these tests need the webhook of `warmstart cluster up`");
});

void test("a Ready leader's cache is captured and promoted: a Ready ModelCache and rox claims wherever its pods are", async (t) => {
  const st = (await localCluster())!;
  const { core, custom } = await kube();
  const t0 = Date.now();
  const laps: string[] = [];
  const lap = (what: string): number => laps.push(`${what} +${((Date.now() - t0) / 1000).toFixed(1)}s`);
  t.after(() => t.diagnostic(laps.join(", ")));
  const nsA = await tempNamespace(t, "cap-a");
  const nsB = await tempNamespace(t, "cap-b");
  const model = `org/llama-${nsA}`;

  const leader = await createPod(nsA, workerPod("leader", model, { manualReady: true }));
  assert.equal(leader.metadata?.annotations?.[ANN_ROLE], "leader");
  const hash = leader.metadata.annotations[ANN_HASH]!;
  const short = shortHash(hash);
  cleanupCache(
    t,
    short,
    st.nodes.map((n) => join(dirname(n.kubeletRoot), "store")),
  );
  const fa = await createPod(nsA, workerPod("follower-a", model));
  const fb = await createPod(nsB, workerPod("follower-b", model));
  assert.equal(fa.metadata?.annotations?.[ANN_ROLE], "follower");
  assert.equal(fb.metadata?.annotations?.[ANN_ROLE], "follower");

  const pod = await bound(nsA, "leader");
  const node = st.nodes.find((n) => n.name === pod.spec!.nodeName)!;
  const tree = await writeCacheTree(emptyDirPath(node.kubeletRoot, pod.metadata!.uid!, CACHE_VOLUME));
  lap("leader bound");
  const readyAt = await makeReady(nsA, "leader");
  lap("leader Ready");

  const { cache, at, phases } = await watchCache(
    short,
    (c) => c.status?.phase === "Ready" || c.status?.phase === "Failed",
  );
  lap("cache Ready");
  assert.equal(cache.status?.phase, "Ready", `status: ${JSON.stringify(cache.status)}`);
  // Captured by the agent (the phases in between may pass between two polls).
  const s = cache.status as Record<string, unknown>;
  assert.equal(typeof s.captureSeconds, "number", `status: ${JSON.stringify(s)}`);
  t.diagnostic(
    `leader Ready → ModelCache Ready: ${((at - readyAt) / 1000).toFixed(2)} s (warm-up 1 s); capture ${String(s.captureSeconds)} s; phases ${phases.join(" → ")}`,
  );

  // The record matches what was written and what the store holds.
  assert.equal(s.files, tree.files);
  assert.equal(s.modelBytes, tree.modelBytes);
  assert.equal(s.cacheBytes, tree.cacheBytes);
  assert.equal(s.sizeBytes, tree.modelBytes + tree.cacheBytes);
  assert.equal(s.backend, "host-path");
  assert.equal(s.node, node.name);
  assert.equal(typeof s.captureSeconds, "number");
  assert.equal(typeof s.leaderReadySeconds, "number");
  assert.deepEqual([...(cache.status?.namespaces ?? [])].sort(), [nsA, nsB].sort());
  const treeDir = String(s.path);
  assert.equal(treeDir, join(dirname(node.kubeletRoot), "store", short));
  const manifest = await readManifest(treeDir);
  assert.equal(manifest.hash, hash, "captured under the stamped hash");
  assert.equal(
    s.manifestDigest,
    createHash("sha256")
      .update(await readFile(join(treeDir, MANIFEST_FILE)))
      .digest("hex"),
    "the record holds the digest of the manifest the leader's agent committed",
  );
  assert.equal(manifest.fileCount, tree.files);
  assert.equal(manifest.split.model.files, tree.modelFiles);
  assert.equal(manifest.split.model.bytes, tree.modelBytes);
  assert.equal(manifest.split.cache.bytes, tree.cacheBytes);
  assert.equal(manifest.symlinks.length, 1);
  assert.ok(cache.metadata.annotations?.[ANN_CACHE_SOURCE], "the source is recorded for later claims");

  // A claim in every namespace holding pods of the hash, each on its own pre-bound local PV.
  for (const ns of [nsA, nsB]) {
    const pvc = await claimIn(ns, short);
    assert.ok(pvc, `claim in ${ns}`);
    assert.deepEqual(pvc.spec?.accessModes, ["ReadOnlyMany"]);
    assert.equal(pvc.metadata?.labels?.[LABEL_HASH], short);
    assert.equal(pvc.metadata?.labels?.[LABEL_NAMESPACE], ns);
    const pv = await core.readPersistentVolume({ name: pvc.spec.volumeName! });
    assert.equal(pv.spec?.local?.path, treeDir);
    assert.equal(pv.spec?.claimRef?.namespace, ns);
    assert.equal(pv.spec?.claimRef?.name, claimName(short));
    assert.deepEqual(pv.spec?.nodeAffinity?.required?.nodeSelectorTerms?.[0]?.matchExpressions?.[0]?.values, [
      node.name,
    ]);
    // Up to one volume-controller resync (15 s) when its claim sync loses the race with the PV.
    await waitFor(
      `claim in ${ns} Bound`,
      async () => (await claimIn(ns, short))?.status?.phase === "Bound",
      45_000,
    );
  }

  lap("claims Bound");
  await waitFor("the WarmstartCaptured event on the leader", async () => {
    const evs = await core.listNamespacedEvent({
      namespace: nsA,
      fieldSelector: `involvedObject.name=leader`,
    });
    return evs.items.find((e) => e.reason === "WarmstartCaptured");
  });

  // With the release controller running, the followers are released and land on the node that holds the tree.
  if (st.roles.server) {
    for (const [ns, name] of [
      [nsA, "follower-a"],
      [nsB, "follower-b"],
    ] as const) {
      const p = await waitFor(
        `${ns}/${name} released and Ready`,
        async () => {
          const x = await readPod(ns, name);
          return isPodReady(x) ? x : undefined;
        },
        45_000,
      );
      assert.equal(p.spec?.nodeName, node.name, "the PV's node affinity brings restores to the tree");
    }
  }

  lap("followers Ready");
  // A restore admitted later in a namespace the promote never saw gets its claim at admission.
  const nsC = await tempNamespace(t, "cap-c");
  const late = await createPod(nsC, workerPod("late", model));
  assert.equal(late.metadata?.annotations?.[ANN_ROLE], "restore", late.metadata?.annotations?.[ANN_REASON]);
  const lateClaim = await claimIn(nsC, short);
  assert.ok(lateClaim, "the claim exists as soon as the pod does");
  assert.equal(lateClaim.metadata?.labels?.[LABEL_NAMESPACE], nsC);
  // The cluster's agent adds the namespace to the record on its next resync; nothing regressed meanwhile.
  const again = (await custom.getClusterCustomObject({ ...mcRef, name: short })) as ModelCacheObject;
  assert.equal(again.status?.phase, "Ready");
});

// ---------------------------------------------------------------------------------------------
// In-process agents on a node of their own, through the fault proxy.

void test("transient claim errors are retried and the cache still ends Ready; a restarted agent never captures it again", async (t) => {
  const where = await testNode(t);
  const ta = await startAgent(t, where);
  const nsA = await tempNamespace(t, "tr-a");
  const nsB = await tempNamespace(t, "tr-b");
  const model = `org/transient-${nsA}`;
  // The first two claim creations in nsB are refused, as an overloaded API server would.
  const fault = ta.proxy.inject({
    method: "POST",
    path: new RegExp(`^/api/v1/namespaces/${nsB}/persistentvolumeclaims$`),
    times: 2,
    status: [500, 429],
  });
  const { pod, tree } = await readyLeader(ta, nsA, "leader", model);
  const short = shortHash(pod.metadata!.annotations![ANN_HASH]!);
  cleanupCache(t, short, [ta.store]);
  await createPod(nsB, workerPod("follower", model));

  const { cache, phases } = await watchCache(
    short,
    (c) => c.status?.phase === "Ready" || c.status?.phase === "Failed",
  );
  assert.equal(cache.status?.phase, "Ready", JSON.stringify(cache.status));
  assert.ok(!phases.includes("Failed"), `phases: ${phases.join(" → ")}`);
  assert.equal(fault.hits, 2, "both faults were served");
  const posts = ta.proxy.seen("POST", new RegExp(`^/api/v1/namespaces/${nsB}/persistentvolumeclaims$`));
  assert.deepEqual(
    posts.map((p) => p.status),
    [500, 429, 201],
    "retried until the claim was created",
  );
  assert.ok(await claimIn(nsA, short));
  assert.ok(await claimIn(nsB, short));
  assert.equal(cache.status?.files, tree.files);
  assert.equal(await metric(ta.agent, "warmstart_node_agent_captures_total", 'result="captured"'), 1);
  // The 500 is the agent's to retry (a create may have landed); the 429 its API client retries.
  assert.ok((await metric(ta.agent, "warmstart_node_agent_claims_total", 'result="retry"')) >= 1);
  assert.equal(ta.agent.marks.isCommitted(pod.metadata!.uid!), true);

  // A resync looks at the Ready leader again: nothing is captured twice.
  await ta.agent.resync();
  await ta.agent.idle();
  assert.equal(await metric(ta.agent, "warmstart_node_agent_captures_total", 'result="captured"'), 1);

  // A fresh agent on the same store (an agent restart) finds the committed tree and leaves it be.
  const manifestBefore = await readManifest(join(ta.store, short));
  const treeMtime = (await stat(join(ta.store, short))).mtimeMs;
  await ta.agent.stop();
  const restarted = await startAgent(t, where, {}, ta.proxy);
  await waitFor("the restarted agent settles the leader", async () => {
    await restarted.agent.idle();
    return restarted.agent.marks.isCommitted(pod.metadata!.uid!);
  });
  assert.equal(
    await metric(restarted.agent, "warmstart_node_agent_captures_total", 'result="already-captured"'),
    1,
  );
  assert.equal(await metric(restarted.agent, "warmstart_node_agent_captures_total", 'result="captured"'), 0);
  assert.deepEqual((await readManifest(join(ta.store, short))).createdAt, manifestBefore.createdAt);
  assert.equal((await stat(join(ta.store, short))).mtimeMs, treeMtime);
  assert.equal((await getCache(short))?.status?.phase, "Ready");
});

void test("a namespace whose claim keeps failing publishes the cache Failed, never Ready", async (t) => {
  const where = await testNode(t);
  const ta = await startAgent(t, where, { claimAttempts: 3 });
  const nsA = await tempNamespace(t, "fl-a");
  const nsB = await tempNamespace(t, "fl-b");
  const model = `org/refused-${nsA}`;
  const fault = ta.proxy.inject({
    method: "POST",
    path: new RegExp(`^/api/v1/namespaces/${nsB}/persistentvolumeclaims$`),
    status: [500],
  });
  const { pod } = await readyLeader(ta, nsA, "leader", model);
  const short = shortHash(pod.metadata!.annotations![ANN_HASH]!);
  cleanupCache(t, short, [ta.store]);
  await createPod(nsB, workerPod("follower", model));

  const { cache, phases } = await watchCache(
    short,
    (c) => c.status?.phase === "Failed" || c.status?.phase === "Ready",
  );
  assert.ok(!phases.includes("Ready"), `never Ready; phases: ${phases.join(" → ")}`);
  assert.equal(cache.status?.phase, "Failed");
  assert.equal(cache.status?.reason, "PromoteFailed");
  assert.match(cache.status?.message ?? "", new RegExp(`claim in ${nsB} failed after 3 attempt\\(s\\)`));
  assert.equal(fault.hits, 3);
  assert.ok(await claimIn(nsA, short), "the healthy namespace got its claim");
  assert.equal(await claimIn(nsB, short), undefined);
  // The capture itself is committed and kept: a later promote can reuse it.
  assert.equal(ta.agent.marks.isCommitted(pod.metadata!.uid!), true);
  const { core } = await kube();
  await waitFor("the WarmstartPromoteFailed event", async () => {
    const evs = await core.listNamespacedEvent({
      namespace: nsA,
      fieldSelector: "involvedObject.name=leader",
    });
    return evs.items.find((e) => e.reason === "WarmstartPromoteFailed" && e.type === "Warning");
  });
  // The promote's own writes queued the cache again while it ran: that look, on the informer's
  // copy from before the failure, must not start it over (the failure stands until a resync).
  await ta.agent.idle();
  await sleep(2_000);
  await ta.agent.idle();
  assert.equal(fault.hits, 3, "no promote ran again before a resync");
  assert.equal((await getCache(short))?.status?.phase, "Failed");
  assert.equal(await metric(ta.agent, "warmstart_node_agent_promotes_total", 'result="failed"'), 1);

  // Once the API server takes claims again, the resync retries the promote from the store.
  fault.remove();
  await ta.agent.resync();
  await ta.agent.idle();
  const healed = await watchCache(short, (c) => c.status?.phase === "Ready", 10_000);
  assert.ok(await claimIn(nsB, short));
  assert.equal(
    await metric(ta.agent, "warmstart_node_agent_captures_total", 'result="captured"'),
    1,
    "not captured again",
  );
  assert.deepEqual([...(healed.cache.status?.namespaces ?? [])].sort(), [nsA, nsB].sort());
});

void test("a leader replaced during its warm-up is not captured; its mark is released and the next leader is captured", async (t) => {
  const where = await testNode(t);
  const ta = await startAgent(t, where, { warmupMs: "4s" });
  const { core, coordination } = await kube();
  const ns = await tempNamespace(t, "rp");
  const model = `org/replaced-${ns}`;

  const first = await readyLeader(ta, ns, "leader", model);
  const uid1 = first.pod.metadata!.uid!;
  const hash = first.pod.metadata!.annotations![ANN_HASH]!;
  const short = shortHash(hash);
  cleanupCache(t, short, [ta.store]);
  await waitFor("the warm-up mark", () => ta.agent.marks.get(uid1)?.stage === "warmup");
  // The pod goes away before its warm-up ends (a rollout replacing it).
  await core.deleteNamespacedPod({ namespace: ns, name: "leader", gracePeriodSeconds: 0 });
  await waitFor(
    "its mark released",
    () => ta.agent.marks.get(uid1) === undefined && ta.agent.marks.lastRelease(uid1),
  );
  // Either the agent sees the pod go first, or the cluster's release controller retires the
  // election (its leader is gone) and the agent's next look at the Lease finds no leader there:
  // a race between two watchers with one end, the mark released and nothing captured.
  assert.ok(
    ["pod-deleted", "pod-replaced", "terminating", "not-leader"].includes(ta.agent.marks.lastRelease(uid1)!),
    `released as ${ta.agent.marks.lastRelease(uid1)}`,
  );
  await sleep(4_500); // past the end of the warm-up it would have had
  await assert.rejects(stat(join(ta.store, short)), /ENOENT/, "nothing was captured");
  assert.equal(await metric(ta.agent, "warmstart_node_agent_captures_total", 'result="captured"'), 0);
  assert.ok(
    (await metric(
      ta.agent,
      "warmstart_node_agent_marks_released_total",
      `reason="${ta.agent.marks.lastRelease(uid1)}"`,
    )) >= 1,
  );
  assert.notEqual((await getCache(short))?.status?.phase, "Capturing");

  // The election is retired (as the release controller does) and a replacement of the same name leads.
  await coordination
    .deleteNamespacedLease({ name: leaseName(hash), namespace: SYSTEM_NAMESPACE })
    .catch(ignoreNotFound);
  await waitFor("the old pod gone", async () => {
    try {
      await readPod(ns, "leader");
      return false;
    } catch (err) {
      return isNotFound(err);
    }
  });
  const second = await readyLeader(ta, ns, "leader", model);
  const uid2 = second.pod.metadata!.uid!;
  assert.notEqual(uid2, uid1);
  assert.equal(second.pod.metadata?.annotations?.[ANN_HASH], hash, "same hash");
  const { cache } = await watchCache(
    short,
    (c) => c.status?.phase === "Ready" || c.status?.phase === "Failed",
  );
  assert.equal(cache.status?.phase, "Ready", JSON.stringify(cache.status));
  assert.equal(ta.agent.marks.isCommitted(uid2), true);
  assert.equal(await metric(ta.agent, "warmstart_node_agent_captures_total", 'result="captured"'), 1);
  assert.equal((await readManifest(join(ta.store, short))).fileCount, second.tree.files);
});

void test("storage that clones per pod is reported Unsupported, and later pods of the hash start cold", async (t) => {
  const where = await testNode(t);
  const ta = await startAgent(t, where, { storeProvisioner: "ebs.csi.aws.com" });
  const ns = await tempNamespace(t, "un");
  const model = `org/unsupported-${ns}`;
  const { pod } = await readyLeader(ta, ns, "leader", model);
  const short = shortHash(pod.metadata!.annotations![ANN_HASH]!);
  cleanupCache(t, short, [ta.store]);
  const { cache } = await watchCache(
    short,
    (c) => c.status?.phase === "Failed" || c.status?.phase === "Ready",
  );
  assert.equal(cache.status?.phase, "Failed");
  assert.equal(cache.status?.reason, "Unsupported");
  assert.match(cache.status?.message ?? "", /ebs\.csi\.aws\.com.*per pod/);
  await assert.rejects(
    stat(join(ta.store, short)),
    /ENOENT/,
    "no copy is made for storage that cannot share it",
  );
  await ta.agent.idle();
  assert.equal(ta.agent.marks.lastRelease(pod.metadata!.uid!), "unsupported");

  const other = await tempNamespace(t, "un2");
  const later = await createPod(other, workerPod("later", model));
  assert.equal(later.metadata?.annotations?.[ANN_ROLE], "cold");
  assert.match(later.metadata?.annotations?.[ANN_REASON] ?? "", /unsupported/i);
});

// ---------------------------------------------------------------------------------------------
// The life of one election's record: only its own election writes on it, only its leader is
// captured, and a capture stops when its leader goes.

/** What admission does when an election is retired and the next pod is admitted: a new Lease and a reset record. */
async function nextElection(hash: string, namespace: string): Promise<string> {
  const { coordination, custom } = await kube();
  await coordination
    .deleteNamespacedLease({ name: leaseName(hash), namespace: SYSTEM_NAMESPACE })
    .catch(ignoreNotFound);
  const election = `e2-${randomBytes(4).toString("hex")}`;
  const won = await tryAcquire(coordination, {
    namespace: SYSTEM_NAMESPACE,
    hash,
    electionId: election,
    deadlineSeconds: 3600,
    podNamespace: namespace,
  });
  assert.equal(won.role, "leader");
  assert.equal(await recordElection(custom, { hash, electionId: election, namespace }), undefined);
  return election;
}

const electionOf = (p: k8s.V1Pod): string => p.metadata!.annotations![ANN_ELECTION_ID]!;

void test("a leader deleted mid-copy stops the copy (nothing committed, mark released), and its election's late Failed never lands on the next election", async (t) => {
  const where = await testNode(t);
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  let copying!: () => void;
  const started = new Promise<void>((r) => (copying = r));
  const opened: string[] = [];
  const ta = await startAgent(t, where, { captureParallel: 1 }, undefined, {
    capture: {
      beforeOpen: async (rel) => {
        opened.push(rel);
        copying();
        await held;
      },
    },
  });
  const { core } = await kube();
  const ns = await tempNamespace(t, "cancel");
  const { pod, tree } = await readyLeader(ta, ns, "leader", `org/cancel-${ns}`);
  const hash = pod.metadata!.annotations![ANN_HASH]!;
  const short = shortHash(hash);
  const uid = pod.metadata!.uid!;
  cleanupCache(t, short, [ta.store]);
  await started;
  assert.equal((await getCache(short))?.status?.phase, "Capturing");

  // Mid-copy, the election is retired and the next one recorded; then the leader goes.
  const next = await nextElection(hash, ns);
  await core.deleteNamespacedPod({ namespace: ns, name: "leader", gracePeriodSeconds: 0 });
  await waitFor("the capture told to stop", () => ta.agent.marks.get(uid)?.controller.signal.aborted);
  release();
  await ta.agent.idle();

  assert.ok(
    ["pod-deleted", "terminating"].includes(ta.agent.marks.lastRelease(uid)!),
    ta.agent.marks.lastRelease(uid),
  );
  assert.ok(
    opened.length < tree.files,
    `the copy stopped early (${opened.length} of ${tree.files} files opened)`,
  );
  assert.equal(await metric(ta.agent, "warmstart_node_agent_captures_total", 'result="cancelled"'), 1);
  assert.equal(await metric(ta.agent, "warmstart_node_agent_captures_total", 'result="captured"'), 0);
  await assert.rejects(stat(join(ta.store, short)), /ENOENT/, "nothing committed");
  assert.deepEqual(
    (await readdir(ta.store)).filter((n) => n.startsWith(short)),
    [],
    "no staging tree left behind",
  );
  const cache = (await getCache(short))!;
  assert.equal(cache.spec.electionId, next);
  assert.equal(
    cache.status?.phase,
    "Electing",
    `the next election is untouched: ${JSON.stringify(cache.status)}`,
  );
  assert.notEqual(cache.status?.electionId, electionOf(pod));
  assert.equal(cache.status?.failedCaptures ?? 0, 0);
  assert.ok(
    !(cache.metadata.finalizers ?? []).some((f) => f.startsWith("warmstart.dev/store-")),
    "a node that stored nothing holds no finalizer",
  );
});

void test("a leader evicted mid-copy stops the copy, and its election counts a failed capture (LeaderEvicted) with a Warning", async (t) => {
  // The cluster's server would retire the election too: only the agent's word is tested here.
  await pauseRole(t, "server");
  const where = await testNode(t);
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  let copying!: () => void;
  const started = new Promise<void>((r) => (copying = r));
  const ta = await startAgent(t, where, { captureParallel: 1 }, undefined, {
    capture: {
      beforeOpen: async () => {
        copying();
        await held;
      },
    },
  });
  const { core } = await kube();
  const ns = await tempNamespace(t, "evicted-copy");
  const { pod } = await readyLeader(ta, ns, "leader", `org/evicted-copy-${ns}`);
  const short = shortHash(pod.metadata!.annotations![ANN_HASH]!);
  const uid = pod.metadata!.uid!;
  cleanupCache(t, short, [ta.store]);
  t.after(() => release());
  await started;

  // What the kubelet writes when it evicts the pod for the node's disk; the object stays.
  const why = "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, available: 512Mi. ";
  await core.patchNamespacedPodStatus(
    {
      namespace: ns,
      name: "leader",
      body: {
        status: {
          phase: "Failed",
          reason: "Evicted",
          message: why,
          conditions: [
            { type: "DisruptionTarget", status: "True", reason: "TerminationByKubelet", message: why },
          ],
        },
      },
    },
    k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.StrategicMergePatch),
  );
  await waitFor("the copy told to stop", () => ta.agent.marks.get(uid)?.controller.signal.aborted);
  release();
  await ta.agent.idle();

  assert.equal(ta.agent.marks.lastRelease(uid), "terminating");
  await assert.rejects(
    stat(join(ta.store, short)),
    /ENOENT/,
    "nothing committed from a volume being torn down",
  );
  const cache = (await getCache(short))!;
  assert.equal(cache.status?.phase, "Failed");
  assert.equal(cache.status?.reason, "CaptureFailed", "counted, not LeaderGone");
  assert.match(
    cache.status?.message ?? "",
    /^LeaderEvicted: node disk pressure: leader pod .* its capture stopped$/,
  );
  assert.equal(cache.status?.failedCaptures, 1);
  const warned = await waitFor("a Warning on the evicted leader", async () =>
    (
      await core.listNamespacedEvent({ namespace: ns, fieldSelector: "involvedObject.name=leader" })
    ).items.find((e) => e.reason === "WarmstartLeaderEvicted"),
  );
  assert.match(warned.message ?? "", /Counted as failed capture 1 of cache/);
});

void test("a promote that fails after its election was replaced leaves the next election alone", async (t) => {
  const where = await testNode(t);
  let next: string | undefined;
  let hash = "";
  let ns = "";
  const ta = await startAgent(t, where, { claimAttempts: 2 }, undefined, {
    // Just before the late Failed is written, admission records the next election.
    beforeStatus: async (_short, phase) => {
      if (phase === "Failed" && !next) next = await nextElection(hash, ns);
    },
  });
  ns = await tempNamespace(t, "late-a");
  const nsB = await tempNamespace(t, "late-b");
  const model = `org/late-${ns}`;
  ta.proxy.inject({
    method: "POST",
    path: new RegExp(`^/api/v1/namespaces/${nsB}/persistentvolumeclaims$`),
    status: [500],
  });
  const created = await createPod(ns, workerPod("leader", model, { manualReady: true, node: ta.node }));
  hash = created.metadata!.annotations![ANN_HASH]!;
  const short = shortHash(hash);
  cleanupCache(t, short, [ta.store]);
  await createPod(nsB, workerPod("follower", model));
  const pod = await bound(ns, "leader");
  await writeCacheTree(emptyDirPath(ta.kubeletRoot, pod.metadata!.uid!, CACHE_VOLUME));
  await makeReady(ns, "leader");
  await waitFor("the promote to fail", () => next, 30_000);
  await ta.agent.idle();
  const cache = (await getCache(short))!;
  assert.equal(cache.spec.electionId, next);
  assert.equal(
    cache.status?.phase,
    "Electing",
    `the late Failed was refused: ${JSON.stringify(cache.status)}`,
  );
  assert.equal(cache.status?.failedCaptures ?? 0, 0);
  assert.equal(await metric(ta.agent, "warmstart_node_agent_promotes_total", 'result="failed"'), 1);
});

/**
 * The claim in `namespace` and every volume of the cache deleted (each goes once its protection
 * finalizer sees nothing use it) and not made again.
 */
async function takenBack(namespace: string, short: string): Promise<void> {
  const { core } = await kube();
  const deleted = (o: k8s.KubernetesObject | undefined): boolean =>
    !o || Boolean(o.metadata?.deletionTimestamp);
  const pvs = await core.listPersistentVolume({ labelSelector: `${LABEL_HASH}=${short}` });
  assert.ok(deleted(await claimIn(namespace, short)), "the claim it made is taken back");
  assert.deepEqual(
    pvs.items.filter((v) => !deleted(v)).map((v) => v.metadata!.name),
    [],
    "and the volumes it made",
  );
  await waitFor("the claim and volumes gone", async () => {
    const left = await core.listPersistentVolume({ labelSelector: `${LABEL_HASH}=${short}` });
    return !(await claimIn(namespace, short)) && left.items.length === 0;
  });
}

/** A claim of this cache that the API server created in `namespace` (status 201 through the proxy). */
const claimMade = (
  ta: { proxy: { seen: (m: string, p: RegExp) => { status: number }[] } },
  namespace: string,
) =>
  ta.proxy
    .seen("POST", new RegExp(`^/api/v1/namespaces/${namespace}/persistentvolumeclaims$`))
    .some((r) => r.status === 201);

void test("a promote superseded midway creates nothing more for its election and takes back what it made: no claim or volume left", async (t) => {
  const where = await testNode(t);
  const ta = await startAgent(t, where, { claimAttempts: 3 });
  const ns = await tempNamespace(t, "sup-a");
  const nsB = await tempNamespace(t, "sup-b");
  const model = `org/sup-${ns}`;
  let hash = "";
  let next: string | undefined;
  // B's first claim create fails, and just then admission records the next election: B's retry
  // must not create anything for the election that was superseded.
  ta.proxy.inject({
    method: "POST",
    path: new RegExp(`^/api/v1/namespaces/${nsB}/persistentvolumeclaims$`),
    status: [500],
    times: 1,
    onMatch: async () => {
      next = await nextElection(hash, ns);
    },
  });
  const created = await createPod(ns, workerPod("leader", model, { manualReady: true, node: ta.node }));
  hash = created.metadata!.annotations![ANN_HASH]!;
  const short = shortHash(hash);
  cleanupCache(t, short, [ta.store]);
  await createPod(nsB, workerPod("follower", model));
  const pod = await bound(ns, "leader");
  await writeCacheTree(emptyDirPath(ta.kubeletRoot, pod.metadata!.uid!, CACHE_VOLUME));
  await makeReady(ns, "leader");
  await waitFor(
    "the promote superseded",
    async () => (await metric(ta.agent, "warmstart_node_agent_promotes_total", 'result="superseded"')) === 1,
    30_000,
  );
  await ta.agent.idle();

  assert.ok(next, "superseded in the middle of the claims");
  assert.ok(claimMade(ta, ns), "the leader's namespace got its claim before the election moved on");
  assert.equal(
    ta.proxy.seen("POST", new RegExp(`^/api/v1/namespaces/${nsB}/persistentvolumeclaims$`)).length,
    1,
    "no claim was tried for the superseded election after it moved on",
  );
  assert.equal(await claimIn(nsB, short), undefined);
  await takenBack(ns, short);
  const cache = (await getCache(short))!;
  assert.equal(cache.spec.electionId, next, "the next election's record");
  assert.notEqual(cache.status?.phase, "Ready");
  assert.equal(await metric(ta.agent, "warmstart_node_agent_promotes_total", 'result="failed"'), 0);
});

void test("a promote that fails in one namespace takes back the claims and volumes it made in the others", async (t) => {
  const where = await testNode(t);
  const ta = await startAgent(t, where, { claimAttempts: 2 });
  const ns = await tempNamespace(t, "fail-a");
  const nsB = await tempNamespace(t, "fail-b");
  const model = `org/fail-${ns}`;
  ta.proxy.inject({
    method: "POST",
    path: new RegExp(`^/api/v1/namespaces/${nsB}/persistentvolumeclaims$`),
    status: [500],
  });
  const created = await createPod(ns, workerPod("leader", model, { manualReady: true, node: ta.node }));
  const short = shortHash(created.metadata!.annotations![ANN_HASH]!);
  cleanupCache(t, short, [ta.store]);
  await createPod(nsB, workerPod("follower", model));
  const pod = await bound(ns, "leader");
  await writeCacheTree(emptyDirPath(ta.kubeletRoot, pod.metadata!.uid!, CACHE_VOLUME));
  await makeReady(ns, "leader");
  const { cache } = await watchCache(short, (c) => c.status?.phase === "Failed", 30_000);
  await ta.agent.idle();

  assert.equal(cache.status?.reason, "PromoteFailed", JSON.stringify(cache.status));
  assert.match(cache.status?.message ?? "", new RegExp(`claim in ${nsB} failed`));
  assert.ok(claimMade(ta, ns), "the leader's namespace got its claim before B failed");
  // Nor a volume: A's, or B's, made before its claim failed.
  await takenBack(ns, short);
});

/** A committed tree of `hash` in the store, as a capture left it. */
async function committedTree(store: string, hash: string): Promise<void> {
  const src = await mkdtemp(join(tmpdir(), "ws-src-"));
  await writeCacheTree(src);
  await capture({ src, dest: join(store, shortHash(hash)), hash, progress: false, durable: false });
  await rm(src, { recursive: true, force: true });
}

/** A record as admission and an agent left it: spec for one election, status written for another. */
async function recordAs(
  hash: string,
  spec: { electionId: string },
  status: Record<string, unknown>,
): Promise<void> {
  const { custom } = await kube();
  const name = shortHash(hash);
  await custom.createClusterCustomObject({
    ...mcRef,
    body: {
      apiVersion: `${MODELCACHE.group}/${MODELCACHE.version}`,
      kind: MODELCACHE.kind,
      metadata: { name, labels: { [LABEL_HASH]: name } },
      spec: { hash, ...spec },
    },
  });
  await custom.patchClusterCustomObjectStatus({ ...mcRef, name, body: { status } }, mergePatch);
}

for (const [what, status] of [
  ["a freshly reset Electing record (its node kept from before)", { phase: "Electing", electionId: "e1" }],
  ["a Promoting status left by the previous election", { phase: "Promoting", electionId: "e1" }],
] as const) {
  void test(`a resync never resumes an old election's promote onto ${what}`, async (t) => {
    const where = await testNode(t);
    const ta = await startAgent(t, where);
    const hash = randomBytes(32).toString("hex");
    const short = shortHash(hash);
    cleanupCache(t, short, [ta.store]);
    await committedTree(ta.store, hash);
    await recordAs(hash, { electionId: "e2" }, { ...status, node: ta.node, reason: "x" });
    await ta.agent.resync();
    await ta.agent.idle();
    const cache = (await getCache(short))!;
    assert.equal(cache.status?.phase, status.phase, `left as it was: ${JSON.stringify(cache.status)}`);
    assert.equal(cache.metadata.annotations?.[ANN_CACHE_SOURCE], undefined, "nothing published");
    const { core } = await kube();
    assert.equal(
      (await core.listPersistentVolume({ labelSelector: `${LABEL_HASH}=${short}` })).items.length,
      0,
    );
  });
}

void test("a resync resumes the unfinished promote of the record's own election (agent restart)", async (t) => {
  const where = await testNode(t);
  const ta = await startAgent(t, where);
  const hash = randomBytes(32).toString("hex");
  const short = shortHash(hash);
  cleanupCache(t, short, [ta.store]);
  await committedTree(ta.store, hash);
  await recordAs(hash, { electionId: "e1" }, { phase: "Promoting", electionId: "e1", node: ta.node });
  await ta.agent.resync();
  await ta.agent.idle();
  const cache = await watchCache(short, (c) => c.status?.phase === "Ready", 10_000);
  assert.equal(cache.cache.status?.electionId, "e1");
  assert.ok(cache.cache.metadata.annotations?.[ANN_CACHE_SOURCE]);
});

void test("only the elected leader is captured: pods forging the capture label, a hash or the holder's election id are ignored", async (t) => {
  const where = await testNode(t);
  const ta = await startAgent(t, where);
  const { core } = await kube();
  const ns = await tempNamespace(t, "forge");
  const model = `org/forge-${ns}`;
  const created = await createPod(ns, workerPod("leader", model, { manualReady: true, node: ta.node }));
  assert.equal(created.metadata?.annotations?.[ANN_ROLE], "leader");
  const hash = created.metadata.annotations[ANN_HASH]!;
  const short = shortHash(hash);
  cleanupCache(t, short, [ta.store]);
  const leader = await bound(ns, "leader");
  const tree = await writeCacheTree(emptyDirPath(ta.kubeletRoot, leader.metadata!.uid!, CACHE_VOLUME));
  // Seen (bound, not Ready yet) and recorded by UID, before anyone can copy its stamps.
  await waitFor(
    "the leader recorded by UID",
    async () => (await getCache(short))?.status?.leaderUid === leader.metadata!.uid,
  );

  // The attackers: pods the webhook never saw (kube-system stands for a pod admitted while the
  // webhook was unreachable), one wearing a copy of the leader's stamps, one the label and a hash
  // but no election id. Each has a cache of its own to publish.
  const forge = async (name: string, election?: string): Promise<k8s.V1Pod> => {
    const body: k8s.V1Pod = {
      metadata: {
        name,
        labels: { [LABEL_CAPTURE]: "true", [LABEL_HASH]: short },
        annotations: {
          [ANN_HASH]: hash,
          [ANN_ROLE]: "leader",
          ...(election ? { [ANN_ELECTION_ID]: election } : {}),
        },
      },
      spec: {
        containers: [gpuContainer("vllm", ["--model", model])],
        nodeSelector: { "kubernetes.io/hostname": ta.node },
      },
    };
    const p = await core.createNamespacedPod({ namespace: "kube-system", body });
    t.after(() =>
      core
        .deleteNamespacedPod({ namespace: "kube-system", name, gracePeriodSeconds: 0 })
        .then(() => undefined, ignoreNotFound),
    );
    assert.equal(p.metadata?.labels?.[LABEL_CAPTURE], "true", "the forged stamps reached the API server");
    const running = await bound("kube-system", name);
    const root = emptyDirPath(ta.kubeletRoot, running.metadata!.uid!, CACHE_VOLUME);
    await mkdir(join(root, "model"), { recursive: true });
    await writeFile(join(root, "model", "poison.safetensors"), "not the model");
    return running;
  };
  const copy = await forge(uniqueName("copy"), electionOf(leader));
  const bare = await forge(uniqueName("bare"));
  await waitFor(
    "the agent to decide about both",
    async () =>
      (ta.agent.marks.lastRelease(copy.metadata!.uid!) || ta.agent.marks.isCommitted(copy.metadata!.uid!)) &&
      (await metric(ta.agent, "warmstart_node_agent_decisions_total", 'decision="skipped-no-election-id"')) >
        0,
  );
  assert.equal(
    ta.agent.marks.isCommitted(copy.metadata!.uid!),
    false,
    "the copy of the leader's stamps was not captured",
  );
  assert.equal(ta.agent.marks.lastRelease(copy.metadata!.uid!), "not-leader");
  assert.equal(
    ta.agent.marks.get(bare.metadata!.uid!),
    undefined,
    "the pod without an election id was never marked",
  );
  await assert.rejects(stat(join(ta.store, short)), /ENOENT/, "nothing of theirs captured");

  // The real leader turns Ready: its tree, and only its tree, is published.
  await makeReady(ns, "leader");
  const { cache } = await watchCache(
    short,
    (c) => c.status?.phase === "Ready" || c.status?.phase === "Failed",
  );
  assert.equal(cache.status?.phase, "Ready", JSON.stringify(cache.status));
  assert.equal(cache.status?.leaderUid, leader.metadata!.uid);
  const manifest = await readManifest(join(ta.store, short));
  assert.equal(manifest.fileCount, tree.files);
  assert.ok(!manifest.files.some((f) => f.path.includes("poison")), "no byte of the forgers' trees");
});

void test("a pod of another namespace wearing the election's id, seen before the leader, is never recorded nor captured", async (t) => {
  const where = await testNode(t);
  const ta = await startAgent(t, where);
  const { core } = await kube();
  const ns = await tempNamespace(t, "forge-first");
  const model = `org/forge-first-${ns}`;
  // The real leader, admitted and recorded, held unscheduled so no node agent sees it yet.
  const body = workerPod("leader", model, { manualReady: true, node: ta.node });
  body.spec!.schedulingGates = [{ name: "test/hold" }];
  const created = await createPod(ns, body);
  assert.equal(created.metadata?.annotations?.[ANN_ROLE], "leader");
  const hash = created.metadata.annotations[ANN_HASH]!;
  const short = shortHash(hash);
  cleanupCache(t, short, [ta.store]);
  // The election id is public (the record shows it); a pod the webhook never saw wears it.
  const record = (await getCache(short))!;
  assert.equal(record.spec.electionId, electionOf(created));
  const name = uniqueName("first");
  await core.createNamespacedPod({
    namespace: "kube-system",
    body: {
      metadata: {
        name,
        labels: { [LABEL_CAPTURE]: "true", [LABEL_HASH]: short },
        annotations: { [ANN_HASH]: hash, [ANN_ROLE]: "leader", [ANN_ELECTION_ID]: record.spec.electionId },
      },
      spec: {
        containers: [gpuContainer("vllm", ["--model", model])],
        nodeSelector: { "kubernetes.io/hostname": ta.node },
      },
    },
  });
  t.after(() =>
    core
      .deleteNamespacedPod({ namespace: "kube-system", name, gracePeriodSeconds: 0 })
      .then(() => undefined, ignoreNotFound),
  );
  const forger = await bound("kube-system", name);
  const root = emptyDirPath(ta.kubeletRoot, forger.metadata!.uid!, CACHE_VOLUME);
  await mkdir(join(root, "model"), { recursive: true });
  await writeFile(join(root, "model", "poison.safetensors"), "not the model");
  await makeReady("kube-system", name);
  await waitFor("the agent to decide about the forger", () =>
    Boolean(
      ta.agent.marks.lastRelease(forger.metadata!.uid!) || ta.agent.marks.isCommitted(forger.metadata!.uid!),
    ),
  );
  assert.equal(ta.agent.marks.isCommitted(forger.metadata!.uid!), false, "not captured");
  assert.equal(ta.agent.marks.lastRelease(forger.metadata!.uid!), "not-leader");
  // (The release controller may record the held leader by UID meanwhile: it is the only pod of
  // the election's namespace wearing its id.)
  assert.notEqual(
    (await getCache(short))?.status?.leaderUid,
    forger.metadata!.uid,
    "not recorded as the leader",
  );
  await assert.rejects(stat(join(ta.store, short)), /ENOENT/, "nothing of its tree stored");

  // The real leader, once scheduled, is the one recorded.
  await core.patchNamespacedPod(
    { namespace: ns, name: "leader", body: [{ op: "remove", path: "/spec/schedulingGates" }] },
    k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch),
  );
  const leader = await bound(ns, "leader");
  await waitFor(
    "the leader recorded by UID",
    async () => (await getCache(short))?.status?.leaderUid === leader.metadata!.uid,
  );
});

void test("a capture that fails counts once, and the next election captures", async (t) => {
  const st = (await localCluster())!;
  assert.ok(st.roles.server, "the release controller of the local cluster re-elects");
  const where = await testNode(t);
  const ta = await startAgent(t, where);
  const { apps } = await kube();
  const ns = await tempNamespace(t, "refail");
  const model = `org/refail-${ns}`;
  await apps.createNamespacedDeployment({
    namespace: ns,
    body: {
      metadata: { name: "worker" },
      spec: {
        replicas: 2,
        selector: { matchLabels: { app: "worker" } },
        template: {
          metadata: { labels: { app: "worker" }, annotations: { [MANUAL_READY]: "true" } },
          spec: {
            containers: [gpuContainer("vllm", ["--model", model])],
            nodeSelector: { "kubernetes.io/hostname": ta.node },
          },
        },
      },
    },
  });
  const first = await waitFor("the first leader bound", async () => {
    const p = (await listPods(ns, "app=worker")).find(
      (x) => x.metadata?.annotations?.[ANN_ROLE] === "leader",
    );
    return p?.status?.phase === "Running" ? p : undefined;
  });
  const hash = first.metadata!.annotations![ANN_HASH]!;
  const short = shortHash(hash);
  cleanupCache(t, short, [ta.store]);
  // Its engine never wrote a cache: there is nothing to capture, and the capture fails.
  await makeReady(ns, first.metadata!.name!);
  const failed = await watchCache(short, (c) => c.status?.phase === "Failed");
  assert.equal(failed.cache.status?.reason, "CaptureFailed");
  assert.equal(failed.cache.status?.failedCaptures, 1);

  // The release controller retires the election and evicts the follower; its replacement leads.
  const second = await waitFor(
    "a new leader",
    async () => {
      const p = (await listPods(ns, "app=worker")).find(
        (x) =>
          x.metadata?.annotations?.[ANN_ROLE] === "leader" &&
          electionOf(x) !== electionOf(first) &&
          x.status?.phase === "Running",
      );
      return p;
    },
    60_000,
  );
  const tree = await writeCacheTree(emptyDirPath(ta.kubeletRoot, second.metadata!.uid!, CACHE_VOLUME));
  await makeReady(ns, second.metadata!.name!);
  const { cache } = await watchCache(short, (c) => c.status?.phase === "Ready");
  assert.equal(cache.status?.electionId, electionOf(second));
  assert.equal(cache.status?.failedCaptures, 1, "the failure is counted once; the success does not clear it");
  assert.equal(cache.status?.lastFailedElection, electionOf(first));
  assert.equal((await readManifest(join(ta.store, short))).fileCount, tree.files);
});

void test("store budget: a capture that needs room removes the least recently restored cache no pod mounts; a cache in use stays", async (t) => {
  const where = await testNode(t);
  // Room for two trees (about 2.2 MB each), not three.
  const ta = await startAgent(t, where, { storeBudget: "5Mi" });
  const { core, custom } = await kube();
  const ns = await tempNamespace(t, "budget");
  const caches: Record<string, string> = {};
  for (const name of ["a", "b"]) {
    const { pod } = await readyLeader(ta, ns, `leader-${name}`, `org/budget-${name}-${ns}`);
    caches[name] = shortHash(pod.metadata!.annotations![ANN_HASH]!);
    cleanupCache(t, caches[name], [ta.store]);
    await watchCache(caches[name], (c) => c.status?.phase === "Ready");
  }
  const [a, b] = [caches.a!, caches.b!];
  // a was restored longest ago, but a pod mounts it; b was restored just now and nobody mounts it.
  const restored = async (short: string, at: Date): Promise<void> => {
    await custom.patchClusterCustomObjectStatus(
      { ...mcRef, name: short, body: { status: { lastRestoredAt: at.toISOString() } } },
      mergePatch,
    );
  };
  await restored(a, new Date(Date.now() - 3_600_000));
  await restored(b, new Date());
  const user = await createPod(ns, workerPod("uses-a", `org/budget-a-${ns}`, { node: ta.node }));
  assert.equal(user.metadata?.annotations?.[ANN_ROLE], "restore");
  assert.ok(user.spec?.volumes?.some((v) => v.persistentVolumeClaim?.claimName === claimName(a)));
  await bound(ns, "uses-a");

  const { pod } = await readyLeader(ta, ns, "leader-c", `org/budget-c-${ns}`);
  const c = shortHash(pod.metadata!.annotations![ANN_HASH]!);
  cleanupCache(t, c, [ta.store]);
  await watchCache(c, (x) => x.status?.phase === "Ready");
  await ta.agent.idle();

  assert.equal(await metric(ta.agent, "warmstart_node_agent_store_evictions_total", ""), 1);
  // b went, with everything it had created.
  await waitFor("b's record gone", async () => (await getCache(b)) === undefined);
  await assert.rejects(stat(join(ta.store, b)), /ENOENT/);
  assert.equal(await claimIn(ns, b), undefined);
  assert.equal((await core.listPersistentVolume({ labelSelector: `${LABEL_HASH}=${b}` })).items.length, 0);
  // a, in use, stayed though it was the least recently restored.
  assert.equal((await getCache(a))?.status?.phase, "Ready");
  assert.ok((await stat(join(ta.store, a))).isDirectory());
  assert.ok(await claimIn(ns, a));
  // The store's use is published for `warmstart caches`.
  const { kc } = await kube();
  const row = await waitFor("the store row", async () =>
    (await fetchSnapshot(kc, SYSTEM_NAMESPACE)).stores.find(
      (s) => s.node === ta.node && s.caches.length === 2,
    ),
  );
  assert.equal(row.budgetBytes, 5 * 2 ** 20);
  assert.ok(row.usedBytes <= row.budgetBytes, `${row.usedBytes} within the budget`);
  assert.deepEqual([...row.caches].sort(), [a, c].sort());
  // The row goes with its node: the Node owns the store's Lease.
  const lease = await (
    await kube()
  ).coordination.readNamespacedLease({
    name: `warmstart-store-${ta.node}`,
    namespace: SYSTEM_NAMESPACE,
  });
  const node = await core.readNode({ name: ta.node });
  assert.deepEqual(
    lease.metadata?.ownerReferences?.map((o) => [o.kind, o.name, o.uid]),
    [["Node", ta.node, node.metadata?.uid]],
  );
});

void test("store budget: a capture that cannot have room fails, counted, and nothing in use is removed", async (t) => {
  const where = await testNode(t);
  const ta = await startAgent(t, where, { storeBudget: "1Mi" });
  const ns = await tempNamespace(t, "full");
  const { pod } = await readyLeader(ta, ns, "leader", `org/full-${ns}`);
  const short = shortHash(pod.metadata!.annotations![ANN_HASH]!);
  cleanupCache(t, short, [ta.store]);
  const { cache } = await watchCache(
    short,
    (c) => c.status?.phase === "Failed" || c.status?.phase === "Ready",
  );
  assert.equal(cache.status?.phase, "Failed");
  assert.equal(cache.status?.reason, "CaptureFailed");
  assert.match(
    cache.status?.message ?? "",
    /store budget is 1\.0 MB: 0 B held, 0 cache\(s\) in use, 2\.2 MB needed/,
  );
  assert.equal(cache.status?.failedCaptures, 1);
  await assert.rejects(stat(join(ta.store, short)), /ENOENT/);
});

void test("a sparse file past the capture volume's limit fails the capture without evicting anyone's tree", async (t) => {
  const where = await testNode(t);
  const ta = await startAgent(t, where, { storeBudget: "256Mi" });
  const ns = await tempNamespace(t, "sparse");
  // Another team's unused tree: making room for the capture would evict it.
  const other = randomBytes(32).toString("hex");
  cleanupCache(t, shortHash(other), [ta.store]);
  await committedTree(ta.store, other);
  const model = `org/sparse-${ns}`;
  const leader = workerPod("leader", model, { manualReady: true, node: ta.node });
  leader.metadata!.annotations![ANN_CACHE_SIZE_LIMIT] = "16Mi";
  await createPod(ns, leader);
  const pod = await bound(ns, "leader");
  const short = shortHash(pod.metadata!.annotations![ANN_HASH]!);
  cleanupCache(t, short, [ta.store]);
  const dir = emptyDirPath(ta.kubeletRoot, pod.metadata!.uid!, CACHE_VOLUME);
  await writeCacheTree(dir);
  // 1 GiB that uses no block: within the kubelet's accounting, far past the volume's limit.
  await truncate(join(dir, "cache/huge.bin"), 1024 ** 3).catch(async () => {
    await writeFile(join(dir, "cache/huge.bin"), "");
    await truncate(join(dir, "cache/huge.bin"), 1024 ** 3);
  });
  await makeReady(ns, "leader");
  const { cache } = await watchCache(
    short,
    (c) => c.status?.phase === "Failed" || c.status?.phase === "Ready",
  );
  assert.equal(cache.status?.phase, "Failed", JSON.stringify(cache.status));
  assert.equal(cache.status?.reason, "CaptureFailed");
  assert.match(cache.status?.message ?? "", /sparse files count at their full size.*limit of 16\.8 MB/);
  await assert.rejects(stat(join(ta.store, short)), /ENOENT/, "nothing captured");
  assert.ok((await stat(join(ta.store, shortHash(other)))).isDirectory(), "the other tree stays");
  assert.equal(await metric(ta.agent, "warmstart_node_agent_store_evictions_total", ""), 0);
});

void test("a committed tree is served to peers: the record names this node's copy, and a peer's fetch is checked against the record's digest", async (t) => {
  const { custom } = await kube();
  const where = await testNode(t);
  // The node agents' CA and this agent's certificate, as the chart issues them.
  const ca = await createCA("warmstart node agents");
  const pem = await issueCert(ca, { commonName: where.node, ips: ["127.0.0.1"], usage: "both" });
  const peer = await issueCert(ca, { commonName: "another-node", usage: "client" });
  const dir = await mkdtemp(join(tmpdir(), "peer-tls-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const files = { peerCa: ca.cert, peerCert: pem.cert, peerKey: pem.key };
  for (const [k, v] of Object.entries(files)) await writeFile(join(dir, k), v);
  const ta = await startAgent(t, where, {
    ...Object.fromEntries(Object.keys(files).map((k) => [k, join(dir, k)])),
    peerPort: 0,
    peerAddress: "127.0.0.1",
    host: "127.0.0.1",
  });
  const ns = await tempNamespace(t, "peers");
  const { pod, tree } = await readyLeader(ta, ns, "leader", `org/peers-${ns}`);
  const hash = pod.metadata!.annotations![ANN_HASH]!;
  const short = shortHash(hash);
  cleanupCache(t, short, [where.store]);
  const cache = await waitFor("this node's copy on the record", async () => {
    const c = await getModelCache(custom, short);
    return c?.status?.phase === "Ready" && c.status.replicas?.[where.node] ? c : undefined;
  });
  const { url } = cache.status!.replicas![where.node]!;
  assert.match(url, /^https:\/\/127\.0\.0\.1:\d+$/);
  // Another node fetches the tree from it, checked against the digest the leader's agent wrote.
  const receiver = await mkdtemp(join(tmpdir(), "peer-store-"));
  t.after(() => rm(receiver, { recursive: true, force: true }));
  const fetch = (expectedManifestDigest: string, storeDir: string): Promise<{ totalBytes: number }> =>
    replicateTree({
      hash,
      expectedManifestDigest,
      sources: [{ node: where.node, url }],
      storeDir,
      tls: { ca: ca.cert, ...peer },
      durable: false,
    });
  await assert.rejects(fetch("0".repeat(64), receiver), /manifest/i, "a manifest the record does not name");
  const got = await fetch(cache.status!.manifestDigest!, receiver);
  assert.equal(got.totalBytes, tree.modelBytes + tree.cacheBytes);
  const copy = await readManifest(join(receiver, short));
  assert.equal(copy.fileCount, tree.files);
  assert.equal(manifestDigestOf(join(receiver, short)), cache.status!.manifestDigest);
});
