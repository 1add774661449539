import assert from "node:assert/strict";
import { test } from "node:test";
import { CaptureMarks, type MarkEvent } from "./marks.js";

const H = "a".repeat(64);

void test("a pod is marked once; a second mark is refused while the first is in progress", () => {
  const marks = new CaptureMarks();
  const m = marks.tryMark("uid-1", "ns/leader", H);
  assert.ok(m);
  assert.equal(m.stage, "warmup");
  assert.equal(marks.tryMark("uid-1", "ns/leader", H), undefined);
  assert.equal(marks.get("uid-1"), m);
  assert.equal(marks.forKey("ns/leader"), m);
  assert.equal(marks.busyWith(H), true);
  assert.equal(marks.inProgressCount, 1);
});

void test("a released mark lets a retry fire, and says why it was released", () => {
  const events: MarkEvent[] = [];
  const marks = new CaptureMarks((e) => events.push(e));
  const m = marks.tryMark("uid-1", "ns/leader", H)!;
  assert.equal(marks.release(m, "warmup-cancelled"), true);
  assert.equal(m.controller.signal.aborted, true, "its pipeline is told to stop");
  assert.equal(marks.get("uid-1"), undefined);
  assert.equal(marks.lastRelease("uid-1"), "warmup-cancelled");
  assert.equal(marks.busyWith(H), false);
  const retry = marks.tryMark("uid-1", "ns/leader", H);
  assert.ok(retry, "the retry can fire");
  assert.notEqual(retry, m);
  assert.deepEqual(
    events.map((e) => [e.type, e.reason]),
    [
      ["marked", undefined],
      ["released", "warmup-cancelled"],
      ["marked", undefined],
    ],
  );
});

void test("a committed capture keeps the pod retired: no second mark on resync", () => {
  const marks = new CaptureMarks();
  const m = marks.tryMark("uid-1", "ns/leader", H)!;
  assert.equal(marks.commit(m), true);
  assert.equal(marks.isCommitted("uid-1"), true);
  assert.equal(marks.inProgressCount, 0);
  assert.equal(marks.committedCount, 1);
  assert.equal(marks.tryMark("uid-1", "ns/leader", H), undefined, "a resync never captures it again");
  // The pipeline's cleanup runs after the commit: it must not undo it.
  assert.equal(marks.release(m, "error"), false);
  assert.equal(marks.isCommitted("uid-1"), true);
  assert.equal(marks.lastRelease("uid-1"), undefined);
});

void test("a late release of an old mark never frees the newer mark on the same pod", () => {
  const marks = new CaptureMarks();
  const old = marks.tryMark("uid-1", "ns/leader", H)!;
  marks.release(old, "not-ready");
  const fresh = marks.tryMark("uid-1", "ns/leader", H)!;
  // The cancelled pipeline finally gets to its cleanup.
  assert.equal(marks.release(old, "not-ready"), false);
  assert.equal(marks.commit(old), false);
  assert.equal(marks.get("uid-1"), fresh);
  assert.equal(fresh.controller.signal.aborted, false);
});

void test("cancel asks the owner to stop; the owner releases with that reason", () => {
  const marks = new CaptureMarks();
  const m = marks.tryMark("uid-1", "ns/leader", H)!;
  marks.cancel(m, "pod-replaced");
  assert.equal(m.controller.signal.reason, "pod-replaced");
  assert.equal(marks.get("uid-1"), m, "still marked until its pipeline lets go");
  marks.cancel(m, "pod-deleted");
  assert.equal(m.controller.signal.reason, "pod-replaced", "the first reason stands");
  assert.equal(marks.release(m, m.controller.signal.reason as "pod-replaced"), true);
  assert.equal(marks.lastRelease("uid-1"), "pod-replaced");
});

void test("a replacement pod under the same name gets its own mark", () => {
  const marks = new CaptureMarks();
  const a = marks.tryMark("uid-a", "ns/leader", H)!;
  const b = marks.tryMark("uid-b", "ns/leader", H);
  assert.ok(b);
  assert.equal(marks.inProgressCount, 2);
  marks.release(a, "pod-replaced");
  assert.equal(marks.forKey("ns/leader"), b);
});

void test("forgetting a deleted pod drops its committed record", () => {
  const marks = new CaptureMarks();
  marks.commit(marks.tryMark("uid-1", "ns/leader", H)!);
  marks.forget("uid-1");
  assert.equal(marks.isCommitted("uid-1"), false);
  assert.equal(marks.committedCount, 0);
});

void test("the release history is bounded", () => {
  const marks = new CaptureMarks(() => {}, 3);
  for (let i = 0; i < 5; i++) marks.release(marks.tryMark(`uid-${i}`, `ns/p${i}`, H)!, "error");
  assert.equal(marks.lastRelease("uid-0"), undefined);
  assert.equal(marks.lastRelease("uid-4"), "error");
});
