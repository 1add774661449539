import assert from "node:assert/strict";
import { test } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { FakeClock, memoryLogger } from "../../../test/support/testing.js";
import type { ModelCacheObject } from "../../common/modelcache.js";
import {
  ANN_DEADLINE,
  ANN_ELECTION_ID,
  ANN_REASON,
  ANN_ROLE,
  FINALIZER_CLEANUP,
  INIT_SEED,
  LABEL_GATED,
  LABEL_HASH,
  LABEL_WAITING,
  SCHEDULING_GATE,
  leaseName,
} from "../../core/contract.js";
import { electionFailure, reconcileHash, type ElectionEnd, type ReleaseDeps } from "./release.js";

const T0 = Date.parse("2026-12-01T12:00:00Z");
const SHORT = "0123456789abcdef";
const NS = "warmstart-system";
const DISK = "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, available: 512Mi. ";

const notFound = (): Error =>
  Object.assign(new Error("not found"), { code: 404, body: { reason: "NotFound" } });
/** A fake API call: its body runs now, its answer (or its error) comes as a promise. */
const api =
  <A extends unknown[], R>(f: (...a: A) => R) =>
  (...a: A): Promise<R> => {
    try {
      return Promise.resolve(f(...a));
    } catch (err) {
      return Promise.reject(err instanceof Error ? err : new Error(String(err)));
    }
  };
const conflict = (): Error =>
  Object.assign(new Error("conflict"), { code: 409, body: { reason: "Conflict" } });

/**
 * The informers' caches (what a pass reads) and an API server behind them that takes the writes,
 * counting the reads that reach it: a pass over the caches makes none.
 */
function world(o: { record?: ModelCacheObject; lease?: k8s.V1Lease; pods?: k8s.V1Pod[] }) {
  const clock = new FakeClock(T0);
  const state = { record: o.record, lease: o.lease, pods: o.pods ?? [] };
  const writes: string[] = [];
  const events: string[] = [];
  const live = { pods: 0, leases: 0, records: 0 };
  const ended: ElectionEnd["reason"][] = [];
  const released: number[] = [];
  const cold: string[] = [];
  // What the caches lag behind the API server (false: not in the cache yet).
  const cached = { lease: true, leader: true };
  const core = {
    listPodForAllNamespaces: api(() => {
      live.pods++;
      return { items: state.pods };
    }),
    patchNamespacedPod: api((r: { name: string; namespace: string; body: unknown }) => {
      const ops = Array.isArray(r.body) ? (r.body as { op: string; path: string; value?: unknown }[]) : [];
      writes.push(`patch ${r.namespace}/${r.name}: ${ops.map((x) => `${x.op} ${x.path}`).join(", ")}`);
      return {};
    }),
    createNamespacedPodEviction: api(
      (r: {
        name: string;
        namespace: string;
        body: { deleteOptions: { preconditions: { uid: string } } };
      }) => {
        writes.push(`evict ${r.namespace}/${r.name} uid=${r.body.deleteOptions.preconditions.uid}`);
        return {};
      },
    ),
    createNamespacedEvent: api((r: { body: k8s.CoreV1Event }) => {
      events.push(`${r.body.involvedObject.kind} ${r.body.involvedObject.name}: ${r.body.reason}`);
      return r.body;
    }),
  };
  const coordination = {
    readNamespacedLease: api(() => {
      live.leases++;
      if (!state.lease) throw notFound();
      return state.lease;
    }),
    deleteNamespacedLease: api((r: { name: string; body: { preconditions: { uid: string } } }) => {
      if (!state.lease) throw notFound();
      if (state.lease.metadata?.uid !== r.body.preconditions.uid) throw conflict();
      writes.push(`delete Lease ${r.name} uid=${r.body.preconditions.uid}`);
      state.lease = undefined;
      return {};
    }),
  };
  // The record's writes read it first (their resourceVersion precondition): not a pass's reads.
  const custom = {
    getClusterCustomObject: api(() => {
      live.records++;
      if (!state.record) throw notFound();
      return structuredClone(state.record);
    }),
    patchClusterCustomObjectStatus: api(
      (r: { body: { metadata: { resourceVersion?: string }; status: Record<string, unknown> } }) => {
        const c = state.record!;
        if (r.body.metadata.resourceVersion !== c.metadata.resourceVersion) throw conflict();
        c.status = { ...c.status, ...r.body.status };
        c.metadata.resourceVersion = String(Number(c.metadata.resourceVersion) + 1);
        writes.push(`record ${c.status?.phase ?? ""} ${c.status?.reason ?? ""}`.trim());
        return structuredClone(c);
      },
    ),
  };
  const d: ReleaseDeps = {
    reads: {
      pods: () => state.pods.filter((p) => cached.leader || p.metadata?.uid !== "u1"),
      lease: () => (cached.lease ? state.lease : undefined),
      cache: () => state.record,
    },
    core: core as unknown as k8s.CoreV1Api,
    coordination: coordination as unknown as k8s.CoordinationV1Api,
    custom: custom as unknown as k8s.CustomObjectsApi,
    systemNamespace: NS,
    log: memoryLogger().log,
    now: () => clock.now(),
    leaderGraceMs: 30_000,
    recheckMs: 15_000,
    onRelease: (_s, n) => released.push(n),
    onRetire: (_s, reason) => ended.push(reason),
    onWaitingCold: (s) => cold.push(s),
  };
  const pass = () => reconcileHash(SHORT, d);
  return { clock, state, cached, writes, events, live, ended, released, cold, pass };
}

function record(phase: string, leaderUid?: string): ModelCacheObject {
  return {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: SHORT, resourceVersion: "1", finalizers: [FINALIZER_CLEANUP] },
    spec: { hash: SHORT.repeat(4), electionId: "e1", leader: { namespace: "ns", name: "leader" } },
    status: { phase, electionId: "e1", ...(leaderUid ? { leaderUid } : {}) },
  } as ModelCacheObject;
}

function lease(deadlineMs = T0 + 60_000): k8s.V1Lease {
  return {
    metadata: {
      name: leaseName(SHORT),
      namespace: NS,
      uid: "L1",
      resourceVersion: "7",
      labels: { [LABEL_HASH]: SHORT },
      annotations: { [ANN_DEADLINE]: new Date(deadlineMs).toISOString() },
      creationTimestamp: new Date(T0),
    },
    spec: { holderIdentity: "e1", acquireTime: new Date(T0) },
  };
}

function leader(status: k8s.V1Pod["status"] = { phase: "Running" }, uid = "u1"): k8s.V1Pod {
  return {
    metadata: {
      name: "leader",
      namespace: "ns",
      uid,
      labels: { [LABEL_HASH]: SHORT },
      annotations: { [ANN_ROLE]: "leader", [ANN_ELECTION_ID]: "e1" },
    },
    status,
  };
}

function follower(name: string, o: { owned?: boolean } = {}): k8s.V1Pod {
  return {
    metadata: {
      name,
      namespace: "ns",
      uid: `uid-${name}`,
      labels: { [LABEL_HASH]: SHORT, [LABEL_GATED]: "true" },
      annotations: { [ANN_ROLE]: "follower" },
      ownerReferences:
        o.owned === false
          ? []
          : [{ apiVersion: "apps/v1", kind: "ReplicaSet", name: "rs", uid: "rs1", controller: true }],
    },
    spec: { containers: [], schedulingGates: [{ name: SCHEDULING_GATE }] },
    status: { phase: "Pending" },
  };
}

const followers = (): k8s.V1Pod[] => [follower("f1"), follower("f2")];
const noLiveReads = { pods: 0, leases: 0, records: 0 };

test("cache Ready: every follower released (its gate, with the tree's folder) and the Lease retired, from the caches alone", async () => {
  const w = world({ record: record("Ready", "u1"), lease: lease(), pods: [leader(), ...followers()] });
  assert.deepEqual(await w.pass(), {});
  assert.deepEqual(w.writes, [
    "patch ns/f1: test /spec/schedulingGates/0/name, remove /spec/schedulingGates/0, add /metadata/annotations/warmstart.dev~1tree, remove /metadata/labels/warmstart.dev~1gated",
    "patch ns/f2: test /spec/schedulingGates/0/name, remove /spec/schedulingGates/0, add /metadata/annotations/warmstart.dev~1tree, remove /metadata/labels/warmstart.dev~1gated",
    `delete Lease ${leaseName(SHORT)} uid=L1`,
  ]);
  assert.deepEqual(w.released, [2]);
  assert.deepEqual(w.events, ["Pod f1: WarmstartReleased", "Pod f2: WarmstartReleased"]);
  assert.deepEqual(w.live, noLiveReads);
});

test("cache Failed with no election: the followers evicted to re-elect (cold), after the Lease's absence and the phase are read live", async () => {
  const f = [...followers(), follower("bare", { owned: false })];
  const w = world({
    record: { ...record("Failed"), status: { phase: "Failed", reason: "PromoteFailed" } },
    pods: f,
  });
  assert.deepEqual(await w.pass(), {});
  assert.deepEqual(w.writes, ["evict ns/f1 uid=uid-f1", "evict ns/f2 uid=uid-f2"]);
  assert.deepEqual(w.events, ["Pod bare: WarmstartStranded"], "no controller would recreate it: left gated");
  assert.deepEqual(w.live, { pods: 0, leases: 1, records: 1 });
});

test("followers whose Lease is not in the Leases' cache yet are not orphans: nothing evicted, looked at again", async () => {
  const w = world({ record: record("Electing"), lease: lease(), pods: [leader(), ...followers()] });
  w.cached.lease = false;
  assert.deepEqual(await w.pass(), { requeueAfterMs: 15_000 });
  assert.deepEqual(w.writes, []);
});

test("deadline passed: nothing until it passes (the pass comes back for it), then the election retired and its followers evicted", async () => {
  const w = world({
    record: record("Capturing", "u1"),
    lease: lease(T0 + 20_000),
    pods: [leader(), ...followers()],
  });
  await w.clock.advance(1_000);
  assert.deepEqual(await w.pass(), { requeueAfterMs: 15_000 });
  await w.clock.advance(15_000);
  assert.deepEqual(await w.pass(), { requeueAfterMs: 4_050 }, "due just past the deadline");
  assert.deepEqual(w.writes, []);
  await w.clock.advance(4_050);
  assert.deepEqual(await w.pass(), {});
  assert.deepEqual(w.writes, [
    "record Failed DeadlinePassed",
    `delete Lease ${leaseName(SHORT)} uid=L1`,
    "evict ns/f1 uid=uid-f1",
    "evict ns/f2 uid=uid-f2",
  ]);
  assert.deepEqual(w.ended, ["DeadlinePassed"]);
  assert.equal(w.state.record?.status?.failedCaptures, undefined, "a deadline is not a failed capture");
  assert.equal(w.live.pods + w.live.leases, 0);
});

test("leader gone: a Lease with no leader pod waits out the grace, then is retired; a leader recorded but gone is gone at once", async () => {
  const w = world({ record: record("Electing"), lease: lease(), pods: followers() });
  await w.clock.advance(10_000);
  assert.deepEqual(await w.pass(), { requeueAfterMs: 15_000 }, "within the grace: admitted, not created yet");
  await w.clock.advance(25_000);
  assert.deepEqual(await w.pass(), {});
  assert.deepEqual(w.ended, ["LeaderGone"]);
  assert.deepEqual(w.writes.slice(0, 2), [
    "record Failed LeaderGone",
    `delete Lease ${leaseName(SHORT)} uid=L1`,
  ]);
  assert.equal(w.writes.filter((x) => x.startsWith("evict")).length, 2);

  const recorded = world({ record: record("Capturing", "u1"), lease: lease(), pods: followers() });
  await recorded.clock.advance(1_000);
  await recorded.pass();
  assert.deepEqual(recorded.ended, ["LeaderGone"]);
  assert.equal(recorded.live.pods, 1, "its absence from the pods' cache confirmed by one live list");
});

test("a recorded leader the pods' cache does not hold yet is listed live, and its election goes on", async () => {
  const w = world({ record: record("Capturing", "u1"), lease: lease(), pods: [leader(), ...followers()] });
  w.cached.leader = false;
  await w.clock.advance(1_000);
  assert.deepEqual(await w.pass(), { requeueAfterMs: 15_000 });
  assert.deepEqual(w.writes, []);
  assert.equal(w.live.pods, 1);
});

test("leader evicted: a failed capture that counts, with Warnings on the pod and the record, then re-elected", async () => {
  const w = world({
    record: record("Capturing", "u1"),
    lease: lease(),
    pods: [leader(evicted()), ...followers()],
  });
  await w.clock.advance(1_000);
  assert.deepEqual(await w.pass(), {});
  assert.deepEqual(w.ended, ["LeaderEvicted"]);
  assert.equal(w.writes[0], "record Failed CaptureFailed");
  assert.equal(w.state.record?.status?.failedCaptures, 1);
  assert.match(w.state.record?.status?.message ?? "", /^LeaderEvicted: node disk pressure/);
  assert.deepEqual(w.events.slice(0, 2), [
    "Pod leader: WarmstartLeaderEvicted",
    `ModelCache ${SHORT}: WarmstartLeaderEvicted`,
  ]);
  assert.deepEqual(w.writes.slice(1), [
    `delete Lease ${leaseName(SHORT)} uid=L1`,
    "evict ns/f1 uid=uid-f1",
    "evict ns/f2 uid=uid-f2",
  ]);
  // A pass that comes again before the caches show the retirement counts it once.
  w.state.lease = lease();
  await w.pass();
  assert.equal(w.state.record?.status?.failedCaptures, 1);
});

test("a waiting follower whose wait ended cold has its decision say so, once its seed reported it", async () => {
  const waiting = (outcome?: object): k8s.V1Pod => ({
    metadata: {
      name: "w1",
      namespace: "ns",
      uid: "uid-w1",
      labels: { [LABEL_HASH]: SHORT, [LABEL_WAITING]: "true" },
      annotations: { [ANN_ROLE]: "follower" },
    },
    spec: { containers: [] },
    status: {
      phase: "Running",
      initContainerStatuses: outcome
        ? [
            {
              name: INIT_SEED,
              image: "seed",
              imageID: "",
              ready: false,
              restartCount: 0,
              state: { terminated: { exitCode: 0, message: JSON.stringify(outcome) } },
            },
          ]
        : [],
    },
  });
  const w = world({ record: record("Capturing", "u1"), lease: lease(), pods: [leader(), waiting()] });
  await w.clock.advance(1_000);
  await w.pass();
  assert.deepEqual(w.writes, [], "still waiting");
  w.state.pods = [leader(), waiting({ outcome: "cold", waitedMs: 42_000, reason: "wait deadline passed" })];
  await w.pass();
  const esc = (k: string): string => k.replace("/", "~1");
  assert.deepEqual(w.writes, [
    `patch ns/w1: test /metadata/annotations/${esc(ANN_ROLE)}, replace /metadata/annotations/${esc(ANN_ROLE)}, add /metadata/annotations/${esc(ANN_REASON)}`,
  ]);
  assert.deepEqual(w.cold, [SHORT]);
  assert.deepEqual(w.events, ["Pod w1: WarmstartCold"]);
  assert.deepEqual(w.live, noLiveReads);
});

// What ends an election, as one pass reads it (pure).

const evicted = (message = DISK): k8s.V1Pod["status"] => ({
  phase: "Failed",
  reason: "Evicted",
  message,
  conditions: [{ type: "DisruptionTarget", status: "True", reason: "TerminationByKubelet", message }],
});

function look(
  clock: FakeClock,
  cache: ModelCacheObject,
  pods: k8s.V1Pod[],
): ReturnType<typeof electionFailure> {
  return electionFailure({ now: () => clock.now(), leaderGraceMs: 30_000 }, lease(T0 + 60_000), cache, pods);
}

test("a leader evicted for node pressure ends its election as an eviction, before and after the deadline", async () => {
  const clock = new FakeClock(T0 + 1_000);
  const pods = [leader(evicted())];
  const end = look(clock, record("Capturing", "u1"), pods);
  assert.equal(end?.reason, "LeaderEvicted");
  assert.match(
    end.message,
    /^LeaderEvicted: node disk pressure: leader pod ns\/leader evicted by the kubelet/,
  );
  assert.equal(end.evicted?.pod, pods[0]);
  // Not yet recorded by UID: the pod wearing the election's id where the record says.
  assert.equal(look(clock, record("Electing"), pods)?.reason, "LeaderEvicted", "evicted before it was Ready");
  // A pass that comes only after the deadline still sees what ended it.
  await clock.advance(120_000);
  assert.equal(look(clock, record("Capturing", "u1"), pods)?.reason, "LeaderEvicted");
});

test("a capture volume over its limit is CacheTooLarge; an election already promoting does not need its leader", async () => {
  const clock = new FakeClock(T0 + 1_000);
  const big = [leader(evicted('Usage of EmptyDir volume "warmstart-cache" exceeds the limit "16Mi". '))];
  assert.equal(look(clock, record("Capturing", "u1"), big)?.reason, "CacheTooLarge");
  assert.equal(look(clock, record("Promoting", "u1"), [leader(evicted())]), undefined);
  await clock.advance(120_000);
  assert.equal(look(clock, record("Promoting", "u1"), [leader(evicted())])?.reason, "DeadlinePassed");
});

test("a leader that went away otherwise is still LeaderGone (not counted), and a copy's eviction is not the leader's", () => {
  const clock = new FakeClock(T0 + 1_000);
  const done = leader({ phase: "Failed", reason: "Error" });
  assert.equal(look(clock, record("Capturing", "u1"), [done])?.reason, "LeaderGone");
  assert.equal(look(clock, record("Capturing", "u1"), [])?.reason, "LeaderGone");
  const copy = leader(evicted(), "u2");
  assert.equal(look(clock, record("Capturing", "u1"), [copy, leader({ phase: "Running" })]), undefined);
  assert.equal(look(clock, record("Capturing", "u1"), [leader({ phase: "Running" })]), undefined);
});
