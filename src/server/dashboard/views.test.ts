import assert from "node:assert/strict";
import { test } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import type { ModelCacheObject } from "../../common/modelcache.js";
import { buildSnapshot, podRow } from "./views.js";

const SHORT = "0123456789abcdef";

function cache(status: ModelCacheObject["status"]): ModelCacheObject {
  return {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: SHORT, creationTimestamp: new Date("2026-01-01T00:00:00Z") },
    spec: { hash: SHORT.repeat(4), model: "org/m" },
    status,
  };
}

function pod(role: string, conditions: [string, string][], created = "2026-01-01T00:00:00Z"): k8s.V1Pod {
  return {
    metadata: {
      name: role,
      namespace: "ns",
      creationTimestamp: new Date(created),
      labels: { "warmstart.dev/hash": SHORT },
      annotations: { "warmstart.dev/role": role },
    },
    spec: { containers: [], nodeName: "gpu-0" },
    status: {
      phase: "Running",
      conditions: conditions.map(([type, at]) => ({
        type,
        status: "True",
        lastTransitionTime: new Date(at),
      })),
    },
  };
}

void test("a cache's benefit comes from its record, so it outlives the pods", () => {
  const s = buildSnapshot(
    [
      cache({
        phase: "Ready",
        leaderReadySeconds: 600,
        restores: 4,
        restoredReadySecondsTotal: 100,
        savedSeconds: 2300,
        savedBytes: 4_000,
        failedCaptures: 1,
        node: "gpu-0",
        lastRestoredAt: "2026-01-01T01:00:00Z",
      }),
    ],
    [],
    [], // every pod is gone
  );
  const row = s.caches[0]!;
  assert.equal(row.restores, 4);
  assert.equal(row.restoredReadySeconds, 25);
  assert.equal(row.savedSeconds, 2300);
  assert.equal(row.savedBytes, 4_000);
  assert.equal(row.failedCaptures, 1);
  assert.equal(row.node, "gpu-0");
  assert.deepEqual(row.copies, [], "no node serves a copy yet");
  assert.deepEqual(s.totals, { savedSeconds: 2300, savedBytes: 4_000, restores: 4, caches: 1 });
});

void test("the nodes serving a copy of a tree to their peers, and those filling one, come from the record's replicas", () => {
  const at = "2026-01-01T00:00:00Z";
  const s = buildSnapshot(
    [
      cache({
        phase: "Ready",
        node: "gpu-0",
        replicas: {
          "gpu-2": { url: "https://10.0.0.3:9465", at },
          "gpu-0": { url: "https://10.0.0.1:9465", at },
          "gpu-1": {
            url: "https://10.0.0.2:9465",
            at: new Date().toISOString(),
            filling: { doneBytes: 450, totalBytes: 1000 },
          },
          // Left by an agent that died mid-fill: not a fill any more.
          "gpu-3": { url: "https://10.0.0.4:9465", at, filling: { doneBytes: 1, totalBytes: 1000 } },
        },
      }),
    ],
    [],
    [],
  );
  assert.deepEqual(s.caches[0]!.copies, ["gpu-0", "gpu-2"], "committed copies only");
  assert.deepEqual(s.caches[0]!.filling, [{ node: "gpu-1", percent: 45 }], "and the copies filling now");
});

void test("a follower's time to Ready runs from its release (scheduled), a restore's from its admission", () => {
  const follower = pod("follower", [
    ["PodScheduled", "2026-01-01T00:10:00Z"],
    ["Ready", "2026-01-01T00:10:30Z"],
  ]);
  assert.equal(podRow(follower).readySeconds, 30, "its gated wait is not its own start");
  const restore = pod("restore", [
    ["PodScheduled", "2026-01-01T00:00:01Z"],
    ["Ready", "2026-01-01T00:00:20Z"],
  ]);
  assert.equal(podRow(restore).readySeconds, 20);
});

void test("node stores are shown from their agents' Leases", () => {
  const lease = (node: string, used: string, budget: string): k8s.V1Lease => ({
    metadata: {
      name: `warmstart-store-${node}`,
      labels: { "warmstart.dev/store": "true" },
      annotations: {
        "warmstart.dev/node": node,
        "warmstart.dev/store-used": used,
        "warmstart.dev/store-budget": budget,
        "warmstart.dev/store-caches": "aaaaaaaaaaaaaaaa,bbbbbbbbbbbbbbbb",
      },
    },
    spec: { holderIdentity: node },
  });
  const s = buildSnapshot([], [], [], [lease("gpu-1", "10", "0"), lease("gpu-0", "2048", "4096")]);
  assert.deepEqual(
    s.stores.map((x) => [x.node, x.usedBytes, x.budgetBytes, x.caches.length]),
    [
      ["gpu-0", 2048, 4096, 2],
      ["gpu-1", 10, 0, 2],
    ],
  );
});

void test("each pod's start comes from the record's startups by UID; a cache shows its leader's phases beside its restores' mean", () => {
  const start = (uid: string, role: string, compile: number, hit: "hit" | "miss", cause?: string) => ({
    ...{ namespace: "ns", name: role, uid, role, node: "gpu-0", engine: "vllm", at: "2026-01-01T00:00:00Z" },
    seconds: { download: role === "leader" ? 60 : 0, weightLoad: 10, compile },
    compileCache: hit,
    ...(cause ? { cause } : {}),
  });
  const restore = pod("restore", [["Ready", "2026-01-01T00:00:20Z"]]);
  restore.metadata!.uid = "r1";
  const s = buildSnapshot(
    [
      cache({
        phase: "Ready",
        startups: [
          start("l1", "leader", 90, "miss"),
          start("r1", "restore", 4, "hit"),
          start("r2", "restore", 80, "miss", "GPU product differs"),
        ],
      }),
    ],
    [],
    [restore, pod("cold", [])],
  );
  assert.deepEqual(s.pods[0]!.startup, {
    engine: "vllm",
    seconds: { download: 0, weightLoad: 10, compile: 4 },
    compileCache: "hit",
    cause: null,
  });
  assert.equal(s.pods[1]!.startup, null, "a pod with no recorded start");
  const row = s.caches[0]!;
  assert.deepEqual(row.leaderStart, { download: 60, weightLoad: 10, compile: 90 });
  assert.deepEqual(row.restoredStart, { download: 0, weightLoad: 10, compile: 42 });
  assert.deepEqual(row.compileCache, { hits: 1, misses: 1 });
});

void test("a follower still waiting shows what it waits for, how far its leader has got, and when it starts cold", () => {
  const waiting = pod("follower", [["PodScheduled", "2026-01-01T00:00:01Z"]]);
  waiting.metadata!.labels!["warmstart.dev/waiting"] = "true";
  waiting.metadata!.annotations!["warmstart.dev/wait-until"] = "2026-01-01T00:20:00.000Z";
  const gatedPod = pod("follower", []);
  gatedPod.metadata!.name = "gated";
  gatedPod.spec!.schedulingGates = [{ name: "warmstart.dev/cache-ready" }];
  const started = pod("follower", [["PodScheduled", "2026-01-01T00:00:01Z"]]);
  started.metadata!.name = "started";
  started.metadata!.labels!["warmstart.dev/waiting"] = "true";
  started.status!.initContainerStatuses = [
    {
      name: "warmstart-seed-cache",
      image: "w",
      imageID: "",
      ready: false,
      restartCount: 0,
      state: { terminated: { exitCode: 0, message: '{"outcome":"restored","waitedMs":1}' } },
    },
  ];
  const c = cache({ phase: "Capturing" });
  c.spec.leader = { namespace: "ns", name: "leader-0" };
  const s = buildSnapshot([c], [], [waiting, gatedPod, started]);
  const by = new Map(s.pods.map((p) => [p.name, p.waitsFor]));
  assert.deepEqual(by.get("follower"), {
    cache: SHORT,
    leader: "ns/leader-0",
    phase: "Capturing",
    gated: false,
    until: "2026-01-01T00:20:00.000Z",
  });
  assert.equal(by.get("gated")?.gated, true);
  assert.equal(by.get("started"), null, "its wait is over");
});
