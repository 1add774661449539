import assert from "node:assert/strict";
import { test } from "node:test";
import type { V1Pod } from "@kubernetes/client-node";
import { NOT_LEADER } from "../api/reasons.js";
import type { LeaderClaim } from "../common/cache-record.js";
import type { Manifest } from "../datapath/manifest.js";
import { FakeClock, memoryLogger } from "../../test/support/testing.js";
import { CaptureMarks, type Mark } from "./marks.js";
import { createNodeAgentMetrics } from "./metrics.js";
import { podReconciler, type PodReconcilerDeps } from "./pod-reconciler.js";

const HASH = "0123456789abcdef".repeat(4);
const SHORT = HASH.slice(0, 16);
const KEY = "ns/leader";

function leader(
  o: { uid?: string; ready?: boolean; readyAt?: number; deleting?: boolean; election?: string } = {},
): V1Pod {
  return {
    metadata: {
      name: "leader",
      namespace: "ns",
      uid: o.uid ?? "u1",
      labels: { "warmstart.dev/capture": "true", "warmstart.dev/hash": SHORT },
      annotations: { "warmstart.dev/hash": HASH, "warmstart.dev/election-id": o.election ?? "e1" },
      ...(o.deleting ? { deletionTimestamp: new Date() } : {}),
    },
    spec: { nodeName: "gpu-0", containers: [] },
    status: {
      phase: "Running",
      conditions: [
        {
          type: "Ready",
          status: o.ready === false ? "False" : "True",
          lastTransitionTime: new Date(o.readyAt ?? 0).toISOString() as unknown as Date,
        },
      ],
    },
  };
}

/** A pod reconciler over plain state: the pods, the store and the election as the test sets them. */
function setup(warmupMs = 30_000): {
  clock: FakeClock;
  pods: Map<string, V1Pod>;
  stored: Set<string>;
  ready: Set<string>;
  leaderClaim: { value: LeaderClaim };
  started: Mark[];
  enqueued: string[];
  checks: string[];
  sighted: string[];
  adopted: string[];
  marks: CaptureMarks;
  pass: () => Promise<void | { requeueAfterMs?: number }>;
} {
  const clock = new FakeClock(Date.parse("2026-12-01T12:00:00Z"));
  const pods = new Map<string, V1Pod>();
  const stored = new Set<string>();
  const ready = new Set<string>();
  const leaderClaim = { value: { ok: true } as LeaderClaim };
  const started: Mark[] = [];
  const enqueued: string[] = [];
  const checks: string[] = [];
  const sighted: string[] = [];
  const adopted: string[] = [];
  const marks = new CaptureMarks();
  const deps: PodReconcilerDeps = {
    node: "gpu-0",
    warmupMs,
    now: () => clock.now(),
    metrics: createNodeAgentMetrics(),
    marks,
    pod: (ns, name) => pods.get(`${ns}/${name}`),
    committed: (hash) => Promise.resolve(stored.has(hash) ? ({ hash } as Manifest) : undefined),
    cacheReady: (short) => ready.has(short),
    sight: (_seen, uid) => {
      sighted.push(uid);
      return Promise.resolve();
    },
    checkLeader: (pod) => {
      checks.push(pod.metadata!.uid!);
      return Promise.resolve(leaderClaim.value);
    },
    startCapture: (mark) => {
      mark.stage = "capturing";
      started.push(mark);
    },
    enqueueCache: (short) => enqueued.push(short),
    adoptStored: (_hash, election) => {
      adopted.push(election);
      return Promise.resolve();
    },
  };
  const reconcile = podReconciler(deps);
  const { log } = memoryLogger();
  const pass = (): Promise<void | { requeueAfterMs?: number }> =>
    reconcile(KEY, { log, signal: new AbortController().signal, reconcileId: "r" });
  return {
    clock,
    pods,
    stored,
    ready,
    leaderClaim,
    started,
    enqueued,
    checks,
    sighted,
    adopted,
    marks,
    pass,
  };
}

test("the warm-up is a requeue for the time left since the pod turned Ready; then the capture starts", async () => {
  const s = setup(30_000);
  s.pods.set(KEY, leader({ readyAt: s.clock.now() - 10_000 }));
  assert.deepEqual(await s.pass(), { requeueAfterMs: 20_000 });
  assert.equal(s.marks.get("u1")?.stage, "warmup");
  assert.equal(s.started.length, 0);
  await s.clock.advance(20_000);
  assert.equal(await s.pass(), undefined);
  assert.equal(s.started.length, 1, "capture job started");
  assert.equal(s.started[0]!.uid, "u1");
  assert.deepEqual(
    s.checks,
    ["u1", "u1"],
    "the election is checked on each pass, the last just before the copy",
  );
});

test("an agent restarted mid-warm-up waits only what is left (the Ready time, not the agent's, counts)", async () => {
  const s = setup(30_000);
  s.pods.set(KEY, leader({ readyAt: s.clock.now() - 25_000 }));
  assert.deepEqual(await s.pass(), { requeueAfterMs: 5_000 });
  const t = setup(30_000);
  t.pods.set(KEY, leader({ readyAt: t.clock.now() - 31_000 }));
  assert.equal(await t.pass(), undefined);
  assert.equal(t.started.length, 1);
});

test("a pod deleted or replaced during its warm-up releases its mark and starts nothing", async () => {
  const s = setup();
  s.pods.set(KEY, leader({ readyAt: s.clock.now() }));
  await s.pass();
  s.pods.delete(KEY);
  await s.pass();
  assert.equal(s.marks.get("u1"), undefined);
  assert.equal(s.marks.lastRelease("u1"), "pod-deleted");

  s.pods.set(KEY, leader({ uid: "u2", readyAt: s.clock.now(), ready: false }));
  await s.pass();
  s.pods.set(KEY, leader({ uid: "u3", readyAt: s.clock.now() }));
  await s.pass();
  assert.equal(s.marks.get("u3")?.stage, "warmup");
  s.pods.set(KEY, leader({ uid: "u4", readyAt: s.clock.now() }));
  await s.pass();
  assert.equal(s.marks.lastRelease("u3"), "pod-replaced");
  await s.clock.advance(60_000);
  await s.pass();
  assert.deepEqual(
    s.started.map((m) => m.uid),
    ["u4"],
  );
});

test("why a pod is not the leader is read from the claim's reason, never its message", async () => {
  const cases = [
    [NOT_LEADER.CacheReady, "the cache is being deleted", "cache-ready"],
    [NOT_LEADER.CacheDeleting, "cache Ready", "cache-deleted"],
    [NOT_LEADER.NotElected, "cache Ready", "not-leader"],
  ] as const;
  for (const [reason, why, released] of cases) {
    const s = setup();
    s.leaderClaim.value = { ok: false, reason, why };
    s.pods.set(KEY, leader({ readyAt: s.clock.now() - 60_000 }));
    await s.pass();
    assert.equal(s.marks.lastRelease("u1"), released, reason);
    assert.equal(s.started.length, 0, reason);
  }
});

test("a pod that is not the elected leader is settled: no second election check", async () => {
  const s = setup();
  s.leaderClaim.value = {
    ok: false,
    reason: NOT_LEADER.OtherPod,
    why: "pod u0 is this election's recorded leader",
  };
  s.pods.set(KEY, leader({ readyAt: s.clock.now() - 60_000 }));
  await s.pass();
  await s.pass();
  assert.equal(s.marks.lastRelease("u1"), "not-leader");
  assert.deepEqual(s.checks, ["u1"]);
  assert.equal(s.started.length, 0);
});

test("a committed tree is handed to the cache reconciler, never captured again", async () => {
  const s = setup();
  s.stored.add(HASH);
  s.ready.add(SHORT);
  s.pods.set(KEY, leader({ readyAt: s.clock.now() }));
  await s.pass();
  assert.deepEqual(s.enqueued, [SHORT]);
  assert.equal(s.marks.isCommitted("u1"), true);
  assert.deepEqual(s.checks, [], "a Ready cache needs no election check");
  assert.deepEqual(s.adopted, []);

  const t = setup();
  t.stored.add(HASH);
  t.pods.set(KEY, leader({ readyAt: t.clock.now() }));
  await t.pass();
  assert.deepEqual(t.checks, ["u1"], "not Ready: the leader is checked before its tree is promoted");
  assert.deepEqual(t.adopted, ["e1"], "the record says this node holds the tree for this election");
  assert.deepEqual(t.enqueued, [SHORT]);
  await t.pass();
  assert.deepEqual(t.started, []);
});

test("a Ready blip does not stop a copy in progress; terminating does", async () => {
  const s = setup(0);
  s.pods.set(KEY, leader({ readyAt: s.clock.now() }));
  await s.pass();
  const mark = s.started[0]!;
  s.pods.set(KEY, leader({ ready: false }));
  await s.pass();
  assert.equal(mark.controller.signal.aborted, false);
  s.pods.set(KEY, leader({ deleting: true }));
  await s.pass();
  assert.equal(mark.controller.signal.aborted, true);
  assert.equal(mark.controller.signal.reason, "terminating");
  assert.equal(s.marks.get("u1"), mark, "the job releases its own mark when it stops");
});

test("a leader evicted mid-copy stops the copy: a final phase is no Ready blip", async () => {
  const s = setup(0);
  s.pods.set(KEY, leader({ readyAt: s.clock.now() }));
  await s.pass();
  const mark = s.started[0]!;
  const evicted = leader({ ready: false });
  evicted.status = {
    ...evicted.status,
    phase: "Failed",
    reason: "Evicted",
    message: "The node was low on resource: ephemeral-storage. ",
  };
  s.pods.set(KEY, evicted);
  await s.pass();
  assert.equal(mark.controller.signal.aborted, true);
  assert.equal(mark.controller.signal.reason, "terminating");
});

test("the first sight of a pod wearing an election id, Ready or not, is offered as the election's leader", async () => {
  const s = setup();
  s.pods.set(KEY, leader({ ready: false }));
  await s.pass();
  assert.deepEqual(s.sighted, ["u1"]);
  assert.equal(s.marks.get("u1"), undefined, "not Ready: nothing marked");
});
