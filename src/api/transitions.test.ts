import assert from "node:assert/strict";
import { test } from "node:test";
import { CACHE_PHASES, type CachePhase } from "./names.js";
import { CACHE_EVENTS, next, transition, type CacheEvent, type Next } from "./transitions.js";

/**
 * Every cell, spelled out: [phase, event, same election, other election]. `-` is "ignore". The
 * guards each writer applied before the table existed, cell by cell:
 * - elect (webhook's reset): anything but Ready is reset to Electing;
 * - leaderSeen (claimLeader): Ready refuses; a status of an earlier election (or none) restarts at
 *   Electing, this election's keeps its phase;
 * - captureStarted, captured (node agent): never over Ready nor over this election's Failed,
 *   except that a failed promote of this election may be retried, asked for by name only
 *   (retryPromote);
 * - promoted: only this election's Promoting becomes Ready;
 * - failed, electionEnded: never over Ready; the first word on how an election ended stands;
 * - deleting: from anything.
 */
const ROWS: [CachePhase | undefined, CacheEvent, Next, Next][] = [
  [undefined, "elect", "Electing", "Electing"],
  [undefined, "leaderSeen", "Electing", "Electing"],
  [undefined, "captureStarted", "Capturing", "Capturing"],
  [undefined, "captured", "Promoting", "Promoting"],
  [undefined, "retryPromote", "Promoting", "Promoting"],
  [undefined, "promoted", "ignore", "ignore"],
  [undefined, "failed", "Failed", "Failed"],
  [undefined, "electionEnded", "Failed", "Failed"],
  [undefined, "deleting", "Failed", "Failed"],

  ["Electing", "elect", "Electing", "Electing"],
  ["Electing", "leaderSeen", "Electing", "Electing"],
  ["Electing", "captureStarted", "Capturing", "Capturing"],
  ["Electing", "captured", "Promoting", "Promoting"],
  ["Electing", "retryPromote", "Promoting", "Promoting"],
  ["Electing", "promoted", "ignore", "ignore"],
  ["Electing", "failed", "Failed", "Failed"],
  ["Electing", "electionEnded", "Failed", "Failed"],
  ["Electing", "deleting", "Failed", "Failed"],

  ["Capturing", "elect", "Electing", "Electing"],
  ["Capturing", "leaderSeen", "Capturing", "Electing"],
  ["Capturing", "captureStarted", "Capturing", "Capturing"],
  ["Capturing", "captured", "Promoting", "Promoting"],
  ["Capturing", "retryPromote", "Promoting", "Promoting"],
  ["Capturing", "promoted", "ignore", "ignore"],
  ["Capturing", "failed", "Failed", "Failed"],
  ["Capturing", "electionEnded", "Failed", "Failed"],
  ["Capturing", "deleting", "Failed", "Failed"],

  ["Promoting", "elect", "Electing", "Electing"],
  ["Promoting", "leaderSeen", "Promoting", "Electing"],
  ["Promoting", "captureStarted", "Capturing", "Capturing"],
  ["Promoting", "captured", "Promoting", "Promoting"],
  ["Promoting", "retryPromote", "Promoting", "Promoting"],
  ["Promoting", "promoted", "Ready", "ignore"],
  ["Promoting", "failed", "Failed", "Failed"],
  ["Promoting", "electionEnded", "Failed", "Failed"],
  ["Promoting", "deleting", "Failed", "Failed"],

  ["Ready", "elect", "ignore", "ignore"],
  ["Ready", "leaderSeen", "ignore", "ignore"],
  ["Ready", "captureStarted", "ignore", "ignore"],
  ["Ready", "captured", "ignore", "ignore"],
  ["Ready", "retryPromote", "ignore", "ignore"],
  ["Ready", "promoted", "ignore", "ignore"],
  ["Ready", "failed", "ignore", "ignore"],
  ["Ready", "electionEnded", "ignore", "ignore"],
  ["Ready", "deleting", "Failed", "Failed"],

  ["Failed", "elect", "Electing", "Electing"],
  ["Failed", "leaderSeen", "Failed", "Electing"],
  ["Failed", "captureStarted", "ignore", "Capturing"],
  ["Failed", "captured", "ignore", "Promoting"],
  ["Failed", "retryPromote", "Promoting", "Promoting"],
  ["Failed", "promoted", "ignore", "ignore"],
  ["Failed", "failed", "ignore", "Failed"],
  ["Failed", "electionEnded", "ignore", "Failed"],
  ["Failed", "deleting", "Failed", "Failed"],
];

void test("the rows cover every phase x event once", () => {
  const keys = ROWS.map(([p, e]) => `${p ?? "none"}/${e}`);
  assert.equal(new Set(keys).size, keys.length, "no cell twice");
  assert.equal(keys.length, (CACHE_PHASES.length + 1) * CACHE_EVENTS.length, "every cell");
});

for (const [phase, event, same, other] of ROWS) {
  void test(`${phase ?? "(no phase)"} on ${event}: same election → ${same}, other → ${other}`, () => {
    assert.equal(transition(phase, event, true), same);
    assert.equal(transition(phase, event, false), other);
  });
}

void test("next reads the election from the status; a failed promote is retried only when asked by name", () => {
  assert.equal(next(undefined, "captureStarted", "e1"), "Capturing");
  assert.equal(
    next({ phase: "Failed", electionId: "e1", reason: "CaptureFailed" }, "captureStarted", "e1"),
    "ignore",
  );
  assert.equal(
    next({ phase: "Failed", electionId: "e0", reason: "CaptureFailed" }, "captureStarted", "e1"),
    "Capturing",
  );
  assert.equal(
    next({ phase: "Failed", electionId: "e1", reason: "CaptureFailed" }, "captured", "e1"),
    "ignore",
  );
  // A promote resumed on a look from before its failure (the record was Promoting) does not
  // start over; the retry, asked for at a resync, does.
  assert.equal(
    next({ phase: "Failed", electionId: "e1", reason: "PromoteFailed" }, "captured", "e1"),
    "ignore",
  );
  assert.equal(
    next({ phase: "Failed", electionId: "e1", reason: "PromoteFailed" }, "retryPromote", "e1"),
    "Promoting",
  );
  // An election that ended another way is not a promote to retry.
  for (const reason of ["CaptureFailed", "LeaderGone", "Unsupported"])
    assert.equal(next({ phase: "Failed", electionId: "e1", reason }, "retryPromote", "e1"), "ignore", reason);
  assert.equal(next({ phase: "Promoting", electionId: "e1" }, "promoted", "e1"), "Ready");
  assert.equal(next({ phase: "Promoting", electionId: "e0" }, "promoted", "e1"), "ignore");
  assert.equal(next({ phase: "Promoting" }, "promoted", "e1"), "ignore", "a status that names no election");
});
