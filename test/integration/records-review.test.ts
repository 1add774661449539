/**
 * The records review (src/webhook/records-review.ts) registered with the real API server as the
 * webhook registers it: a node agent's token claims the capture of an election only from the node
 * its leader pod runs on, and creates a record only for an election the capture Lease holds. The
 * review runs in-process behind its own ValidatingWebhookConfiguration, for an account of this
 * test's own (so nothing else in the cluster is reviewed by it); writes are dry runs.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import * as k8s from "@kubernetes/client-node";
import {
  cleanupHash,
  createWorkers,
  grantCluster,
  impersonatingConfig,
  kube,
  listPods,
  tempNamespace,
  waitFor,
} from "../harness.js";
import { getCache, mcRef, mergePatch } from "../agents.js";
import { createCA, issueCert } from "../../src/common/certs.js";
import { SYSTEM_NAMESPACE } from "../../src/common/kube.js";
import { createLogger } from "../../src/common/log.js";
import { LABEL_HASH, MODELCACHE, shortHash } from "../../src/core/contract.js";
import { recordsHandler } from "../../src/webhook/records-review.js";
import { recordsWebhookConfiguration, registerRecordsWebhook } from "../../src/webhook/registration.js";
import { startAdmissionServer } from "../../src/webhook/server.js";

const NODE_NAME = "authentication.kubernetes.io/node-name";
const refusal = (err: unknown): string => (err as { body?: string }).body ?? String(err);

test("a node agent claims a capture only from its leader's node, and creates a record only for a held election", async (t) => {
  const { kc, core, coordination, admission } = await kube();
  const suffix = randomBytes(3).toString("hex");
  const user = `system:serviceaccount:${SYSTEM_NAMESPACE}:records-review-${suffix}`;
  const ns = await tempNamespace(t, "records");
  await createWorkers(ns, { replicas: 1, args: ["--model", `org/records-${suffix}`] });
  const leader = await waitFor("the leader, stamped and scheduled", async () =>
    (await listPods(ns)).find((p) => p.spec?.nodeName && p.metadata?.labels?.[LABEL_HASH]),
  );
  const short = leader.metadata!.labels![LABEL_HASH]!;
  await cleanupHash(t, short);
  await waitFor("the record", () => getCache(short));
  const there = leader.spec!.nodeName!;
  const other = there === "gpu-0" ? "gpu-1" : "gpu-0";

  // The review, served here, registered as the webhook registers it (for this test's account).
  const log = createLogger("records-review", "silent");
  const ca = await createCA("records review test CA");
  const pem = await issueCert(ca, { commonName: "records-review", ips: ["127.0.0.1"], usage: "server" });
  const server = await startAdmissionServer({
    host: "127.0.0.1",
    port: 0,
    cert: pem,
    maxBodyBytes: 1 << 20,
    handler: () => Promise.reject(new Error("no pods here")),
    recordsHandler: recordsHandler({ core, coordination, systemNamespace: SYSTEM_NAMESPACE }, log),
    onHandlerError: (_err, review) => ({ uid: review.request.uid, allowed: true }),
    log,
  });
  t.after(() => server.close());
  const name = `records-review-${suffix}`;
  await registerRecordsWebhook(
    admission,
    recordsWebhookConfiguration({
      name,
      url: server.url,
      caBundle: ca.cert,
      timeoutSeconds: 5,
      nodeAgentUser: user,
    }),
  );
  t.after(() => admission.deleteValidatingWebhookConfiguration({ name }).then(() => undefined));
  await grantCluster(t, name, user, [
    { apiGroups: ["warmstart.dev"], resources: ["modelcaches"], verbs: ["get", "create", "patch"] },
    { apiGroups: ["warmstart.dev"], resources: ["modelcaches/status"], verbs: ["patch"] },
  ]);
  const agentOf = (node: string): k8s.CustomObjectsApi =>
    impersonatingConfig(kc, user, { [NODE_NAME]: node }).makeApiClient(k8s.CustomObjectsApi);
  const claim = (node: string, status: object): Promise<unknown> =>
    agentOf(node).patchClusterCustomObjectStatus(
      { ...mcRef, name: short, body: { status }, dryRun: "All" },
      mergePatch,
    );

  const digest = randomBytes(32).toString("hex");
  await waitFor("the review to refuse another node's claim", async () => {
    try {
      await claim(other, { node: other, manifestDigest: digest });
      return false;
    } catch (err) {
      return /may not speak for the capture/.test(refusal(err));
    }
  });
  // The leader's node claims it.
  await claim(there, { node: there, manifestDigest: digest });
  // Another node writing only a digest (the leader's node left as recorded) is still another node.
  await assert.rejects(claim(other, { manifestDigest: randomBytes(32).toString("hex") }), (err) =>
    /may not speak for the capture/.test(refusal(err)),
  );
  // A record for a hash nobody elected: refused, whatever node creates it.
  const hash = randomBytes(32).toString("hex");
  await assert.rejects(
    agentOf(there).createClusterCustomObject({
      ...mcRef,
      body: {
        apiVersion: `${MODELCACHE.group}/${MODELCACHE.version}`,
        kind: MODELCACHE.kind,
        metadata: { name: shortHash(hash) },
        spec: {
          hash,
          electionId: "e-forged",
          leader: { namespace: ns, name: leader.metadata!.name!, node: there },
        },
      },
      dryRun: "All",
    }),
    (err) => /no capture Lease holds election e-forged/.test(refusal(err)),
  );
  // Writes that claim nothing are not the review's (a replica of its own).
  await agentOf(other).patchClusterCustomObjectStatus(
    {
      ...mcRef,
      name: short,
      body: { status: { replicas: { [other]: { url: "https://x:1", at: new Date().toISOString() } } } },
      dryRun: "All",
    },
    mergePatch,
  );
});
