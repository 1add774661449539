/**
 * The release controller (`warmstart server`, run by the local cluster) on the real API server:
 * Ready releases every gated follower, a failed election is retired and re-run, orphans are
 * settled from the durable state, and a newer election's Lease is never deleted.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import * as k8s from "@kubernetes/client-node";
import { pino } from "pino";
import { kube, listPods, tempNamespace, waitFor, createWorkers } from "../harness.js";
import {
  ANN_ELECTION_ID,
  ANN_HASH,
  ANN_ROLE,
  LABEL_GATED,
  MODELCACHE,
  SCHEDULING_GATE,
  leaseName,
  shortHash,
} from "../../src/core/contract.js";
import { SYSTEM_NAMESPACE, isNotFound } from "../../src/common/kube.js";
import { retireLease } from "../../src/server/release.js";
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
});

test("an election past its deadline is retired and re-run", async (t) => {
  const ns = await tempNamespace(t, "deadline");
  const { hash } = await deployWorkers(ns, 2, `org/deadline-${ns}`);
  const short = shortHash(hash);
  await cleanup(t, short);
  const { coordination } = await kube();
  const lease = await coordination.readNamespacedLease({
    name: leaseName(hash),
    namespace: SYSTEM_NAMESPACE,
  });
  await coordination.patchNamespacedLease(
    {
      name: leaseName(hash),
      namespace: SYSTEM_NAMESPACE,
      body: {
        metadata: { annotations: { "warmstart.dev/deadline": new Date(Date.now() - 1000).toISOString() } },
      },
    },
    merge,
  );
  await waitFor(
    "a new Lease",
    async () => {
      const now = await coordination.readNamespacedLease({
        name: leaseName(hash),
        namespace: SYSTEM_NAMESPACE,
      });
      return now.metadata?.uid !== lease.metadata?.uid;
    },
    60_000,
  );
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
  const snap = (await (await fetch(`${url}/api/snapshot`)).json()) as {
    elections: { hash: string; followers: number }[];
    pods: { namespace: string; role: string }[];
  };
  assert.equal(snap.elections.find((e) => e.hash === shortHash(hash))?.followers, 1);
  assert.deepEqual(
    snap.pods
      .filter((p) => p.namespace === ns)
      .map((p) => p.role)
      .sort(),
    ["follower", "leader"],
  );
});
