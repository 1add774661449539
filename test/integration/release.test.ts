/**
 * The release controller (`warmstart server`, run by the local cluster) on the real API server:
 * Ready releases every gated follower, a failed election is retired and re-run, orphans are
 * settled from the durable state, and a newer election's Lease is never deleted.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as k8s from "@kubernetes/client-node";
import { pino } from "pino";
import { setTimeout as sleep } from "node:timers/promises";
import { randomBytes } from "node:crypto";
import { kube, listPods, tempNamespace, waitFor, createWorkers, gpuContainer } from "../harness.js";
import { FaultProxy } from "../fault-proxy.js";
import { pauseRole } from "../roles.js";
import {
  ANN_CACHE_SOURCE,
  ANN_DEADLINE,
  ANN_ELECTION_ID,
  ANN_HASH,
  ANN_REASON,
  ANN_RESTORE_FROM,
  ANN_RESTORE_RECORDED,
  ANN_ROLE,
  ANN_TREE,
  INIT_PREWARM,
  INIT_SEED,
  LABEL_GATED,
  LABEL_HASH,
  MODELCACHE,
  SCHEDULING_GATE,
  leaseName,
  shortHash,
} from "../../src/core/contract.js";
import { SYSTEM_NAMESPACE, isNotFound, makeApiClient } from "../../src/common/kube.js";
import { CacheRecords } from "../../src/common/cache-record.js";
import { reconcileHash, retireLease, type ReleaseDeps } from "../../src/server/release-controller/release.js";
import { ReleaseController } from "../../src/server/release-controller/controller.js";
import { createServerMetrics } from "../../src/server/metrics.js";
import { fetchSnapshot } from "../../src/server/dashboard/views.js";
import { ensureClaim, promoteClients } from "../../src/promote/claims.js";
import { CacheSourceSchema, encodeSource } from "../../src/promote/source.js";
import type { ModelCacheObject } from "../../src/common/modelcache.js";

const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
const ref = { group: MODELCACHE.group, version: MODELCACHE.version, plural: MODELCACHE.plural };
const role = (p: k8s.V1Pod): string | undefined => p.metadata?.annotations?.[ANN_ROLE];
const gated = (p: k8s.V1Pod): boolean =>
  (p.spec?.schedulingGates ?? []).some((g) => g.name === SCHEDULING_GATE);

async function deployWorkers(
  ns: string,
  replicas: number,
  model: string,
): Promise<{ hash: string; pods: k8s.V1Pod[] }> {
  // The leader stands for an engine still downloading: Running, not Ready.
  await createWorkers(ns, {
    replicas,
    args: ["--model", model],
    annotations: { "sim.warmstart.dev/manual-ready": "true" },
  });
  const pods = await waitFor(`${replicas} pods`, async () => {
    const items = await listPods(ns, "app=worker");
    return items.length === replicas ? items : undefined;
  });
  return { hash: pods[0]!.metadata!.annotations![ANN_HASH]!, pods };
}

async function cleanup(t: { after: (fn: () => Promise<void>) => void }, short: string): Promise<void> {
  const { custom, coordination } = await kube();
  t.after(async () => {
    await custom.deleteClusterCustomObject({ ...ref, name: short }).catch(() => undefined);
    await coordination
      .deleteNamespacedLease({ name: `warmstart-capture-${short}`, namespace: SYSTEM_NAMESPACE })
      .catch(() => undefined);
  });
}

async function setCachePhase(short: string, phase: string, reason = ""): Promise<void> {
  const { custom } = await kube();
  await custom.patchClusterCustomObjectStatus(
    { ...ref, name: short, body: { status: { phase, reason } } },
    merge,
  );
}

test("a Ready cache releases every gated follower and retires the election's Lease", async (t) => {
  const ns = await tempNamespace(t, "release");
  const { hash } = await deployWorkers(ns, 4, `org/release-${ns}`);
  const short = shortHash(hash);
  await cleanup(t, short);
  assert.equal((await listPods(ns, `${LABEL_GATED}=true`)).length, 3);

  await setCachePhase(short, "Ready");
  // Released: no gate, so the scheduler now considers them (here they wait for the cache's claim,
  // which promote creates on a real run; the gate no longer holds them).
  const released = await waitFor("followers released", async () => {
    const followers = (await listPods(ns, "app=worker")).filter((p) => role(p) === "follower");
    return followers.length === 3 &&
      followers.every(
        (p) =>
          !gated(p) &&
          p.status?.conditions?.find((c) => c.type === "PodScheduled")?.reason !== "SchedulingGated",
      )
      ? followers
      : undefined;
  });
  for (const p of released) assert.equal(p.metadata?.labels?.[LABEL_GATED], undefined, "gated label removed");
  const { coordination } = await kube();
  await waitFor("the Lease retired", async () => {
    try {
      await coordination.readNamespacedLease({ name: leaseName(hash), namespace: SYSTEM_NAMESPACE });
      return false;
    } catch (err) {
      return isNotFound(err);
    }
  });
});

test("a leader that goes away ends its election: Lease retired, followers evicted, a new leader elected", async (t) => {
  const ns = await tempNamespace(t, "reelect");
  const { hash, pods } = await deployWorkers(ns, 3, `org/reelect-${ns}`);
  const short = shortHash(hash);
  await cleanup(t, short);
  const { core, coordination } = await kube();
  const leader = pods.find((p) => role(p) === "leader")!;
  const oldLease = await coordination.readNamespacedLease({
    name: leaseName(hash),
    namespace: SYSTEM_NAMESPACE,
  });
  assert.equal(oldLease.spec?.holderIdentity, leader.metadata?.annotations?.[ANN_ELECTION_ID]);
  const before = new Set(pods.map((p) => p.metadata!.uid!));

  await core.deleteNamespacedPod({ name: leader.metadata!.name!, namespace: ns, gracePeriodSeconds: 0 });

  // Everything is replaced, and the replacements hold a new election with exactly one leader.
  const next = await waitFor(
    "a new election among replacement pods",
    async () => {
      const now = (await listPods(ns, "app=worker")).filter((p) => !p.metadata?.deletionTimestamp);
      if (now.length !== 3 || now.some((p) => before.has(p.metadata!.uid!))) return undefined;
      const lease = await coordination.readNamespacedLease({
        name: leaseName(hash),
        namespace: SYSTEM_NAMESPACE,
      });
      return lease.metadata?.uid !== oldLease.metadata?.uid ? { now, lease } : undefined;
    },
    60_000,
  );
  const leaders = next.now.filter((p) => role(p) === "leader");
  assert.equal(leaders.length, 1);
  assert.equal(next.lease.spec?.holderIdentity, leaders[0]!.metadata?.annotations?.[ANN_ELECTION_ID]);
  assert.equal(next.now.filter((p) => role(p) === "follower" && gated(p)).length, 2);
  const { custom } = await kube();
  const cache = (await custom.getClusterCustomObject({ ...ref, name: short })) as ModelCacheObject;
  assert.equal(
    cache.status?.failedCaptures ?? 0,
    0,
    "a leader that goes away is not a failed capture: admission never goes cold for it",
  );
  // The cluster's server counts the retirement by its reason, never by a message naming the pod.
  const st = await (await import("../harness.js")).localCluster();
  const metrics = await (await fetch(`${st!.roles.server}/metrics`)).text();
  const whys = [...metrics.matchAll(/^warmstart_server_elections_retired_total\{why="([^"]*)"\}/gm)].map(
    (m) => m[1],
  );
  assert.ok(whys.includes("LeaderGone"), `retired by reason: ${whys.join(", ")}`);
  for (const why of whys) assert.match(why!, /^[A-Z][A-Za-z]+$/, "a bounded reason, not a message");
});

test("an orphaned follower (no Lease) is released when its cache is Ready", async (t) => {
  const ns = await tempNamespace(t, "orphan");
  const { hash } = await deployWorkers(ns, 2, `org/orphan-${ns}`);
  const short = shortHash(hash);
  await cleanup(t, short);
  const { coordination } = await kube();
  // The cache turns Ready and the Lease disappears in one go: only the orphan path can release it.
  await setCachePhase(short, "Capturing");
  await coordination.deleteNamespacedLease({ name: leaseName(hash), namespace: SYSTEM_NAMESPACE });
  await new Promise((r) => setTimeout(r, 500));
  assert.equal(
    (await listPods(ns, `${LABEL_GATED}=true`)).length,
    1,
    "capture in progress: the orphan waits",
  );
  await setCachePhase(short, "Ready");
  await waitFor("the orphan released", async () =>
    (await listPods(ns, "app=worker")).every((p) => !gated(p)),
  );
});

test("retiring a Lease never deletes a newer election's Lease of the same name", async (t) => {
  const { coordination } = await kube();
  const name = `warmstart-capture-${"f".repeat(10)}${Date.now().toString(16).slice(-6)}`;
  const body = (holder: string): k8s.V1Lease => ({
    metadata: { name, namespace: SYSTEM_NAMESPACE },
    spec: { holderIdentity: holder },
  });
  const old = await coordination.createNamespacedLease({ namespace: SYSTEM_NAMESPACE, body: body("old") });
  await coordination.deleteNamespacedLease({ name, namespace: SYSTEM_NAMESPACE });
  await coordination.createNamespacedLease({ namespace: SYSTEM_NAMESPACE, body: body("new") });
  t.after(() =>
    coordination.deleteNamespacedLease({ name, namespace: SYSTEM_NAMESPACE }).then(
      () => undefined,
      () => undefined,
    ),
  );
  const result = await retireLease(
    {
      core: undefined as never,
      custom: undefined as never,
      coordination,
      systemNamespace: SYSTEM_NAMESPACE,
      log: pino({ level: "silent" }),
      now: Date.now,
      leaderGraceMs: 0,
      recheckMs: 0,
    },
    old,
    "test",
  );
  assert.equal(result, "newer");
  const still = await coordination.readNamespacedLease({ name, namespace: SYSTEM_NAMESPACE });
  assert.equal(still.spec?.holderIdentity, "new");
});

test("the dashboard and the operators' API show caches, elections and pods", async (t) => {
  const st = await (await import("../harness.js")).localCluster();
  const url = st?.roles.server;
  assert.ok(url, "the local cluster runs the server");
  const ns = await tempNamespace(t, "views");
  const { hash } = await deployWorkers(ns, 2, `org/views-${ns}`);
  await cleanup(t, shortHash(hash));
  const page = await fetch(url);
  assert.equal(page.status, 200);
  assert.match(await page.text(), /Time to ready/);
  type Snapshot = {
    elections: { hash: string; followers: number }[];
    pods: { namespace: string; role: string }[];
  };
  // Served from the server's informers: the pods just made show up once their watch events do.
  const snap = await waitFor("the snapshot to show the election's follower", async () => {
    const s = (await (await fetch(`${url}/api/snapshot`)).json()) as Snapshot;
    return s.elections.find((e) => e.hash === shortHash(hash))?.followers === 1 ? s : undefined;
  });
  assert.deepEqual(
    snap.pods
      .filter((p) => p.namespace === ns)
      .map((p) => p.role)
      .sort(),
    ["follower", "leader"],
  );
});

// ---------------------------------------------------------------------------------------------
// Races, run by an in-process reconcile while the cluster's own server is held still, so the
// interleaving each test injects (a fault, a hook) is the only one that happens.

const silent = pino({ level: "silent" });

function deps(kc: k8s.KubeConfig, extra: Partial<ReleaseDeps> = {}): ReleaseDeps {
  return {
    core: makeApiClient(kc, k8s.CoreV1Api),
    coordination: makeApiClient(kc, k8s.CoordinationV1Api),
    custom: makeApiClient(kc, k8s.CustomObjectsApi),
    systemNamespace: SYSTEM_NAMESPACE,
    log: process.env.LOG_LEVEL ? pino({ level: process.env.LOG_LEVEL }) : silent,
    now: Date.now,
    leaderGraceMs: 30_000,
    recheckMs: 500,
    ...extra,
  };
}

/** What the node agent writes when a capture fails (counted once for its election). */
async function captureFailed(short: string, election: string): Promise<void> {
  const { custom } = await kube();
  const r = await new CacheRecords(custom).fail(short, election, "CaptureFailed", "no space left on device");
  assert.ok(r?.written, "the capture failure was recorded");
}

async function getCache(short: string): Promise<ModelCacheObject> {
  const { custom } = await kube();
  return (await custom.getClusterCustomObject({ ...ref, name: short })) as ModelCacheObject;
}

async function leaseOf(hash: string): Promise<k8s.V1Lease | undefined> {
  const { coordination } = await kube();
  return coordination
    .readNamespacedLease({ name: leaseName(hash), namespace: SYSTEM_NAMESPACE })
    .catch((err: unknown) => {
      if (isNotFound(err)) return undefined;
      throw err;
    });
}

async function podEvents(ns: string, name: string): Promise<k8s.CoreV1Event[]> {
  const { core } = await kube();
  return (await core.listNamespacedEvent({ namespace: ns, fieldSelector: `involvedObject.name=${name}` }))
    .items;
}

test("a retirement retried after API errors counts the election's failed capture once", async (t) => {
  await pauseRole(t, "server");
  const { kc } = await kube();
  const proxy = await FaultProxy.start(kc);
  t.after(() => proxy.close());
  const ns = await tempNamespace(t, "retry-retire");
  const { hash, pods } = await deployWorkers(ns, 3, `org/retry-retire-${ns}`);
  const short = shortHash(hash);
  await cleanup(t, short);
  const election = pods.find((p) => role(p) === "leader")!.metadata!.annotations![ANN_ELECTION_ID]!;
  await captureFailed(short, election);
  const fault = proxy.inject({
    method: "DELETE",
    path: new RegExp(`/leases/${leaseName(hash)}$`),
    times: 2,
    status: [500, 503],
  });
  const d = deps(proxy.kubeConfig());
  await assert.rejects(reconcileHash(short, d), /retiring Lease/);
  await assert.rejects(reconcileHash(short, d), /retiring Lease/);
  const between = await getCache(short);
  assert.equal(between.status?.phase, "Failed");
  assert.equal(between.status?.reason, "CaptureFailed", "the capture's own word stands");
  assert.equal(between.status?.failedCaptures, 1);
  await reconcileHash(short, d);
  assert.equal(fault.hits, 2);
  assert.notEqual((await leaseOf(hash))?.spec?.holderIdentity, election, "retired");
  // The evicted followers' replacements may have started the next election: the count stays.
  const cache = await getCache(short);
  assert.equal(cache.status?.failedCaptures, 1, "three passes over one failed election count it once");
  assert.equal(cache.status?.lastFailedElection, election);
});

test("a leader created and recorded while the pass lists pods is not taken for gone: its election stays", async (t) => {
  await pauseRole(t, "server");
  const { kc, core, custom } = await kube();
  const ns = await tempNamespace(t, "late-leader");
  const body: k8s.V1Pod = {
    metadata: { name: "leader", annotations: { "sim.warmstart.dev/manual-ready": "true" } },
    spec: { containers: [gpuContainer("vllm", ["--model", `org/late-leader-${ns}`])] },
  };
  // A dry run is admitted with the pod's hash and no election: the hash the pass is about.
  const dry = await core.createNamespacedPod({ namespace: ns, body, dryRun: "All" });
  const hash = dry.metadata!.annotations![ANN_HASH]!;
  const short = shortHash(hash);
  await cleanup(t, short);
  await reconcileHash(
    short,
    deps(kc, {
      // The leader is admitted (Lease, record), created, and recorded by UID only now.
      afterPodsListed: async () => {
        const pod = await core.createNamespacedPod({ namespace: ns, body });
        assert.equal(role(pod), "leader");
        const claim = await new CacheRecords(custom).claimLeader(
          short,
          pod.metadata!.annotations![ANN_ELECTION_ID]!,
          pod.metadata!.uid!,
        );
        assert.ok(claim.ok, "the leader is recorded");
      },
    }),
  );
  const lease = await leaseOf(hash);
  assert.ok(lease, "the election's Lease stays");
  const cache = await getCache(short);
  assert.equal(cache.status?.phase, "Electing", "the election goes on");
  assert.equal(cache.status?.failedCaptures ?? 0, 0);
});

test("a pod of another namespace wearing the election's id is never recorded as its leader", async (t) => {
  await pauseRole(t, "server");
  const { kc, core } = await kube();
  const ns = await tempNamespace(t, "copy-id");
  const leader = await core.createNamespacedPod({
    namespace: ns,
    body: {
      metadata: { name: "leader" },
      spec: {
        containers: [gpuContainer("vllm", ["--model", `org/copy-id-${ns}`])],
        schedulingGates: [{ name: "test/hold" }],
      },
    },
  });
  assert.equal(role(leader), "leader");
  const hash = leader.metadata!.annotations![ANN_HASH]!;
  const short = shortHash(hash);
  await cleanup(t, short);
  // A pod the webhook never saw (kube-system) wears the public election id; the real leader goes.
  const name = `copy-id-${short}`;
  const forger = await core.createNamespacedPod({
    namespace: "kube-system",
    body: {
      metadata: {
        name,
        labels: { [LABEL_HASH]: short },
        annotations: {
          [ANN_HASH]: hash,
          [ANN_ROLE]: "leader",
          [ANN_ELECTION_ID]: leader.metadata!.annotations![ANN_ELECTION_ID]!,
        },
      },
      spec: { containers: [gpuContainer("vllm")], schedulingGates: [{ name: "test/hold" }] },
    },
  });
  t.after(() =>
    core.deleteNamespacedPod({ namespace: "kube-system", name }).then(
      () => undefined,
      () => undefined,
    ),
  );
  await core.deleteNamespacedPod({ namespace: ns, name: "leader", gracePeriodSeconds: 0 });
  await waitFor("the leader gone", async () => (await listPods(ns)).length === 0);
  await reconcileHash(short, deps(kc));
  const cache = await getCache(short);
  assert.notEqual(cache.status?.leaderUid, forger.metadata!.uid, "the copy is not the leader");
  assert.equal(cache.status?.leaderUid, undefined);
  // Nor does the copy keep the election alive once the leader's grace is over.
  await reconcileHash(short, deps(kc, { now: () => Date.now() + 60_000 }));
  assert.equal(await leaseOf(hash), undefined, "leader gone: the election's Lease retired");
});

test("an election past its deadline: Failed (DeadlinePassed, not counted), Lease retired, followers evicted, a replacement leads the next", async (t) => {
  await pauseRole(t, "server");
  const { kc, coordination } = await kube();
  const ns = await tempNamespace(t, "deadline2");
  const { hash, pods } = await deployWorkers(ns, 3, `org/deadline2-${ns}`);
  const short = shortHash(hash);
  await cleanup(t, short);
  const lease = (await leaseOf(hash))!;
  await coordination.patchNamespacedLease(
    {
      name: leaseName(hash),
      namespace: SYSTEM_NAMESPACE,
      body: { metadata: { annotations: { [ANN_DEADLINE]: new Date(Date.now() - 1000).toISOString() } } },
    },
    merge,
  );
  // What the record says as the followers are evicted (their replacements start the next election).
  let failed: ModelCacheObject | undefined;
  await reconcileHash(
    short,
    deps(kc, {
      beforeEvict: async () => {
        failed ??= await getCache(short);
      },
    }),
  );
  assert.equal(failed?.status?.phase, "Failed");
  assert.equal(failed.status?.reason, "DeadlinePassed");
  assert.equal(failed.status?.failedCaptures ?? 0, 0, "a deadline is not a failed capture");
  assert.equal(failed.status?.electionId, lease.spec?.holderIdentity, "written for the election that ended");
  assert.notEqual((await leaseOf(hash))?.metadata?.uid, lease.metadata?.uid, "the Lease is retired");
  const followers = pods.filter((p) => role(p) === "follower").map((p) => p.metadata!.uid!);
  await waitFor("the followers evicted and replaced, one of them leading a new election", async () => {
    const now = (await listPods(ns, "app=worker")).filter((p) => !p.metadata?.deletionTimestamp);
    const next = await leaseOf(hash);
    if (!next || next.metadata?.uid === lease.metadata?.uid) return undefined;
    if (now.some((p) => followers.includes(p.metadata!.uid!))) return undefined;
    const leader = now.find((p) => p.metadata?.annotations?.[ANN_ELECTION_ID] === next.spec?.holderIdentity);
    return leader && !followers.includes(leader.metadata!.uid!) ? leader : undefined;
  });
});

test("controller replacement during eviction: a pod recreated under the same name is never evicted (UID precondition)", async (t) => {
  await pauseRole(t, "server");
  const { kc, apps, core } = await kube();
  const ns = await tempNamespace(t, "sts");
  const model = `org/sts-${ns}`;
  // A StatefulSet names its pods worker-0, worker-1: a replacement comes back under the same name.
  await apps.createNamespacedStatefulSet({
    namespace: ns,
    body: {
      metadata: { name: "worker" },
      spec: {
        replicas: 2,
        podManagementPolicy: "Parallel",
        serviceName: "worker",
        selector: { matchLabels: { app: "worker" } },
        template: {
          metadata: { labels: { app: "worker" }, annotations: { "sim.warmstart.dev/manual-ready": "true" } },
          spec: { containers: [gpuContainer("vllm", ["--model", model])] },
        },
      },
    },
  });
  const pods = await waitFor("2 pods", async () => {
    const items = await listPods(ns, "app=worker");
    return items.length === 2 ? items : undefined;
  });
  const hash = pods[0]!.metadata!.annotations![ANN_HASH]!;
  const short = shortHash(hash);
  await cleanup(t, short);
  const leader = pods.find((p) => role(p) === "leader")!;
  const follower = pods.find((p) => role(p) === "follower")!;
  await captureFailed(short, leader.metadata!.annotations![ANN_ELECTION_ID]!);

  let replacement: k8s.V1Pod | undefined;
  await reconcileHash(
    short,
    deps(kc, {
      // The pod goes away and its controller recreates it, between the list and the eviction.
      beforeEvict: async (p) => {
        await core.deleteNamespacedPod({ namespace: ns, name: p.metadata!.name!, gracePeriodSeconds: 0 });
        replacement = await waitFor("the StatefulSet's replacement", async () => {
          const x = await core.readNamespacedPod({ namespace: ns, name: p.metadata!.name! });
          return x.metadata?.uid !== p.metadata?.uid && !x.metadata?.deletionTimestamp ? x : undefined;
        });
      },
    }),
  );
  assert.ok(replacement, "the hook ran");
  const after = await core.readNamespacedPod({ namespace: ns, name: follower.metadata!.name! });
  assert.equal(after.metadata?.uid, replacement.metadata?.uid, "the replacement is still there");
  assert.equal(after.metadata?.deletionTimestamp, undefined, "and was not evicted");
  // It was admitted after the retirement: it leads the next election, which the eviction would have killed.
  assert.equal(role(after), "leader");
  assert.equal((await leaseOf(hash))?.spec?.holderIdentity, after.metadata?.annotations?.[ANN_ELECTION_ID]);
});

test("a follower without a controller is left gated with a Warning when its election fails", async (t) => {
  await pauseRole(t, "server");
  const { kc, core } = await kube();
  const ns = await tempNamespace(t, "stranded");
  const model = `org/stranded-${ns}`;
  const make = async (name: string): Promise<k8s.V1Pod> =>
    core.createNamespacedPod({
      namespace: ns,
      body: {
        metadata: { name, annotations: { "sim.warmstart.dev/manual-ready": "true" } },
        spec: { containers: [gpuContainer("vllm", ["--model", model])] },
      },
    });
  const leader = await make("leader");
  const follower = await make("follower");
  assert.equal(role(leader), "leader");
  assert.equal(role(follower), "follower");
  const hash = leader.metadata!.annotations![ANN_HASH]!;
  const short = shortHash(hash);
  await cleanup(t, short);
  await captureFailed(short, leader.metadata!.annotations![ANN_ELECTION_ID]!);
  await reconcileHash(short, deps(kc));
  assert.equal(await leaseOf(hash), undefined, "the election is retired");
  const still = await core.readNamespacedPod({ namespace: ns, name: "follower" });
  assert.equal(still.metadata?.uid, follower.metadata?.uid);
  assert.ok(gated(still), "left gated: nothing would recreate it");
  const ev = await waitFor("the WarmstartStranded warning", async () =>
    (await podEvents(ns, "follower")).find((e) => e.reason === "WarmstartStranded"),
  );
  assert.equal(ev.type, "Warning");
  assert.match(ev.message ?? "", /no controller.*delete and recreate it/);
});

for (const state of ["Failed", "missing"] as const) {
  test(`an orphaned follower (no Lease) whose cache is ${state} is evicted and re-elected`, async (t) => {
    await pauseRole(t, "server");
    const { kc, coordination, custom } = await kube();
    const ns = await tempNamespace(t, `orphan-${state.toLowerCase()}`);
    const { hash, pods } = await deployWorkers(ns, 2, `org/orphan-${state}-${ns}`);
    const short = shortHash(hash);
    await cleanup(t, short);
    const follower = pods.find((p) => role(p) === "follower")!;
    await coordination.deleteNamespacedLease({ name: leaseName(hash), namespace: SYSTEM_NAMESPACE });
    if (state === "Failed") await setCachePhase(short, "Failed", "PromoteFailed");
    else await custom.deleteClusterCustomObject({ ...ref, name: short });
    await reconcileHash(short, deps(kc));
    await waitFor("the orphan evicted and replaced", async () => {
      const now = await listPods(ns, "app=worker");
      return !now.some((p) => p.metadata?.uid === follower.metadata?.uid);
    });
    await waitFor("a new election", async () => (await leaseOf(hash)) !== undefined);
  });
}

test("an orphan whose capture is in progress waits", async (t) => {
  await pauseRole(t, "server");
  const { kc, coordination } = await kube();
  const ns = await tempNamespace(t, "orphan-wait");
  const { hash, pods } = await deployWorkers(ns, 2, `org/orphan-wait-${ns}`);
  const short = shortHash(hash);
  await cleanup(t, short);
  await setCachePhase(short, "Capturing");
  await coordination.deleteNamespacedLease({ name: leaseName(hash), namespace: SYSTEM_NAMESPACE });
  const r = await reconcileHash(short, deps(kc));
  assert.ok(r.requeueAfterMs, "looked at again later");
  const follower = pods.find((p) => role(p) === "follower")!;
  const now = await listPods(ns, "app=worker");
  assert.ok(
    now.some((p) => p.metadata?.uid === follower.metadata?.uid && gated(p)),
    "still waiting, gated",
  );
});

test("a server restarted in the middle of an election picks it up from the cluster: released on Ready", async (t) => {
  await pauseRole(t, "server");
  const { kc } = await kube();
  const ns = await tempNamespace(t, "restart");
  const { hash } = await deployWorkers(ns, 3, `org/restart-${ns}`);
  const short = shortHash(hash);
  await cleanup(t, short);
  const start = (): ReleaseController => {
    const c = new ReleaseController({
      kc,
      systemNamespace: SYSTEM_NAMESPACE,
      log: silent,
      metrics: createServerMetrics(),
      recheckMs: 500,
      resyncMs: 2_000,
    });
    c.start();
    return c;
  };
  const first = start();
  await waitFor("the first server sees the election", () =>
    first.cached()?.leases.some((l) => l.metadata?.name === leaseName(hash)),
  );
  await first.stop();
  // While no server runs, the cache turns Ready.
  await setCachePhase(short, "Ready");
  await sleep(300);
  assert.equal((await listPods(ns, `${LABEL_GATED}=true`)).length, 2, "nobody released them meanwhile");
  const second = start();
  t.after(() => second.stop());
  await waitFor("the followers released by the restarted server", async () =>
    (await listPods(ns, "app=worker")).every((p) => !gated(p)),
  );
  await waitFor("the Lease retired", async () => (await leaseOf(hash)) === undefined);
});

test("a released follower gets the tree's folder of a shared-volume source (warmstart.dev/tree)", async (t) => {
  await pauseRole(t, "server");
  const { kc, custom } = await kube();
  const ns = await tempNamespace(t, "tree");
  const { hash } = await deployWorkers(ns, 2, `org/tree-${ns}`);
  const short = shortHash(hash);
  await cleanup(t, short);
  const source = CacheSourceSchema.parse({
    backend: "shared-volume",
    provisioner: "nfs.csi.k8s.io",
    sizeBytes: 5_000,
    driver: "nfs.csi.k8s.io",
    volumeHandle: "nas#/exports",
    subPath: `store/${short}`,
  });
  await custom.patchClusterCustomObject(
    {
      ...ref,
      name: short,
      body: { metadata: { annotations: { [ANN_CACHE_SOURCE]: encodeSource(source) } } },
    },
    merge,
  );
  await setCachePhase(short, "Ready");
  await reconcileHash(short, deps(kc, { now: () => Date.now() + 60_000 }));
  const follower = (await listPods(ns, "app=worker")).find((p) => role(p) === "follower")!;
  assert.ok(!gated(follower), "released");
  assert.equal(follower.metadata?.annotations?.[ANN_TREE], `store/${short}`);
});

test("each restore's benefit is counted on the record when it turns Ready, once, and outlives the pod", async (t) => {
  const { kc, core, custom } = await kube();
  const ns = await tempNamespace(t, "benefit");
  const { hash, pods } = await deployWorkers(ns, 3, `org/benefit-${ns}`);
  const short = shortHash(hash);
  await cleanup(t, short);
  // A claim the released followers can mount (a host-path volume on gpu-0; simulated pods need no data).
  const source = CacheSourceSchema.parse({
    backend: "host-path",
    provisioner: "warmstart.dev/host-path",
    sizeBytes: 4096,
    node: "gpu-0",
    path: `/var/lib/warmstart/store/${short}`,
  });
  assert.equal(await ensureClaim(promoteClients(kc), short, source, ns), "created");
  t.after(async () => {
    for (const pv of (await core.listPersistentVolume({ labelSelector: `${LABEL_HASH}=${short}` })).items)
      await core.deletePersistentVolume({ name: pv.metadata!.name! }).catch(() => undefined);
  });
  await custom.patchClusterCustomObjectStatus(
    {
      ...ref,
      name: short,
      body: {
        status: {
          phase: "Ready",
          reason: "Promoted",
          leaderReadySeconds: 600,
          modelBytes: 1_000_000,
          sizeBytes: 1_200_000,
        },
      },
    },
    merge,
  );
  const followers = pods.filter((p) => role(p) === "follower");
  await waitFor(
    "the followers released and running",
    async () =>
      (await listPods(ns, "app=worker")).filter(
        (p) => role(p) === "follower" && p.status?.phase === "Running",
      ).length === 2,
    60_000,
  );
  const [a, b] = followers as [k8s.V1Pod, k8s.V1Pod];
  await core.patchNamespacedPod(
    {
      namespace: ns,
      name: a.metadata!.name!,
      body: { metadata: { annotations: { "sim.warmstart.dev/ready": "true" } } },
    },
    merge,
  );
  const one = await waitFor("the first restore counted", async () => {
    const c = await getCache(short);
    return c.status?.restores === 1 ? c : undefined;
  });
  const s1 = one.status!;
  assert.equal(s1.savedBytes, 1_000_000, "the model bytes it did not download");
  const ready = await core.readNamespacedPod({ namespace: ns, name: a.metadata!.name! });
  const cond = (type: string): number =>
    new Date(
      ready.status!.conditions!.find((c) => c.type === type && c.status === "True")!.lastTransitionTime!,
    ).getTime();
  const expected = (cond("Ready") - cond("PodScheduled")) / 1000;
  assert.equal(s1.recentRestores?.[0]?.uid, a.metadata!.uid);
  assert.equal(s1.recentRestores?.[0]?.role, "follower");
  assert.ok(
    Math.abs(s1.recentRestores[0].readySeconds - expected) < 0.11,
    "timed from its release, not its admission",
  );
  assert.equal(s1.savedSeconds, Math.round((600 - s1.recentRestores[0].readySeconds) * 10) / 10);
  assert.ok(s1.lastRestoredAt);
  await waitFor(
    "the pod marked as counted",
    async () =>
      (await core.readNamespacedPod({ namespace: ns, name: a.metadata!.name! })).metadata?.annotations?.[
        ANN_RESTORE_RECORDED
      ],
  );

  // Its author renames the cache it restores from on the running pod (restore-from stays the
  // author's to edit): its restore is still booked on the cache its claim mounts, not the decoy.
  const decoy = randomBytes(32).toString("hex");
  await cleanup(t, shortHash(decoy));
  await custom.createClusterCustomObject({
    ...ref,
    body: {
      apiVersion: `${ref.group}/${ref.version}`,
      kind: MODELCACHE.kind,
      metadata: { name: shortHash(decoy) },
      spec: { hash: decoy },
    },
  });
  await custom.patchClusterCustomObjectStatus(
    { ...ref, name: shortHash(decoy), body: { status: { phase: "Ready", reason: "Promoted" } } },
    merge,
  );
  await core.patchNamespacedPod(
    {
      namespace: ns,
      name: b.metadata!.name!,
      body: {
        metadata: {
          annotations: { "sim.warmstart.dev/ready": "true", [ANN_RESTORE_FROM]: shortHash(decoy) },
        },
      },
    },
    merge,
  );
  await waitFor("the second restore counted", async () => (await getCache(short)).status?.restores === 2);
  assert.equal((await getCache(shortHash(decoy))).status?.restores, undefined, "nothing booked on the decoy");
  // The pods go; what they saved stays on the record, and the views read it from there.
  const { apps } = await kube();
  await apps.deleteNamespacedDeployment({ namespace: ns, name: "worker" });
  await waitFor("the pods gone", async () => (await listPods(ns, "app=worker")).length === 0, 60_000);
  const view = (await fetchSnapshot(kc, SYSTEM_NAMESPACE)).caches.find((c) => c.hash === short)!;
  assert.equal(view.restores, 2);
  assert.equal(view.savedBytes, 2_000_000);
  assert.ok(view.savedSeconds > 0 && view.restoredReadySeconds !== null);
  assert.equal((await getCache(short)).status?.restores, 2, "never counted twice");
});

test("a gated follower prewarms its cache after seeding (store profile: 6 readers), unless its own WARMSTART_PREWARM=0 says not to", async (t) => {
  const { core } = await kube();
  const ns = await tempNamespace(t, "prewarm");
  const model = `org/prewarm-${ns}`;
  const { hash, pods } = await deployWorkers(ns, 2, model);
  await cleanup(t, shortHash(hash));
  const follower = pods.find((p) => role(p) === "follower")!;
  const inits = follower.spec?.initContainers ?? [];
  assert.deepEqual(
    inits.map((c) => c.name),
    [INIT_SEED, INIT_PREWARM],
  );
  assert.deepEqual(inits[1]!.args?.slice(-2), ["--parallel", "6"]);
  assert.ok(
    inits[1]!.volumeMounts?.every((m) => m.readOnly),
    "prewarm only reads the cache",
  );
  // Same model, same hash inputs except the pod's own prewarm switch.
  const off = await core.createNamespacedPod({
    namespace: ns,
    body: {
      metadata: { name: "no-prewarm" },
      spec: {
        containers: [
          { ...gpuContainer("vllm", ["--model", model]), env: [{ name: "WARMSTART_PREWARM", value: "0" }] },
        ],
      },
    },
  });
  assert.equal(role(off), "follower", off.metadata?.annotations?.[ANN_HASH]);
  assert.deepEqual(
    (off.spec?.initContainers ?? []).map((c) => c.name),
    [INIT_SEED],
  );
});

test("a leader evicted for its cache volume's size ends its election as a failed capture, counted once", async (t) => {
  await pauseRole(t, "server");
  const { kc, core } = await kube();
  const ns = await tempNamespace(t, "toolarge");
  const { hash, pods } = await deployWorkers(ns, 2, `org/toolarge-${ns}`);
  const short = shortHash(hash);
  await cleanup(t, short);
  const leader = pods.find((p) => role(p) === "leader")!;
  // What the kubelet writes when the capture volume outgrows its limit.
  await core.patchNamespacedPodStatus(
    {
      namespace: ns,
      name: leader.metadata!.name!,
      body: {
        status: {
          phase: "Failed",
          reason: "Evicted",
          message: 'Usage of EmptyDir volume "warmstart-cache" exceeds the limit "16Mi". ',
        },
      },
    },
    merge,
  );
  let failed: ModelCacheObject | undefined;
  await reconcileHash(short, deps(kc, { beforeEvict: async () => void (failed ??= await getCache(short)) }));
  failed ??= await getCache(short);
  assert.equal(failed?.status?.phase, "Failed", JSON.stringify(failed?.status));
  assert.equal(failed.status?.reason, "CaptureFailed");
  assert.match(failed.status?.message ?? "", /^CacheTooLarge: cache larger than its size limit: /);
  assert.equal(failed.status?.failedCaptures, 1, "counted: an oversized model is not re-elected forever");
  const warned = await waitFor("a Warning on the leader", async () =>
    (await podEvents(ns, leader.metadata!.name!)).find((e) => e.reason === "WarmstartCacheTooLarge"),
  );
  assert.equal(warned.type, "Warning");
});

// The kubelet's words when it evicts a pod for the node's disk (pkg/kubelet/eviction/helpers.go).
const DISK_PRESSURE =
  "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, available: 512Mi. Container vllm was using 30Gi, request is 0, has larger consumption of ephemeral-storage. ";

/** What the kubelet writes on a pod it evicts for node pressure (the object stays). */
async function evictForDiskPressure(namespace: string, name: string): Promise<void> {
  const { core } = await kube();
  await core.patchNamespacedPodStatus(
    {
      namespace,
      name,
      body: {
        status: {
          phase: "Failed",
          reason: "Evicted",
          message: DISK_PRESSURE,
          conditions: [
            {
              type: "DisruptionTarget",
              status: "True",
              reason: "TerminationByKubelet",
              message: DISK_PRESSURE,
              lastTransitionTime: new Date().toISOString(),
            },
          ],
        },
      },
    },
    k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.StrategicMergePatch),
  );
}

test("a leader evicted for node disk pressure ends its election as a failed capture, counted once, with a Warning", async (t) => {
  await pauseRole(t, "server");
  const { kc, core } = await kube();
  const ns = await tempNamespace(t, "evicted");
  const { hash, pods } = await deployWorkers(ns, 2, `org/evicted-${ns}`);
  const short = shortHash(hash);
  await cleanup(t, short);
  const leader = pods.find((p) => role(p) === "leader")!;
  const election = leader.metadata!.annotations![ANN_ELECTION_ID]!;
  await evictForDiskPressure(ns, leader.metadata!.name!);
  let failed: ModelCacheObject | undefined;
  await reconcileHash(short, deps(kc, { beforeEvict: async () => void (failed ??= await getCache(short)) }));
  failed ??= await getCache(short);
  assert.equal(failed.status?.phase, "Failed", JSON.stringify(failed.status));
  assert.equal(failed.status?.reason, "CaptureFailed", "the reason admission counts");
  assert.match(
    failed.status?.message ?? "",
    new RegExp(`^LeaderEvicted: node disk pressure: leader pod ${ns}/${leader.metadata!.name!} evicted`),
  );
  assert.equal(failed.status?.failedCaptures, 1, "counted: the next leader would fill the disk again");
  assert.equal(failed.status?.lastFailedElection, election);
  assert.notEqual((await leaseOf(hash))?.spec?.holderIdentity, election, "the election is retired");

  const onPod = await waitFor("a Warning on the evicted leader", async () =>
    (await podEvents(ns, leader.metadata!.name!)).find((e) => e.reason === "WarmstartLeaderEvicted"),
  );
  assert.equal(onPod.type, "Warning");
  assert.match(
    onPod.message ?? "",
    /node disk pressure.*Counted as failed capture 1 of cache .*max-failed-captures/,
  );
  const onRecord = await core.listNamespacedEvent({
    namespace: "default",
    fieldSelector: `involvedObject.name=${short},reason=WarmstartLeaderEvicted`,
  });
  assert.equal(onRecord.items.length, 1, "and on the record, where kubectl describe modelcache shows it");

  // Another pass over the same election (a retried retirement) counts nothing more.
  await reconcileHash(short, deps(kc));
  assert.equal((await getCache(short)).status?.failedCaptures, 1);
});

test("leaders evicted election after election: past --max-failed-captures the hash's pods start cold, saying why", async (t) => {
  await pauseRole(t, "server");
  const { kc } = await kube();
  const ns = await tempNamespace(t, "evict-loop");
  const { hash } = await deployWorkers(ns, 2, `org/evict-loop-${ns}`);
  const short = shortHash(hash);
  await cleanup(t, short);
  // An evicted pod stays, Failed, beside the replacement its ReplicaSet makes.
  const live = (p: k8s.V1Pod): boolean => p.status?.phase !== "Failed" && !p.metadata?.deletionTimestamp;
  const ended = new Set<string>();
  for (let round = 1; ; round++) {
    assert.ok(round <= 6, `still electing after ${round - 1} evicted leaders`);
    const next = await waitFor(
      `round ${round}: a new election's leader, or pods admitted cold`,
      async () => {
        const now = (await listPods(ns, "app=worker")).filter(live);
        const cold = now.find((p) => role(p) === "cold");
        if (cold) return { cold };
        const holder = (await leaseOf(hash))?.spec?.holderIdentity;
        if (!holder || ended.has(holder)) return undefined;
        const leader = now.find(
          (p) => role(p) === "leader" && p.metadata?.annotations?.[ANN_ELECTION_ID] === holder,
        );
        return leader ? { leader, holder } : undefined;
      },
      60_000,
    );
    if ("cold" in next) {
      const cache = await getCache(short);
      assert.equal(cache.status?.failedCaptures, round - 1, "one count per evicted leader");
      assert.ok(round > 1);
      assert.match(
        next.cold?.metadata?.annotations?.[ANN_REASON] ?? "",
        /capture failed \d+ times \(last: LeaderEvicted: node disk pressure/,
      );
      assert.equal(await leaseOf(hash), undefined, "no election any more");
      break;
    }
    ended.add(next.holder);
    await evictForDiskPressure(ns, next.leader.metadata!.name!);
    await reconcileHash(short, deps(kc));
  }
});
