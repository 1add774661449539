import assert from "node:assert/strict";
import { test } from "node:test";
import type { V1Lease, V1Pod } from "@kubernetes/client-node";
import { FakeClock } from "../../../test/support/testing.js";
import type { ModelCacheObject } from "../../common/modelcache.js";
import { electionFailure } from "./release.js";

const T0 = Date.parse("2026-12-01T12:00:00Z");
const DISK = "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, available: 512Mi. ";

function lease(deadlineMs: number): V1Lease {
  return {
    metadata: {
      name: "warmstart-capture-0123456789abcdef",
      annotations: { "warmstart.dev/deadline": new Date(deadlineMs).toISOString() },
      creationTimestamp: new Date(T0),
    },
    spec: { holderIdentity: "e1", acquireTime: new Date(T0) },
  };
}

function record(phase: string, leaderUid?: string): ModelCacheObject {
  return {
    metadata: { name: "0123456789abcdef" },
    spec: {
      hash: "0123456789abcdef".repeat(4),
      electionId: "e1",
      leader: { namespace: "ns", name: "leader" },
    },
    status: { phase, electionId: "e1", ...(leaderUid ? { leaderUid } : {}) },
  } as ModelCacheObject;
}

function leader(status: V1Pod["status"], uid = "u1"): V1Pod {
  return {
    metadata: { name: "leader", namespace: "ns", uid, annotations: { "warmstart.dev/election-id": "e1" } },
    status,
  };
}

const evicted = (message = DISK): V1Pod["status"] => ({
  phase: "Failed",
  reason: "Evicted",
  message,
  conditions: [{ type: "DisruptionTarget", status: "True", reason: "TerminationByKubelet", message }],
});

function look(clock: FakeClock, cache: ModelCacheObject, pods: V1Pod[]): ReturnType<typeof electionFailure> {
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
