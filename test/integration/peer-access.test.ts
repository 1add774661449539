/**
 * Which node a peer is, proven by its node agent's bound ServiceAccount token (the API server's
 * TokenReview), and which trees that node may have (src/node-agent/peer-access.ts): on the real
 * API server, with a real leader pod the webhook stamped on a simulated node.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import https from "node:https";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { cleanupHash, createWorkers, kube, listPods, tempNamespace, waitFor } from "../harness.js";
import { getCache } from "../agents.js";
import { createCA, issueCert } from "../../src/common/certs.js";
import { createLogger } from "../../src/common/log.js";
import { LABEL_HASH } from "../../src/core/contract.js";
import { PEER_AUDIENCE, PeerAccess } from "../../src/node-agent/peer-access.js";
import { PeerServer, type PeerIdentity } from "../../src/node-agent/replication/server.js";
import {
  NODE_AGENT_ACCOUNT,
  NODE_AGENT_USER,
  peerTlsFiles,
  writePeerToken,
} from "../../tools/localcluster/store-driver.js";

const peer = (token?: string): PeerIdentity => ({
  commonName: "node agents",
  fingerprint256: "",
  ...(token ? { token } : {}),
});

test("a tree goes only to the node a node agent's token names, while a pod there in the cache's scope wears its hash or mounts its claim", async (t) => {
  const { kc, core } = await kube();
  const ns = await tempNamespace(t, "peers");
  await createWorkers(ns, { replicas: 1, args: ["--model", `org/peers-${randomBytes(4).toString("hex")}`] });
  const leader = await waitFor("the leader, stamped and scheduled", async () =>
    (await listPods(ns)).find((p) => p.spec?.nodeName && p.metadata?.labels?.[LABEL_HASH]),
  );
  const short = leader.metadata!.labels![LABEL_HASH]!;
  await cleanupHash(t, short);
  const there = leader.spec!.nodeName!;
  const other = (await core.listNode()).items
    .map((n) => n.metadata!.name!)
    .find((n) => n !== there && n.startsWith("gpu-"));
  assert.ok(other, "a second simulated node");
  const cache = await waitFor("the cache record", () => getCache(short));

  const dir = await mkdtemp(join(tmpdir(), "peer-tokens-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await writePeerToken(kc, dir, there);
  await writePeerToken(kc, dir, other);
  const token = (node: string): Promise<string> => readFile(peerTlsFiles(dir, node).token, "utf8");
  const access = new PeerAccess({
    core,
    auth: kc.makeApiClient(k8s.AuthenticationV1Api),
    serviceAccount: NODE_AGENT_USER,
    record: (s) => (s === short ? cache : undefined),
    log: createLogger("peer-access", "silent"),
  });

  assert.equal(await access.allows(short, peer(await token(there))), true, "the leader's node");
  assert.equal(
    await access.allows(short, peer(await token(other))),
    false,
    "a node without a pod of the cache",
  );
  assert.equal(await access.allows(short, peer()), false, "no token: any node agent's certificate");
  assert.equal(
    await access.allows(randomBytes(8).toString("hex"), peer(await token(there))),
    false,
    "a cache without a record",
  );
  // Another account's token, bound to the same node: not a node agent.
  const nodeUid = (await core.readNode({ name: there })).metadata!.uid!;
  const boundTo = { kind: "Node", apiVersion: "v1", name: there, uid: nodeUid };
  const foreign = await core.createNamespacedServiceAccountToken({
    namespace: ns,
    name: "default",
    body: { spec: { audiences: [PEER_AUDIENCE], boundObjectRef: boundTo } },
  });
  assert.equal(await access.allows(short, peer(foreign.status!.token)), false, "another account's token");
  // The node agents' own account, but a token for the API server (another audience).
  const apiToken = await core.createNamespacedServiceAccountToken({
    ...NODE_AGENT_ACCOUNT,
    body: { spec: { audiences: [], boundObjectRef: boundTo } },
  });
  assert.equal(
    await access.allows(short, peer(apiToken.status!.token)),
    false,
    "a token of another audience",
  );
  // A pod in a namespace the webhook is never sent keeps the hash its author wrote: no grant.
  const forged = await core.createNamespacedPod({
    namespace: "kube-system",
    body: {
      metadata: { name: `forged-${short}`, labels: { [LABEL_HASH]: short } },
      spec: { nodeName: other, containers: [{ name: "c", image: "busybox" }] },
    },
  });
  t.after(() =>
    core
      .deleteNamespacedPod({ namespace: "kube-system", name: forged.metadata!.name!, gracePeriodSeconds: 0 })
      .then(() => undefined),
  );
  const fresh = new PeerAccess({
    core,
    auth: kc.makeApiClient(k8s.AuthenticationV1Api),
    serviceAccount: NODE_AGENT_USER,
    record: () => cache,
    log: createLogger("peer-access", "silent"),
  });
  assert.equal(await fresh.allows(short, peer(await token(other))), false, "a forged stamp in kube-system");
  // Over HTTPS: the token travels as a bearer; the refused node gets 403 before any byte of a tree.
  const ca = await createCA("warmstart node agents");
  const pem = await issueCert(ca, { commonName: "node agents", usage: "both", ips: ["127.0.0.1"] });
  const server = new PeerServer({
    storeDir: dir,
    tls: { ca: ca.cert, ...pem },
    authorize: (s, p) => fresh.allows(s, p),
  });
  const port = await server.listen(0, "127.0.0.1");
  t.after(() => server.close());
  const get = (bearer: string): Promise<number> =>
    new Promise((resolve, reject) => {
      https
        .get(
          {
            host: "127.0.0.1",
            port,
            path: `/v1/trees/${short}/manifest`,
            ca: ca.cert,
            ...pem,
            checkServerIdentity: () => undefined,
            agent: false,
            headers: { authorization: `Bearer ${bearer}` },
          },
          (res) => {
            res.resume();
            resolve(res.statusCode ?? 0);
          },
        )
        .on("error", reject);
    });
  assert.equal(await get(await token(other)), 403, "the other node is refused");
  // The leader's node passes authorization; this store holds no tree, so nothing is found.
  assert.equal(await get(await token(there)), 404, "the leader's node is let through");
  // A restore of this cache under another hash (restore-from) wears its own: its claim says.
  await core.createNamespacedPod({
    namespace: ns,
    body: {
      metadata: { name: "restore-from" },
      spec: {
        nodeName: other,
        containers: [{ name: "c", image: "busybox" }],
        volumes: [
          { name: "warmstart-ro", persistentVolumeClaim: { claimName: `rox-${short}`, readOnly: true } },
        ],
      },
    },
  });
  const later = new PeerAccess({
    core,
    auth: kc.makeApiClient(k8s.AuthenticationV1Api),
    serviceAccount: NODE_AGENT_USER,
    record: () => cache,
    log: createLogger("peer-access", "silent"),
  });
  assert.equal(
    await later.allows(short, peer(await token(other))),
    true,
    "a pod there mounts the cache's claim",
  );
});
