import assert from "node:assert/strict";
import { test } from "node:test";
import { conditionsFor, stampStatus } from "./conditions.js";
import type { CachePhase } from "./names.js";

const T0 = new Date("2026-01-01T00:00:00Z");
const T1 = new Date("2026-01-01T00:01:00Z");

void test("Ready and Progressing follow the phase, with its reason and message", () => {
  const cases: [CachePhase, string, string][] = [
    ["Electing", "False", "True"],
    ["Capturing", "False", "True"],
    ["Promoting", "False", "True"],
    ["Ready", "True", "False"],
    ["Failed", "False", "False"],
  ];
  for (const [phase, ready, progressing] of cases) {
    const c = conditionsFor({ phase, reason: "Why", message: "m" }, undefined, { now: T0, generation: 3 });
    assert.deepEqual(
      c.map((x) => [x.type, x.status, x.reason, x.message, x.lastTransitionTime, x.observedGeneration]),
      [
        ["Ready", ready, "Why", "m", T0.toISOString(), 3],
        ["Progressing", progressing, "Why", "m", T0.toISOString(), 3],
      ],
      phase,
    );
  }
});

void test("a condition's time moves only when its status does; the reason falls back to the phase", () => {
  const capturing = conditionsFor({ phase: "Capturing", reason: "CaptureStarted" }, undefined, { now: T0 });
  const promoting = conditionsFor({ phase: "Promoting", reason: "" }, capturing, { now: T1 });
  assert.deepEqual(
    promoting.map((c) => [c.type, c.reason, c.lastTransitionTime, "observedGeneration" in c]),
    [
      ["Ready", "Promoting", T0.toISOString(), false],
      ["Progressing", "Promoting", T0.toISOString(), false],
    ],
  );
  const ready = conditionsFor({ phase: "Ready", reason: "Promoted" }, promoting, { now: T1 });
  assert.deepEqual(
    ready.map((c) => c.lastTransitionTime),
    [T1.toISOString(), T1.toISOString()],
  );
  assert.equal(conditionsFor({}, undefined, { now: T0 })[0]?.status, "Unknown");
});

void test("stampStatus adds conditions to a phase write, and the phase's time only when it changes", () => {
  const current = {
    metadata: { generation: 2 },
    status: { phase: "Capturing" as const, reason: "CaptureStarted", message: "on n1", node: "n1" },
  };
  assert.deepEqual(stampStatus(current, { restores: 1 }, T1), { restores: 1 }, "no phase: left alone");
  const same = stampStatus(current, { phase: "Capturing", reason: "CaptureStarted", message: "again" }, T1);
  assert.equal(same.lastTransitionTime, undefined);
  assert.equal(same.conditions?.[1]?.message, "again");
  const moved = stampStatus(current, { phase: "Failed", reason: "CaptureFailed", message: "disk" }, T1);
  assert.equal(moved.lastTransitionTime, T1.toISOString());
  assert.deepEqual(
    moved.conditions?.map((c) => [c.type, c.status, c.reason, c.observedGeneration]),
    [
      ["Ready", "False", "CaptureFailed", 2],
      ["Progressing", "False", "CaptureFailed", 2],
    ],
  );
});
