/**
 * CacheRecords (src/common/cache-record.ts) against the real API server: each test creates a
 * ModelCache of a random hash with a given status, moves it through CacheRecords, and reads back
 * what the server holds. The client is wrapped to record every status write it sends (and how the
 * server answered), and can write to the record itself between a transition's read and its write.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import type * as k8s from "@kubernetes/client-node";
import { kube } from "../harness.js";
import { cleanupCache, getCache, mcRef, mergePatch } from "../agents.js";
import { FINALIZER_CLEANUP, LABEL_HASH, MODELCACHE, shortHash } from "../../src/core/contract.js";
import { isConflict } from "../../src/common/kube.js";
import { CacheRecords } from "../../src/common/cache-record.js";
import { NOT_LEADER } from "../../src/api/reasons.js";
import type { ModelCacheObject } from "../../src/common/modelcache.js";

type Status = Record<string, unknown>;
type NamedRecord = ModelCacheObject & { metadata: { name: string } };

/** A fresh record of a random hash: spec about `electionId`, with `status` written as given. */
async function record(
  t: { after: (fn: () => Promise<void>) => void },
  status: Status | undefined,
  electionId = "e1",
): Promise<NamedRecord> {
  const { custom } = await kube();
  const hash = randomBytes(32).toString("hex");
  const name = shortHash(hash);
  cleanupCache(t, name, []);
  await custom.createClusterCustomObject({
    ...mcRef,
    body: {
      apiVersion: `${MODELCACHE.group}/${MODELCACHE.version}`,
      kind: MODELCACHE.kind,
      // Created with the cleanup finalizer the cluster's release controller would add, so that
      // write of its own never races the test's reads and writes.
      metadata: { name, labels: { [LABEL_HASH]: name }, finalizers: [FINALIZER_CLEANUP] },
      spec: { hash, electionId },
    },
  });
  if (status) await custom.patchClusterCustomObjectStatus({ ...mcRef, name, body: { status } }, mergePatch);
  return (await getCache(name)) as NamedRecord;
}

interface StatusWrite {
  status: Status;
  /** The HTTP status the server answered with when it refused the write. */
  refused?: number;
}

/**
 * CacheRecords over the real client, recording each status write sent. `beforeWrite(n)` runs
 * before the n-th status write (1-based) goes out: after the transition read the record.
 */
async function recorded(beforeWrite?: (n: number) => Promise<void>) {
  const { custom } = await kube();
  const writes: StatusWrite[] = [];
  const api = new Proxy(custom, {
    get(target, prop, receiver) {
      if (prop === "patchClusterCustomObjectStatus") {
        return async (...args: Parameters<k8s.CustomObjectsApi["patchClusterCustomObjectStatus"]>) => {
          const [req] = args;
          const w: StatusWrite = { status: structuredClone((req.body as { status: Status }).status) };
          writes.push(w);
          await beforeWrite?.(writes.length);
          try {
            return (await target.patchClusterCustomObjectStatus(...args)) as unknown;
          } catch (err) {
            if (isConflict(err)) w.refused = 409;
            throw err;
          }
        };
      }
      const v: unknown = Reflect.get(target, prop, receiver);
      return typeof v === "function" ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
  return { records: new CacheRecords(api), writes };
}

/** A status write to the record from outside CacheRecords (another writer). */
async function writeStatus(name: string, status: Status): Promise<void> {
  const { custom } = await kube();
  await custom.patchClusterCustomObjectStatus({ ...mcRef, name, body: { status } }, mergePatch);
}

const now = async (name: string): Promise<ModelCacheObject> => (await getCache(name))!;

void test("advance writes the table's phase for its election, with the conditions and the phase's time", async (t) => {
  const { custom } = await kube();
  const c = await record(t, {
    phase: "Electing",
    reason: "LeaderElected",
    electionId: "e1",
    leaderUid: "u1",
  });
  const name = c.metadata.name;
  // A spec change moves the record's generation past 1: the conditions must name the real one.
  await custom.patchClusterCustomObject(
    { ...mcRef, name, body: { spec: { model: "org/generation-bump" } } },
    mergePatch,
  );
  const generation = (await now(name)).metadata.generation!;
  assert.ok(generation >= 2, `generation ${generation}`);

  const { records, writes } = await recorded();
  const before = Date.now();
  const r = await records.advance(name, "e1", "captureStarted", { reason: "CaptureStarted", message: "m" });
  const after = Date.now();
  assert.equal(r?.written, true);
  assert.equal(writes.length, 1);
  const got = await now(name);
  assert.equal(
    r.cache.metadata.resourceVersion,
    got.metadata.resourceVersion,
    "returns the record as written",
  );
  assert.equal(got.metadata.generation, generation, "a status write leaves the generation");
  const s = got.status!;
  assert.deepEqual(
    [s.phase, s.reason, s.message, s.electionId, s.leaderUid],
    ["Capturing", "CaptureStarted", "m", "e1", "u1"],
  );
  assert.ok(s.lastTransitionTime);
  const at = Date.parse(s.lastTransitionTime);
  // RFC 3339 in the API keeps whole seconds at least; allow the rounding.
  assert.ok(at >= before - 1000 && at <= after + 1000, `phase time ${s.lastTransitionTime}`);
  assert.deepEqual(
    s.conditions?.map((x) => [x.type, x.status, x.reason, x.message, x.observedGeneration]),
    [
      ["Ready", "False", "CaptureStarted", "m", generation],
      ["Progressing", "True", "CaptureStarted", "m", generation],
    ],
  );
});

void test("advance leaves the record when the table says ignore, or when it is about another election", async (t) => {
  const ready = await record(t, { phase: "Ready", electionId: "e1" });
  const failed = await record(t, { phase: "Failed", reason: "CaptureFailed", electionId: "e1" });
  const other = await record(t, { phase: "Promoting", electionId: "e1" }, "e2");
  const { records, writes } = await recorded();
  for (const [c, event, reason] of [
    [ready, "failed", "X"],
    [failed, "captured", "Captured"],
    [other, "promoted", "Promoted"],
  ] as const) {
    const r = await records.advance(c.metadata.name, "e1", event, { reason });
    assert.equal(r?.written, false, `${c.status?.phase} + ${event}`);
    const got = await now(c.metadata.name);
    assert.equal(got.metadata.resourceVersion, c.metadata.resourceVersion, "untouched on the server");
    assert.deepEqual(got.status, c.status);
  }
  assert.deepEqual(writes, []);
  // An election that was never named (a pod without one) never writes either.
  assert.equal((await records.advance(ready.metadata.name, undefined, "deleting", {}))?.written, false);
  assert.deepEqual(writes, []);
});

void test("advance on a record that does not exist says so and writes nothing", async () => {
  const { records, writes } = await recorded();
  assert.equal(await records.advance(randomBytes(8).toString("hex"), "e1", "captured", {}), undefined);
  assert.deepEqual(writes, []);
});

void test("a failed promote moves again only on its retry, asked for by name", async (t) => {
  const failedAt = Date.now();
  const c = await record(t, {
    phase: "Failed",
    reason: "PromoteFailed",
    electionId: "e1",
    lastTransitionTime: new Date(failedAt).toISOString(),
  });
  const { records, writes } = await recorded();
  // A promote resumed on a look from before the failure: the failure stands.
  const resumed = await records.advance(c.metadata.name, "e1", "captured", { reason: "Captured" });
  assert.equal(resumed?.written, false);
  // A retry decided on a stale look, for a resync that began before this failure: it stands too.
  const early = await records.advance(
    c.metadata.name,
    "e1",
    "retryPromote",
    {},
    { failedBefore: failedAt - 60_000 },
  );
  assert.equal(early?.written, false);
  assert.deepEqual(writes, []);
  const r = await records.advance(
    c.metadata.name,
    "e1",
    "retryPromote",
    { reason: "Captured", message: "again" },
    { failedBefore: failedAt + 60_000 },
  );
  assert.equal(r?.written, true);
  const s = (await now(c.metadata.name)).status!;
  assert.deepEqual([s.phase, s.reason, s.message], ["Promoting", "Captured", "again"]);
  assert.equal(s.conditions?.find((x) => x.type === "Progressing")?.status, "True");
});

void test("fail counts once per election and never lands over Ready", async (t) => {
  const c = await record(t, {
    phase: "Capturing",
    electionId: "e1",
    failedCaptures: 1,
    lastFailedElection: "e0",
  });
  const name = c.metadata.name;
  const { records, writes } = await recorded();
  assert.equal((await records.fail(name, "e1", "CaptureFailed", "disk"))?.written, true);
  assert.equal((await records.fail(name, "e1", "CaptureFailed", "again"))?.written, false);
  const got = await now(name);
  const s = got.status!;
  assert.deepEqual([s.phase, s.message, s.failedCaptures, s.lastFailedElection], ["Failed", "disk", 2, "e1"]);
  assert.equal(writes.length, 1);
  assert.deepEqual(
    s.conditions?.map((x) => [x.type, x.status, x.observedGeneration]),
    [
      ["Ready", "False", got.metadata.generation],
      ["Progressing", "False", got.metadata.generation],
    ],
  );

  const ready = await record(t, { phase: "Ready", electionId: "e1" });
  assert.equal((await records.fail(ready.metadata.name, "e1", "CaptureFailed", "late"))?.written, false);
  assert.equal((await now(ready.metadata.name)).status?.phase, "Ready");
  assert.equal(writes.length, 1);
});

void test("a failure that is not a failed capture is written but not counted", async (t) => {
  const c = await record(t, {
    phase: "Capturing",
    electionId: "e1",
    failedCaptures: 1,
    lastFailedElection: "e0",
  });
  const { records } = await recorded();
  assert.equal((await records.fail(c.metadata.name, "e1", "LeaderGone", "pod gone"))?.written, true);
  const s = (await now(c.metadata.name)).status!;
  assert.deepEqual(
    [s.phase, s.reason, s.failedCaptures, s.lastFailedElection],
    ["Failed", "LeaderGone", 1, "e0"],
  );
});

void test("a write computed from a record changed meanwhile is refused and recomputed from the new one", async (t) => {
  const c = await record(t, { phase: "Capturing", reason: "CaptureStarted", electionId: "e1" });
  const name = c.metadata.name;
  // Another writer adds a field between this transition's read and its write.
  const { records, writes } = await recorded(async (n) => {
    if (n === 1) await writeStatus(name, { node: "elsewhere" });
  });
  const r = await records.advance(name, "e1", "captured", { reason: "Captured" });
  assert.equal(r?.written, true);
  assert.deepEqual(
    writes.map((w) => [w.status.phase, w.refused]),
    [
      ["Promoting", 409],
      ["Promoting", undefined],
    ],
  );
  const s = (await now(name)).status!;
  assert.deepEqual([s.phase, s.reason, s.node], ["Promoting", "Captured", "elsewhere"], "neither write lost");
});

void test("a Ready written between a transition's read and its write is never overwritten", async (t) => {
  const c = await record(t, { phase: "Promoting", reason: "Captured", electionId: "e1" });
  const name = c.metadata.name;
  const { records, writes } = await recorded(async (n) => {
    if (n === 1) await writeStatus(name, { phase: "Ready", reason: "Promoted" });
  });
  const r = await records.fail(name, "e1", "PromoteFailed", "late");
  assert.equal(r?.written, false, "recomputed over Ready: nothing to write");
  assert.deepEqual(
    writes.map((w) => [w.status.phase, w.refused]),
    [["Failed", 409]],
  );
  const s = (await now(name)).status!;
  assert.deepEqual([s.phase, s.reason, s.failedCaptures], ["Ready", "Promoted", undefined]);
});

void test("two concurrent failures of one election: one is written, and counted once", async (t) => {
  const c = await record(t, {
    phase: "Capturing",
    electionId: "e1",
    failedCaptures: 1,
    lastFailedElection: "e0",
  });
  const name = c.metadata.name;
  const { records } = await recorded();
  const [a, b] = await Promise.all([
    records.fail(name, "e1", "CaptureFailed", "a"),
    records.fail(name, "e1", "CaptureFailed", "b"),
  ]);
  assert.deepEqual([a?.written, b?.written].sort(), [false, true]);
  const s = (await now(name)).status!;
  assert.deepEqual(
    [s.phase, s.message, s.failedCaptures, s.lastFailedElection],
    ["Failed", a?.written ? "a" : "b", 2, "e1"],
  );
});

void test("a promote and a failure racing on one election: the first word stands", async (t) => {
  const c = await record(t, { phase: "Promoting", reason: "Captured", electionId: "e1" });
  const name = c.metadata.name;
  const { records } = await recorded();
  const [promoted, failed] = await Promise.all([
    records.advance(name, "e1", "promoted", { reason: "Promoted", message: "" }),
    records.fail(name, "e1", "PromoteFailed", "claims"),
  ]);
  assert.deepEqual([promoted?.written, failed?.written].sort(), [false, true]);
  const s = (await now(name)).status!;
  assert.equal(s.phase, promoted?.written ? "Ready" : "Failed");
  assert.equal(s.failedCaptures, failed?.written ? 1 : undefined);
});

void test("claimLeader: a status of an earlier election restarts at Electing; this election's keeps its phase", async (t) => {
  const stale = await record(t, { phase: "Failed", reason: "CaptureFailed", electionId: "e0" });
  const { records, writes } = await recorded();
  assert.equal((await records.claimLeader(stale.metadata.name, "e1", "u1")).ok, true);
  const st = (await now(stale.metadata.name)).status!;
  assert.deepEqual(
    [st.phase, st.reason, st.electionId, st.leaderUid],
    ["Electing", "LeaderElected", "e1", "u1"],
  );

  const mine = await record(t, { phase: "Capturing", reason: "CaptureStarted", electionId: "e1" });
  writes.length = 0;
  assert.equal((await records.claimLeader(mine.metadata.name, "e1", "u1")).ok, true);
  assert.deepEqual(
    writes.map((w) => w.status),
    [{ electionId: "e1", leaderUid: "u1" }],
    "no phase, no conditions",
  );
  const ms = (await now(mine.metadata.name)).status!;
  assert.deepEqual(
    [ms.phase, ms.reason, ms.leaderUid, ms.conditions],
    ["Capturing", "CaptureStarted", "u1", undefined],
  );
  // The recorded leader is the leader; another pod wearing the election is not.
  writes.length = 0;
  assert.equal((await records.claimLeader(mine.metadata.name, "e1", "u1")).ok, true);
  const copy = await records.claimLeader(mine.metadata.name, "e1", "u2");
  assert.deepEqual(
    [copy.ok, !copy.ok && copy.reason, !copy.ok && copy.why],
    [false, NOT_LEADER.OtherPod, "pod u1 is this election's recorded leader"],
  );
  assert.deepEqual(writes, []);

  const ready = await record(t, { phase: "Ready", electionId: "e1" });
  const r = await records.claimLeader(ready.metadata.name, "e1", "u1");
  assert.deepEqual([r.ok, !r.ok && r.reason, !r.ok && r.why], [false, NOT_LEADER.CacheReady, "cache Ready"]);
  const other = await records.claimLeader(mine.metadata.name, "e9", "u1");
  assert.deepEqual(
    [other.ok, !other.ok && other.reason, !other.ok && other.why],
    [false, NOT_LEADER.OtherElection, "the record is about election e1"],
  );
  const none = await records.claimLeader(randomBytes(8).toString("hex"), "e1", "u1");
  assert.deepEqual(
    [none.ok, !none.ok && none.reason, !none.ok && none.why],
    [false, NOT_LEADER.NoRecord, "the cache has no record"],
  );
  assert.deepEqual(writes, []);
});

void test("only a phase write touches the conditions and the phase's time", async (t) => {
  const c = await record(t, { phase: "Promoting", reason: "Captured", electionId: "e1" });
  const name = c.metadata.name;
  const { records, writes } = await recorded();
  assert.equal(
    (await records.advance(name, "e1", "promoted", { reason: "Promoted", restores: 1 }))?.written,
    true,
  );
  const ready = (await now(name)).status!;
  assert.equal(ready.phase, "Ready");
  assert.ok(ready.lastTransitionTime && ready.conditions?.length === 2);
  writes.length = 0;
  assert.equal((await records.transition(name, () => ({ restores: 2 })))?.written, true);
  assert.deepEqual(
    writes.map((w) => w.status),
    [{ restores: 2 }],
  );
  const s = (await now(name)).status!;
  assert.equal(s.restores, 2);
  assert.equal(s.lastTransitionTime, ready.lastTransitionTime);
  assert.deepEqual(s.conditions, ready.conditions);
});

void test("a promote's source is published only while the record is about its election and not Ready", async (t) => {
  const records = new CacheRecords((await kube()).custom);
  const ours = await record(t, { phase: "Promoting", electionId: "e1" });
  assert.equal(
    await records.annotateForElection(ours.metadata.name, "e1", "warmstart.dev/source", "{}"),
    true,
  );
  assert.equal((await getCache(ours.metadata.name))?.metadata.annotations?.["warmstart.dev/source"], "{}");

  // Superseded: admission recorded a newer election while this promote ran.
  const superseded = await record(t, { phase: "Electing", electionId: "e2" }, "e2");
  assert.equal(
    await records.annotateForElection(superseded.metadata.name, "e1", "warmstart.dev/source", "{}"),
    false,
  );
  const ready = await record(t, { phase: "Ready", electionId: "e1" });
  assert.equal(
    await records.annotateForElection(ready.metadata.name, "e1", "warmstart.dev/source", "{}"),
    false,
  );
  for (const r of [superseded, ready])
    assert.equal(
      (await getCache(r.metadata.name))?.metadata.annotations?.["warmstart.dev/source"],
      undefined,
    );
});
