import { test } from "node:test";
import assert from "node:assert/strict";
import type * as k8s from "@kubernetes/client-node";
import { ANN_ELECTION_ID, LABEL_HASH } from "../core/contract.js";
import { reviewRecordWrite, type RecordLookups, type RecordWrite } from "./records-review.js";

const HASH = "ab".repeat(32);
const SHORT = HASH.slice(0, 16);
const NODE_NAME = "authentication.kubernetes.io/node-name";

const leaderPod = (node: string, o: { name?: string; uid?: string; election?: string } = {}): k8s.V1Pod => ({
  metadata: {
    namespace: "team",
    name: o.name ?? "leader-0",
    uid: o.uid ?? "uid-0",
    labels: { [LABEL_HASH]: SHORT },
    annotations: { [ANN_ELECTION_ID]: o.election ?? "e1" },
  },
  spec: { nodeName: node, containers: [] },
});

function lookups(pods: k8s.V1Pod[], holder?: string): RecordLookups & { calls: string[] } {
  const calls: string[] = [];
  return {
    calls,
    podsOfCache: (namespace, short) => {
      calls.push(`pods ${namespace} ${short}`);
      return Promise.resolve(pods.filter((p) => p.metadata?.namespace === namespace));
    },
    captureLease: (name) => {
      calls.push(`lease ${name}`);
      return Promise.resolve(holder ? { spec: { holderIdentity: holder } } : undefined);
    },
  };
}

const record = (
  status: Record<string, unknown> = {},
  leader: Record<string, string> = { namespace: "team", name: "leader-0" },
) => ({
  spec: { hash: HASH, electionId: "e1", leader },
  status,
});

const as = (node: string | undefined, w: Omit<RecordWrite, "userInfo">): RecordWrite => ({
  ...w,
  userInfo: {
    username: "system:serviceaccount:warmstart-system:warmstart-node-agent",
    ...(node ? { extra: { [NODE_NAME]: [node] } } : {}),
  },
});

void test("the capture of an election is claimed only by the node its leader pod runs on", async () => {
  const look = lookups([leaderPod("node-a")]);
  const claim = (node: string, status: Record<string, unknown>) =>
    reviewRecordWrite(as(node, { operation: "UPDATE", oldObject: record(), object: record(status) }), look);
  assert.deepEqual(await claim("node-a", { node: "node-a" }), { allowed: true });
  assert.deepEqual(await claim("node-a", { node: "node-a", manifestDigest: "d".repeat(64) }), {
    allowed: true,
  });
  const forged = await claim("node-b", { node: "node-b", manifestDigest: "f".repeat(64) });
  assert.equal(forged.allowed, false);
  assert.match(
    forged.allowed ? "" : forged.message,
    /node node-b may not speak for the capture .* runs on node-a/,
  );
  // The leader's node may not be claimed by another node either, even naming the leader's.
  assert.equal((await claim("node-b", { node: "node-a" })).allowed, false);
});

void test("a write that claims no capture is let through without a lookup; a token bound to no node claims none", async () => {
  const look = lookups([leaderPod("node-a")]);
  const replica = { replicas: { "node-b": { url: "https://b", at: "2026-01-01T00:00:00Z" } } };
  assert.deepEqual(
    await reviewRecordWrite(
      as("node-b", { operation: "UPDATE", oldObject: record(), object: record(replica) }),
      look,
    ),
    { allowed: true },
  );
  assert.deepEqual(look.calls, []);
  const unbound = await reviewRecordWrite(
    as(undefined, { operation: "UPDATE", oldObject: record(), object: record({ node: "node-a" }) }),
    look,
  );
  assert.equal(unbound.allowed, false);
});

void test("a record is created by a node agent only for an election the capture Lease holds, led from its node", async () => {
  const create = (node: string, look: RecordLookups) =>
    reviewRecordWrite(as(node, { operation: "CREATE", object: record() }), look);
  const none = await create("node-a", lookups([leaderPod("node-a")]));
  assert.equal(none.allowed, false, "no Lease: nobody elected it");
  assert.match(none.allowed ? "" : none.message, /no capture Lease holds election e1/);
  assert.equal(
    (await create("node-a", lookups([leaderPod("node-a")], "e0"))).allowed,
    false,
    "another election's Lease",
  );
  assert.deepEqual(await create("node-a", lookups([leaderPod("node-a")], "e1")), { allowed: true });
  assert.equal(
    (await create("node-b", lookups([leaderPod("node-a")], "e1"))).allowed,
    false,
    "led from another node",
  );
});

void test("the leader is the one pod wearing the election where the record says: by name, or by the UID recorded", async () => {
  const byUid = record({ leaderUid: "uid-7", node: "node-a" }, { namespace: "team" });
  const write = as("node-a", {
    operation: "UPDATE",
    oldObject: record({ leaderUid: "uid-7" }, { namespace: "team" }),
    object: byUid,
  });
  assert.deepEqual(
    await reviewRecordWrite(
      write,
      lookups([
        leaderPod("node-b", { name: "x", uid: "uid-1" }),
        leaderPod("node-a", { name: "y", uid: "uid-7" }),
      ]),
    ),
    { allowed: true },
  );
  // Two pods wearing the election and no name or UID to tell them apart: a copy of the stamps; none counts.
  const noUid = as("node-a", {
    operation: "UPDATE",
    oldObject: record({}, { namespace: "team" }),
    object: record({ node: "node-a" }, { namespace: "team" }),
  });
  const twins = lookups([leaderPod("node-a", { name: "x" }), leaderPod("node-b", { name: "y" })]);
  assert.equal((await reviewRecordWrite(noUid, twins)).allowed, false);
  // Another election's pod is not this election's leader.
  const stale = lookups([leaderPod("node-a", { election: "e0" })]);
  assert.equal(
    (
      await reviewRecordWrite(
        as("node-a", { operation: "UPDATE", oldObject: record(), object: record({ node: "node-a" }) }),
        stale,
      )
    ).allowed,
    false,
  );
});
