/**
 * The records policy (deploy/helm/warmstart/templates/records-policy.yaml) on the real API server:
 * a node agent's token, bound to its node, says only what that node may say on a ModelCache. The
 * honest agent's own writes (CacheRecords, as the node agent makes them) pass; another node's
 * forgeries of the trust anchors downstream code acts on (the manifest digest receivers check a
 * tree against, the replicas they fetch from, the source restores mount, the spec) are refused.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import { grantCluster, impersonatingConfig, kube, waitFor } from "../harness.js";
import { installPolicyCopy } from "../chart.js";
import { cleanupCache, getCache, mcRef, mergePatch } from "../agents.js";
import { CacheRecords } from "../../src/common/cache-record.js";
import { SYSTEM_NAMESPACE } from "../../src/common/kube.js";
import { ANN_CACHE_ENV, ANN_CACHE_SOURCE, shortHash } from "../../src/core/contract.js";

/** The chart's node agents' account, and this test's stand-in for it (the cluster's own webhook
 * reviews the real account's capture claims, which this test's made-up leader would not pass). */
const CHART_NODE_AGENT = `system:serviceaccount:${SYSTEM_NAMESPACE}:warmstart-node-agent`;
const NODE_AGENT = `system:serviceaccount:${SYSTEM_NAMESPACE}:records-policy-${randomBytes(3).toString("hex")}`;
const NODE_NAME = "authentication.kubernetes.io/node-name";

/** The custom-objects API as the node agent of `node` (undefined: a token bound to no pod). */
async function nodeAgent(node: string | undefined): Promise<k8s.CustomObjectsApi> {
  const { kc } = await kube();
  return impersonatingConfig(kc, NODE_AGENT, node ? { [NODE_NAME]: node } : {}).makeApiClient(
    k8s.CustomObjectsApi,
  );
}

const digestOf = (): string => randomBytes(32).toString("hex");
const refusal = (err: unknown): string => (err as { body?: string }).body ?? String(err);

test("a node agent's token writes only what its own node may say on a cache record", async (t) => {
  const { kc } = await kube();
  const admission = kc.makeApiClient(k8s.AdmissionregistrationV1Api);
  const suffix = randomBytes(3).toString("hex");
  const name = `records-${suffix}`;
  await installPolicyCopy(t, admission, {
    suffix: "-records",
    name,
    namespace: SYSTEM_NAMESPACE,
    renameUser: { from: CHART_NODE_AGENT, to: NODE_AGENT },
  });
  // The chart's grants on records, for the impersonated account.
  await grantCluster(t, name, NODE_AGENT, [
    { apiGroups: ["warmstart.dev"], resources: ["modelcaches"], verbs: ["get", "create", "patch"] },
    { apiGroups: ["warmstart.dev"], resources: ["modelcaches/status"], verbs: ["patch"] },
  ]);

  const [a, b, unbound] = await Promise.all([nodeAgent("node-a"), nodeAgent("node-b"), nodeAgent(undefined)]);
  const hash = randomBytes(32).toString("hex");
  const short = shortHash(hash);
  cleanupCache(t, short, []);
  const election = `e-${suffix}`;
  const honest = new CacheRecords(a);
  const status = (api: k8s.CustomObjectsApi, body: object) =>
    api.patchClusterCustomObjectStatus({ ...mcRef, name: short, body: { status: body } }, mergePatch);
  const meta = (api: k8s.CustomObjectsApi, body: object) =>
    api.patchClusterCustomObject({ ...mcRef, name: short, body }, mergePatch);

  // The policy reaches the admission chain a moment after it is created: probe with a forged record.
  // The policy reaches the admission chain a moment after it is created: probe with dry runs.
  await waitFor("the policy to refuse a record for a leader on another node", async () => {
    const probe = randomBytes(32).toString("hex");
    try {
      await b.createClusterCustomObject({
        ...mcRef,
        body: {
          apiVersion: `${mcRef.group}/${mcRef.version}`,
          kind: "ModelCache",
          metadata: { name: shortHash(probe) },
          spec: { hash: probe, electionId: election, leader: { namespace: "ns", name: "p", node: "node-a" } },
        },
        dryRun: "All",
      });
      return false;
    } catch (err) {
      return /leader on its own node/.test(refusal(err));
    }
  });

  // The honest capturing node, through the node agent's own code: every write passes.
  await honest.ensure(hash, { electionId: election, leader: { namespace: "ns", name: "p", node: "node-a" } });
  assert.equal((await honest.claimLeader(short, election, "uid-1")).ok, true);
  await honest.advance(short, election, "captureStarted", { reason: "CaptureStarted", node: "node-a" });
  const digest = digestOf();
  const captured = await honest.advance(short, election, "captured", {
    reason: "Captured",
    node: "node-a",
    manifestDigest: digest,
  });
  assert.equal(captured?.written, true);
  assert.equal(
    await honest.annotateForElection(short, election, ANN_CACHE_SOURCE, '{"backend":"node-store"}'),
    true,
  );
  const at = new Date().toISOString();
  await honest.setReplica(short, "node-a", { url: "https://10.0.0.1:9443", at, filling: null });
  await honest.advance(short, election, "promoted", { reason: "Promoted" });
  assert.equal((await getCache(short))?.status?.phase, "Ready");
  // Another node records, changes and removes its own copy.
  await new CacheRecords(b).setReplica(short, "node-b", { url: "https://10.0.0.2:9443", at, filling: null });
  await new CacheRecords(b).setReplica(short, "node-b", null);

  // Forgeries: each refused, the record left as it was.
  const before = await getCache(short);
  const forged: Array<[string, () => Promise<unknown>, RegExp]> = [
    ["another node rewrites the digest", () => status(b, { manifestDigest: digestOf() }), /written once/],
    [
      "another node claims the capture and rewrites the digest",
      () => status(b, { node: "node-b", manifestDigest: digestOf() }),
      /written once/,
    ],
    ["another node removes the digest", () => status(b, { manifestDigest: null }), /written once/],
    [
      "the capturing node rewrites its own digest",
      () => status(a, { manifestDigest: digestOf() }),
      /written once/,
    ],
    [
      "another node points the capturing node's replica at itself",
      () => status(b, { replicas: { "node-a": { url: "https://10.0.0.66:9443", at } } }),
      /its own node's replica only/,
    ],
    [
      "another node records a copy for a third node",
      () => status(b, { replicas: { "node-c": { url: "https://10.0.0.66:9443", at } } }),
      /its own node's replica only/,
    ],
    [
      "another node drops the origin",
      () => status(b, { replicas: { "node-a": null } }),
      /own node's replica only/,
    ],
    [
      "a token bound to no node records a copy",
      () => status(unbound, { replicas: { "": { url: "https://10.0.0.66:9443", at } } }),
      /own node's replica only/,
    ],
    [
      "another node rewrites the promoted source",
      () => meta(b, { metadata: { annotations: { [ANN_CACHE_SOURCE]: '{"backend":"host-path"}' } } }),
      /written by the node that captured/,
    ],
    [
      "a node agent rewrites the recorded cache env (LD_PRELOAD into the tree)",
      () =>
        meta(a, {
          metadata: { annotations: { [ANN_CACHE_ENV]: '[{"name":"LD_PRELOAD","value":"{root}/x.so"}]' } },
        }),
      /promoted source only/,
    ],
    [
      "a node agent moves the election",
      () => meta(a, { spec: { electionId: "e-forged" } }),
      /never rewrites/,
    ],
    [
      "a node agent renames the leader",
      () => meta(b, { spec: { leader: { namespace: "ns", name: "p", node: "node-b" } } }),
      /never rewrites/,
    ],
  ];
  for (const [what, attempt, why] of forged)
    await assert.rejects(attempt(), (err) => why.test(refusal(err)), what);
  const after = await getCache(short);
  assert.deepEqual(after?.status?.manifestDigest, before?.status?.manifestDigest);
  assert.deepEqual(after?.status?.replicas, before?.status?.replicas);
  assert.deepEqual(after?.spec, before?.spec);
  assert.deepEqual(after?.metadata.annotations, before?.metadata.annotations);
  // The capturing node may publish its source again (a promote into a new namespace).
  await honest.annotate(short, ANN_CACHE_SOURCE, '{"backend":"node-store","again":true}');
});
