import { recordNamesPod } from "../common/modelcache.js";
import assert from "node:assert/strict";
import { test } from "node:test";
import type { V1Pod } from "@kubernetes/client-node";
import { cancelReasonFor, cancelsCapture, decidePod, leaderSighting, timeToReadySeconds } from "./decide.js";

const HASH = "0123456789abcdef".repeat(4);

function leader(
  overrides: {
    labels?: Record<string, string>;
    annotations?: Record<string, string>;
    ready?: boolean;
    node?: string;
    phase?: string;
    deleting?: boolean;
  } = {},
): V1Pod {
  return {
    metadata: {
      name: "leader",
      namespace: "ns",
      uid: "u1",
      creationTimestamp: "2026-01-01T00:00:00Z" as unknown as Date,
      labels: {
        "warmstart.dev/capture": "true",
        "warmstart.dev/hash": HASH.slice(0, 16),
        ...overrides.labels,
      },
      annotations: {
        "warmstart.dev/hash": HASH,
        "warmstart.dev/election-id": "e1",
        ...overrides.annotations,
      },
      ...(overrides.deleting ? { deletionTimestamp: new Date() } : {}),
    },
    spec: { nodeName: overrides.node ?? "gpu-0", containers: [] },
    status: {
      phase: overrides.phase ?? "Running",
      conditions: [
        {
          type: "Ready",
          status: overrides.ready === false ? "False" : "True",
          lastTransitionTime: "2026-01-01T00:01:30.5Z" as unknown as Date,
        },
      ],
    },
  };
}

void test("a Ready leader on this node with its stamp is considered, under the stamped hash", () => {
  assert.deepEqual(decidePod(leader(), "gpu-0"), {
    action: "consider",
    hash: HASH,
    short: HASH.slice(0, 16),
    election: "e1",
  });
});

void test("the capture label without an election id is ignored: only an elected leader is captured", () => {
  const forged = leader();
  delete forged.metadata!.annotations!["warmstart.dev/election-id"];
  assert.deepEqual(decidePod(forged, "gpu-0"), { action: "skip", reason: "no-election-id" });
  assert.equal(cancelReasonFor("no-election-id"), "not-leader");
  assert.equal(leaderSighting(forged, "gpu-0"), undefined, "never recorded as a leader either");
});

void test("a leader is sighted (for its UID) before it is Ready, not when it is terminating or elsewhere", () => {
  const sighting = { hash: HASH, election: "e1", namespace: "ns", name: "leader" };
  assert.deepEqual(leaderSighting(leader({ ready: false }), "gpu-0"), sighting);
  assert.deepEqual(leaderSighting(leader(), "gpu-0"), sighting);
  assert.equal(leaderSighting(leader({ deleting: true }), "gpu-0"), undefined);
  assert.equal(leaderSighting(leader({ node: "gpu-1" }), "gpu-0"), undefined);
});

void test("a Ready blip does not stop a copy in progress; a pod going away does", () => {
  assert.equal(cancelsCapture("not-ready"), false);
  for (const r of ["terminating", "no-capture-label", "other-node", "no-election-id"] as const)
    assert.equal(cancelsCapture(r), true, r);
});

void test("skips say why", () => {
  const skip = (p: V1Pod): string | undefined => {
    const d = decidePod(p, "gpu-0");
    return d.action === "skip" ? d.reason : undefined;
  };
  assert.equal(skip(leader({ labels: { "warmstart.dev/capture": "false" } })), "no-capture-label");
  assert.equal(skip(leader({ node: "gpu-1" })), "other-node");
  assert.equal(skip(leader({ ready: false })), "not-ready");
  assert.equal(skip(leader({ phase: "Pending" })), "not-ready");
  assert.equal(skip(leader({ deleting: true })), "terminating");
  assert.equal(skip(leader({ annotations: { "warmstart.dev/hash": "" } })), "no-hash");
  assert.equal(skip(leader({ annotations: { "warmstart.dev/hash": "not-a-hash" } })), "no-hash");
  assert.equal(
    skip(leader({ labels: { "warmstart.dev/hash": "ffffffffffffffff" } })),
    "no-hash",
    "label and stamp disagree",
  );
});

void test("the stamp is read as is: the pod's spec is never hashed again", () => {
  const p = leader();
  p.spec!.containers = [{ name: "main", image: "other:tag", args: ["--model", "something-else"] }];
  const d = decidePod(p, "gpu-0");
  assert.equal(d.action === "consider" && d.hash, HASH);
});

void test("cancelling a warm-up maps each skip to a release reason", () => {
  assert.equal(cancelReasonFor("no-capture-label"), "label-removed");
  assert.equal(cancelReasonFor("not-ready"), "not-ready");
  assert.equal(cancelReasonFor("terminating"), "terminating");
  assert.equal(cancelReasonFor("other-node"), "warmup-cancelled");
});

void test("time to Ready works with watch strings and list Dates", () => {
  assert.equal(timeToReadySeconds(leader()), 90.5);
  const p = leader();
  p.metadata!.creationTimestamp = new Date("2026-01-01T00:00:00Z");
  p.status!.conditions![0]!.lastTransitionTime = new Date("2026-01-01T00:00:10Z");
  assert.equal(timeToReadySeconds(p), 10);
  assert.equal(timeToReadySeconds(leader({ ready: false })), undefined);
});

test("only the pod the election record names can be its leader: its namespace, and its name when recorded", () => {
  assert.equal(recordNamesPod({ namespace: "ns" }, { namespace: "ns", name: "any" }), true);
  assert.equal(recordNamesPod({ namespace: "ns", name: "a" }, { namespace: "ns", name: "a" }), true);
  assert.equal(recordNamesPod({ namespace: "ns", name: "a" }, { namespace: "ns", name: "b" }), false);
  assert.equal(recordNamesPod({ namespace: "ns" }, { namespace: "kube-system", name: "a" }), false);
  assert.equal(recordNamesPod(undefined, { namespace: "ns" }), false, "a record naming nobody names nobody");
  assert.equal(recordNamesPod({}, { namespace: "" }), false);
});
