import assert from "node:assert/strict";
import { test } from "node:test";
import type { V1Pod } from "@kubernetes/client-node";
import type { ModelCacheObject } from "../common/modelcache.js";
import { ANN_CACHE_SOURCE } from "../core/contract.js";
import type { Manifest } from "../datapath/manifest.js";
import { FakeClock, memoryLogger } from "../../test/support/testing.js";
import { STALE_FILLING_MS } from "../api/modelcache.js";
import { cacheReconciler, type CacheReconcilerDeps } from "./cache-reconciler.js";
import type { PromoteContext } from "./promoter.js";

const HASH = "fedcba9876543210".repeat(4);
const SHORT = HASH.slice(0, 16);
const FINALIZER = "warmstart.dev/store-gpu-0";

function record(
  status: Record<string, unknown>,
  o: { election?: string; deleting?: boolean; finalizers?: string[]; source?: boolean } = {},
): ModelCacheObject {
  return {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: {
      name: SHORT,
      finalizers: o.finalizers ?? [FINALIZER],
      ...(o.deleting ? { deletionTimestamp: new Date() } : {}),
      ...(o.source
        ? {
            annotations: {
              [ANN_CACHE_SOURCE]: JSON.stringify({ backend: "host-path", provisioner: "x", sizeBytes: 1 }),
            },
          }
        : {}),
    },
    spec: { hash: HASH, electionId: o.election ?? "e1", leader: { namespace: "ns", name: "leader" } },
    status: { node: "gpu-0", electionId: "e1", leaderUid: "u1", ...status },
  };
}

function setup(): {
  clock: FakeClock;
  state: {
    cache?: ModelCacheObject;
    fresh?: ModelCacheObject;
    tree: boolean;
    capturing: boolean;
    lastResync: number;
  };
  removed: string[];
  promoted: PromoteContext[];
  claimsKept: string[];
  forgotten: string[];
  pass: () => Promise<unknown>;
} {
  const clock = new FakeClock(Date.parse("2026-12-01T12:00:00Z"));
  const state: {
    cache?: ModelCacheObject;
    fresh?: ModelCacheObject;
    tree: boolean;
    capturing: boolean;
    lastResync: number;
  } = { tree: true, capturing: false, lastResync: 0 };
  const removed: string[] = [];
  const promoted: PromoteContext[] = [];
  const claimsKept: string[] = [];
  const forgotten: string[] = [];
  const leaderPod = { metadata: { name: "leader", namespace: "ns", uid: "u1" } } as V1Pod;
  const deps: CacheReconcilerDeps = {
    node: "gpu-0",
    finalizer: FINALIZER,
    lastResync: () => state.lastResync,
    record: () => state.cache,
    readRecord: () => Promise.resolve(state.fresh),
    stored: (short) =>
      Promise.resolve(state.tree ? { short, manifest: { hash: HASH } as Manifest } : undefined),
    capturing: () => state.capturing,
    pod: (ns, name) => (ns === "ns" && name === "leader" ? leaderPod : undefined),
    removeTree: (_short, why) => {
      removed.push(why);
      return Promise.resolve();
    },
    promote: (_hash, ctx) => {
      promoted.push(ctx);
      return Promise.resolve("ready");
    },
    keepClaims: (short) => {
      claimsKept.push(short);
      return Promise.resolve(true);
    },
    forget: (short) => {
      forgotten.push(short);
      return Promise.resolve();
    },
    now: () => clock.now(),
  };
  const reconcile = cacheReconciler(deps);
  const { log } = memoryLogger();
  return {
    clock,
    state,
    removed,
    promoted,
    claimsKept,
    forgotten,
    pass: () => reconcile(SHORT, { log, signal: new AbortController().signal, reconcileId: "r" }),
  };
}

test("a record being deleted takes this node's tree when it holds this node's finalizer", async () => {
  const s = setup();
  s.state.cache = record({ phase: "Ready" }, { deleting: true });
  await s.pass();
  assert.deepEqual(s.removed, ["the cache is being deleted"]);
  const t = setup();
  t.state.cache = record({ phase: "Ready" }, { deleting: true, finalizers: ["warmstart.dev/cleanup"] });
  await t.pass();
  assert.deepEqual(t.removed, [], "another node's tree");
});

test("a tree whose record is gone goes only once the API server confirms it (the informer may lag)", async () => {
  const s = setup();
  s.state.fresh = record({ phase: "Capturing" });
  await s.pass();
  assert.deepEqual(s.removed, [], "the record exists: the informer had not seen it yet");
  assert.equal(s.promoted.length, 1, "and the fresh record is acted on");
  s.state.fresh = undefined;
  s.promoted.length = 0;
  await s.pass();
  assert.deepEqual(s.removed, ["the cache has no record"]);
  assert.equal(s.promoted.length, 0);
});

test("the record's own election, captured here, is promoted with its leader; another election's status never is", async () => {
  for (const phase of ["Capturing", "Promoting"]) {
    const s = setup();
    s.state.cache = record({ phase });
    await s.pass();
    assert.equal(s.promoted.length, 1, phase);
    assert.equal(s.promoted[0]!.election, "e1");
    assert.equal(s.promoted[0]!.pod?.metadata?.uid, "u1");
    assert.equal(
      s.promoted[0]!.retryFailedBefore,
      undefined,
      "resumed, not a retry: a failure since then stands",
    );
  }
  const old = setup();
  old.state.cache = record({ phase: "Promoting", electionId: "e1" }, { election: "e2" });
  await old.pass();
  assert.equal(old.promoted.length, 0, "a Promoting status left by the previous election");
  const electing = setup();
  electing.state.cache = record({ phase: "Electing", electionId: "e2" }, { election: "e2" });
  await electing.pass();
  assert.equal(electing.promoted.length, 0, "a fresh election");
  const elsewhere = setup();
  elsewhere.state.cache = record({ phase: "Capturing", node: "gpu-1" });
  await elsewhere.pass();
  assert.equal(elsewhere.promoted.length, 0, "captured on another node");
});

test("nothing is promoted while a capture job of the cache runs, or without a committed tree", async () => {
  const s = setup();
  s.state.cache = record({ phase: "Capturing" });
  s.state.capturing = true;
  await s.pass();
  s.state.capturing = false;
  s.state.tree = false;
  await s.pass();
  assert.equal(s.promoted.length, 0);
});

test("a failed promote is retried at the next resync, never on the change its own failure made", async () => {
  const s = setup();
  const failedAt = s.clock.now();
  s.state.cache = record({
    phase: "Failed",
    reason: "PromoteFailed",
    lastTransitionTime: new Date(failedAt).toISOString(),
  });
  s.state.lastResync = failedAt - 60_000;
  await s.pass();
  assert.equal(s.promoted.length, 0);
  await s.clock.advance(60_000);
  s.state.lastResync = s.clock.now();
  await s.pass();
  assert.equal(s.promoted.length, 1);
  assert.equal(
    s.promoted[0]!.retryFailedBefore,
    s.state.lastResync,
    "only a failure from before this resync",
  );
  const captureFailed = setup();
  captureFailed.state.cache = record({
    phase: "Failed",
    reason: "CaptureFailed",
    lastTransitionTime: "2026-01-01T00:00:00Z",
  });
  captureFailed.state.lastResync = captureFailed.clock.now();
  await captureFailed.pass();
  assert.equal(captureFailed.promoted.length, 0, "only a failed promote is retried");
});

test("a Ready cache promoted here keeps its claims in namespaces that gained pods", async () => {
  const s = setup();
  s.state.cache = record({ phase: "Ready" }, { source: true });
  await s.pass();
  assert.deepEqual(s.claimsKept, [SHORT]);
  assert.equal(s.promoted.length, 0);
});

test("this node's filling entry is taken off the record once it is stale and no tree is here (a fill its agent died in)", async () => {
  const s = setup();
  s.state.tree = false;
  const fillingAt = (ms: number): ModelCacheObject =>
    record({
      phase: "Ready",
      replicas: {
        "gpu-0": {
          url: "https://10.0.0.1:9465",
          at: new Date(s.clock.now() - ms).toISOString(),
          filling: { doneBytes: 1, totalBytes: 2 },
        },
      },
    });
  s.state.cache = fillingAt(10_000);
  assert.deepEqual(
    await s.pass(),
    { requeueAfterMs: STALE_FILLING_MS - 10_000 + 1000 },
    "a fill written 10 s ago is alive: looked at again when it would be stale",
  );
  assert.deepEqual(s.forgotten, []);
  s.state.cache = fillingAt(STALE_FILLING_MS + 1000);
  s.state.fresh = fillingAt(5_000);
  await s.pass();
  assert.deepEqual(s.forgotten, [], "a fresh read shows a new fill: kept");
  s.state.fresh = s.state.cache;
  await s.pass();
  assert.deepEqual(s.forgotten, [SHORT]);
});
