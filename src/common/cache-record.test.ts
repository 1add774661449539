import assert from "node:assert/strict";
import { test } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { CacheRecords } from "./cache-record.js";
import type { ModelCacheObject } from "./modelcache.js";

const HASH = "ab".repeat(32);
const SHORT = HASH.slice(0, 16);

/** One record in memory, with the API server's resourceVersion check and merge-patch of status. */
function fakeApi(status: Record<string, unknown> | undefined, electionId = "e1") {
  let rv = 1;
  let record: ModelCacheObject = {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: SHORT, resourceVersion: String(rv), generation: 4 },
    spec: { hash: HASH, electionId },
    ...(status ? { status } : {}),
  };
  const writes: Record<string, unknown>[] = [];
  const api = {
    getClusterCustomObject: () => Promise.resolve(structuredClone(record)),
    patchClusterCustomObjectStatus: (req: {
      body: { metadata: { resourceVersion?: string }; status: Record<string, unknown> };
    }) => {
      if (req.body.metadata.resourceVersion !== record.metadata.resourceVersion)
        return Promise.reject(Object.assign(new Error("conflict"), { code: 409 }));
      writes.push(req.body.status);
      const merged: Record<string, unknown> = { ...record.status, ...req.body.status };
      for (const [k, v] of Object.entries(merged)) if (v === null) delete merged[k];
      record = { ...record, metadata: { ...record.metadata, resourceVersion: String(++rv) }, status: merged };
      return Promise.resolve(structuredClone(record));
    },
  };
  return { records: new CacheRecords(api as unknown as k8s.CustomObjectsApi), writes, now: () => record };
}

void test("advance writes the table's phase for its election, with the conditions and the phase's time", async () => {
  const f = fakeApi({ phase: "Electing", reason: "LeaderElected", electionId: "e1", leaderUid: "u1" });
  const r = await f.records.advance(SHORT, "e1", "captureStarted", {
    reason: "CaptureStarted",
    message: "m",
  });
  assert.equal(r?.written, true);
  const s = f.now().status!;
  assert.deepEqual(
    [s.phase, s.reason, s.electionId, s.leaderUid],
    ["Capturing", "CaptureStarted", "e1", "u1"],
  );
  assert.ok(s.lastTransitionTime);
  assert.deepEqual(
    s.conditions?.map((c) => [c.type, c.status, c.reason, c.observedGeneration]),
    [
      ["Ready", "False", "CaptureStarted", 4],
      ["Progressing", "True", "CaptureStarted", 4],
    ],
  );
});

void test("advance leaves the record when the table says ignore, or when it is about another election", async () => {
  const ready = fakeApi({ phase: "Ready", electionId: "e1" });
  assert.equal((await ready.records.advance(SHORT, "e1", "failed", { reason: "X" }))?.written, false);
  const failed = fakeApi({ phase: "Failed", reason: "CaptureFailed", electionId: "e1" });
  assert.equal(
    (await failed.records.advance(SHORT, "e1", "captured", { reason: "Captured" }))?.written,
    false,
  );
  const other = fakeApi({ phase: "Promoting", electionId: "e1" }, "e2");
  assert.equal(
    (await other.records.advance(SHORT, "e1", "promoted", { reason: "Promoted" }))?.written,
    false,
  );
  assert.deepEqual([...ready.writes, ...failed.writes, ...other.writes], []);
});

void test("a promote after this election's own failed promote is its retry", async () => {
  const f = fakeApi({ phase: "Failed", reason: "PromoteFailed", electionId: "e1" });
  const r = await f.records.advance(SHORT, "e1", "captured", { reason: "Captured", message: "again" });
  assert.equal(r?.written, true);
  assert.equal(f.now().status?.phase, "Promoting");
});

void test("fail counts once per election and never lands over Ready", async () => {
  const f = fakeApi({ phase: "Capturing", electionId: "e1", failedCaptures: 1, lastFailedElection: "e0" });
  await f.records.fail(SHORT, "e1", "CaptureFailed", "disk");
  await f.records.fail(SHORT, "e1", "CaptureFailed", "again");
  const s = f.now().status!;
  assert.deepEqual([s.phase, s.message, s.failedCaptures, s.lastFailedElection], ["Failed", "disk", 2, "e1"]);
  assert.equal(f.writes.length, 1);
  assert.equal(s.conditions?.find((c) => c.type === "Progressing")?.status, "False");
});

void test("claimLeader: a status of an earlier election restarts at Electing; this election's keeps its phase", async () => {
  const stale = fakeApi({ phase: "Failed", reason: "CaptureFailed", electionId: "e0" });
  assert.equal((await stale.records.claimLeader(SHORT, "e1", "u1")).ok, true);
  assert.deepEqual(
    [stale.now().status?.phase, stale.now().status?.reason, stale.now().status?.leaderUid],
    ["Electing", "LeaderElected", "u1"],
  );
  const mine = fakeApi({ phase: "Capturing", reason: "CaptureStarted", electionId: "e1" });
  assert.equal((await mine.records.claimLeader(SHORT, "e1", "u1")).ok, true);
  assert.deepEqual(mine.writes, [{ electionId: "e1", leaderUid: "u1" }], "no phase, no conditions");
  const ready = fakeApi({ phase: "Ready", electionId: "e1" });
  assert.deepEqual(await ready.records.claimLeader(SHORT, "e1", "u1").then((v) => [v.ok, !v.ok && v.why]), [
    false,
    "cache Ready",
  ]);
});

void test("only a phase write touches the conditions and the phase's time", async () => {
  const f = fakeApi({ phase: "Ready", electionId: "e1", restores: 1 });
  await f.records.transition(SHORT, () => ({ restores: 2 }));
  assert.deepEqual(f.writes, [{ restores: 2 }]);
});
