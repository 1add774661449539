/**
 * Admission through the real API server: one leader per cache hash, gated followers, restores
 * from a Ready cache, and a webhook that never blocks a deployment.
 */
import { test, before } from "node:test";
import assert from "node:assert/strict";
import { createServer as createTcpServer, type Socket } from "node:net";
import { request } from "node:https";
import * as k8s from "@kubernetes/client-node";
import {
  cleanupHash,
  gpuContainer,
  kube,
  listPods,
  localCluster,
  podCondition,
  tempNamespace,
  uniqueName,
  waitFor,
  createWorkers,
  impersonating,
} from "../harness.js";
import {
  ANN_CACHE_SIZE_LIMIT,
  ANN_CAPTURE_SIZE_LIMIT,
  ANN_ELECTION_ID,
  ANN_HASH,
  ANN_REASON,
  ANN_RESTORE_FROM,
  ANN_ROLE,
  ANN_TREE,
  ANN_RESTORE_RECORDED,
  LABEL_ADMISSION_ID,
  SKIP,
  LABEL_CAPTURE,
  LABEL_WAITING,
  FILL_VOLUME,
  LABEL_GATED,
  LABEL_HASH,
  ANN_CACHE_SOURCE,
  HOST_PATH_PROVISIONER,
  MODELCACHE,
  SCHEDULING_GATE,
  claimName,
  leaseName,
  shortHash,
} from "../../src/core/contract.js";
import { classifyPod } from "../../src/core/classify.js";
import { cacheHash } from "../../src/core/hash.js";
import { SYSTEM_NAMESPACE, isAlreadyExists, isNotFound } from "../../src/common/kube.js";
import { createHash } from "node:crypto";
import jsonpatch from "fast-json-patch";
import { registerWebhook, unregisterWebhook, webhookConfiguration } from "../../src/webhook/registration.js";
import { createCA } from "../../src/common/certs.js";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { parseAllDocuments } from "yaml";
import { pino } from "pino";
import { PACKAGE_ROOT } from "../../tools/localcluster/versions.js";
import { recordElection } from "../../src/webhook/election.js";
import { runWebhook } from "../../src/webhook/run.js";
import { loadWebhookConfig } from "../../src/webhook/config.js";
import { installPolicyCopy } from "../chart.js";
import { MANUAL_READY } from "../agents.js";
import { getModelCache, type ModelCacheObject } from "../../src/common/modelcache.js";
import { DEFAULT_CACHE_ENV_TEMPLATE } from "../../src/core/decorate.js";

// Keeps a leader un-Ready on its simulated node. Ready, its capture would start, fail (there is
// no cache folder there) and end the election within half a second; a pod of the same hash
// admitted after that rightly leads the next one, and a test that counts one election's leaders
// would see two.
const UNREADY = { [MANUAL_READY]: "true" };

let webhookUrl: string;
let pkiDir: string;

before(async () => {
  const st = await localCluster();
  if (!st?.roles.webhook) throw new Error("these tests need the webhook role of `warmstart cluster up`");
  webhookUrl = st.roles.webhook;
  pkiDir = join(st.stateDir, "pki");
});

/** The client certificate `cluster up` issued for the API server to present to webhooks. */
async function apiServerClientCert(): Promise<{ cert: string; key: string }> {
  return {
    cert: await readFile(join(pkiDir, "webhook-client.crt"), "utf8"),
    key: await readFile(join(pkiDir, "webhook-client.key"), "utf8"),
  };
}

const role = (p: k8s.V1Pod): string | undefined => p.metadata?.annotations?.[ANN_ROLE];

test("a chart's 4 GPU workers get 1 leader and 3 gated followers of one hash; its frontend is untouched", async (t) => {
  const ns = await tempNamespace(t, "chart");
  const { core } = await kube();
  const model = `meta-llama/Llama-3.1-8B-Instruct-${ns}`;
  await createWorkers(ns, {
    replicas: 4,
    args: ["--model", model, "--tensor-parallel-size", "1"],
    annotations: UNREADY,
  });
  await core.createNamespacedPod({
    namespace: ns,
    body: {
      metadata: { name: "frontend", labels: { app: "frontend" } },
      spec: { containers: [{ name: "router", image: "router:1", args: ["--model", model] }] },
    },
  });
  const pods = await waitFor("4 worker pods", async () => {
    const items = await listPods(ns, "app=worker");
    return items.length === 4 ? items : undefined;
  });
  const hashes = new Set(pods.map((p) => p.metadata?.annotations?.[ANN_HASH]));
  assert.equal(hashes.size, 1, "one hash for all workers");
  const hash = [...hashes][0]!;
  await cleanupHash(t, shortHash(hash));
  assert.match(hash, /^[0-9a-f]{64}$/);
  for (const p of pods) assert.equal(p.metadata?.labels?.[LABEL_HASH], shortHash(hash));

  const leaders = pods.filter((p) => role(p) === "leader");
  const followers = pods.filter((p) => role(p) === "follower");
  assert.equal(leaders.length, 1, "exactly one leader");
  assert.equal(followers.length, 3, "three followers");
  assert.equal(leaders[0]!.metadata?.labels?.[LABEL_CAPTURE], "true");
  for (const f of followers) {
    assert.equal(f.metadata?.labels?.[LABEL_GATED], "true");
    assert.deepEqual(
      f.spec?.schedulingGates?.map((g) => g.name),
      [SCHEDULING_GATE],
    );
  }
  await waitFor("followers SchedulingGated", async () => {
    const now = await listPods(ns, `${LABEL_GATED}=true`);
    return (
      now.length === 3 &&
      now.every((p) => {
        const c = podCondition(p, "PodScheduled");
        return c?.status === "False" && c.reason === "SchedulingGated" && !p.spec?.nodeName;
      })
    );
  });
  const { coordination } = await kube();
  const lease = await coordination.readNamespacedLease({
    name: leaseName(hash),
    namespace: SYSTEM_NAMESPACE,
  });
  assert.equal(lease.spec?.holderIdentity, leaders[0]!.metadata?.annotations?.["warmstart.dev/election-id"]);
  assert.equal(lease.metadata?.labels?.[LABEL_HASH], shortHash(hash));

  const frontend = await core.readNamespacedPod({ name: "frontend", namespace: ns });
  assert.equal(role(frontend), undefined, "the frontend is left alone");
  assert.equal(frontend.metadata?.annotations?.[ANN_HASH], undefined);

  // The decision is explained on the pod as an Event.
  await waitFor("an Event on the leader", async () => {
    const evs = await core.listNamespacedEvent({
      namespace: ns,
      fieldSelector: `involvedObject.name=${leaders[0]!.metadata!.name!}`,
    });
    return evs.items.find((e) => e.reason === "WarmstartLeader");
  });
});

test("a Dynamo-style prefill and decode worker pair shares one election", async (t) => {
  const ns = await tempNamespace(t, "dynamo");
  const { core } = await kube();
  const model = `Qwen/Qwen3-0.6B-${ns}`;
  const worker = (name: string, extra: string[], index: string): k8s.V1Pod => ({
    metadata: { name, annotations: UNREADY },
    spec: {
      containers: [
        {
          ...gpuContainer("main", ["-m", "dynamo.vllm", "--model", model, ...extra]),
          command: ["python3"],
          env: [
            { name: "DYN_NAMESPACE", value: ns },
            { name: "GROVE_PCSG_INDEX", value: index },
            { name: "ETCD_ENDPOINTS", value: "http://etcd:2379" },
          ],
        },
      ],
    },
  });
  await core.createNamespacedPod({ namespace: ns, body: worker("prefill", ["--is-prefill-worker"], "0") });
  await core.createNamespacedPod({
    namespace: ns,
    body: worker("decode", ["--kv-transfer-config", '{"kv_connector":"NixlConnector"}'], "1"),
  });
  const prefill = await core.readNamespacedPod({ name: "prefill", namespace: ns });
  const decode = await core.readNamespacedPod({ name: "decode", namespace: ns });
  const hash = prefill.metadata?.annotations?.[ANN_HASH];
  assert.ok(hash);
  await cleanupHash(t, shortHash(hash));
  assert.equal(decode.metadata?.annotations?.[ANN_HASH], hash, "prefill and decode hash equal");
  assert.deepEqual([role(prefill), role(decode)].sort(), ["follower", "leader"]);
});

test("20 concurrent pods of one hash elect exactly one leader (20 trials)", async (t) => {
  const ns = await tempNamespace(t, "race");
  const { core } = await kube();
  for (let trial = 0; trial < 20; trial++) {
    const model = `org/model-${ns}-${trial}`;
    const created = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        core.createNamespacedPod({
          namespace: ns,
          body: {
            metadata: { name: `t${trial}-p${i}`, annotations: UNREADY },
            spec: { containers: [gpuContainer("vllm", ["--model", model])] },
          },
        }),
      ),
    );
    const roles = created.map(role);
    const hashes = new Set(created.map((p) => p.metadata?.annotations?.[ANN_HASH]));
    assert.equal(hashes.size, 1);
    await cleanupHash(t, shortHash([...hashes][0]!));
    assert.equal(
      roles.filter((r) => r === "leader").length,
      1,
      `trial ${trial}: one leader, got ${roles.join(",")}`,
    );
    assert.equal(roles.filter((r) => r === "follower").length, 19, `trial ${trial}: 19 followers`);
  }
});

test("generateName pods (no name, no UID at admission) are elected and stamped", async (t) => {
  const ns = await tempNamespace(t, "gen");
  const { core } = await kube();
  const model = `org/generated-${ns}`;
  const pods = await Promise.all(
    [0, 1, 2].map(() =>
      core.createNamespacedPod({
        namespace: ns,
        body: {
          metadata: { generateName: "worker-", annotations: UNREADY },
          spec: { containers: [gpuContainer("vllm", ["--model", model])] },
        },
      }),
    ),
  );
  await cleanupHash(t, pods[0]!.metadata!.labels![LABEL_HASH]!);
  assert.deepEqual(pods.map(role).sort(), ["follower", "follower", "leader"]);
  const leader = pods.find((p) => role(p) === "leader")!;
  assert.ok(leader.metadata?.annotations?.["warmstart.dev/election-id"]);
  assert.match(leader.metadata.name!, /^worker-/);
});

test("a namespace with a compute quota admits a follower: its init containers carry requests", async (t) => {
  const ns = await tempNamespace(t, "quota");
  const { core } = await kube();
  await core.createNamespacedResourceQuota({
    namespace: ns,
    body: {
      metadata: { name: "compute" },
      spec: { hard: { "requests.cpu": "8", "requests.memory": "16Gi" } },
    },
  });
  // The quota's admission refuses containers without requests until the quota is observed.
  await waitFor("the quota in force", async () => {
    const q = await core.readNamespacedResourceQuota({ namespace: ns, name: "compute" });
    return q.status?.hard?.["requests.cpu"] !== undefined;
  });
  const model = `org/quota-${ns}`;
  const worker = (name: string): k8s.V1Pod => {
    const c = gpuContainer("vllm", ["--model", model]);
    c.resources = { ...c.resources, requests: { cpu: "1", memory: "1Gi" } };
    return { metadata: { name, annotations: UNREADY }, spec: { containers: [c] } };
  };
  const leader = await core.createNamespacedPod({ namespace: ns, body: worker("a") });
  await cleanupHash(t, leader.metadata!.labels![LABEL_HASH]!);
  assert.equal(role(leader), "leader");
  const follower = await core.createNamespacedPod({ namespace: ns, body: worker("b") });
  assert.equal(role(follower), "follower");
  for (const c of follower.spec!.initContainers!) assert.ok(c.resources?.requests?.cpu, c.name);
});

test("a Ready ModelCache makes new pods of its hash restore, in any namespace; restore-from skips the election", async (t) => {
  const nsA = await tempNamespace(t, "restore-a");
  const nsB = await tempNamespace(t, "restore-b");
  const { core, custom, coordination } = await kube();
  const podSpec = (model: string, annotations?: Record<string, string>): k8s.V1Pod => ({
    metadata: { generateName: "w-", annotations },
    spec: { containers: [gpuContainer("vllm", ["--model", model])] },
  });
  const model = `org/cached-${nsA}`;
  const { hash } = cacheHash(podSpec(model), classifyPod(podSpec(model)));
  const short = shortHash(hash);
  await cleanupHash(t, short);
  const ref = { group: MODELCACHE.group, version: MODELCACHE.version, plural: MODELCACHE.plural };
  await custom.createClusterCustomObject({
    ...ref,
    body: {
      apiVersion: "warmstart.dev/v1alpha1",
      kind: "ModelCache",
      // Where promote put the tree: a later restore in a new namespace gets its claim from this.
      metadata: {
        name: short,
        annotations: {
          [ANN_CACHE_SOURCE]: JSON.stringify({
            backend: "host-path",
            provisioner: HOST_PATH_PROVISIONER,
            sizeBytes: 1024,
            node: "gpu-0",
            path: `/var/lib/warmstart/store/${short}`,
            hostPathType: "hostPath",
          }),
        },
      },
      spec: { hash, model },
    },
  });
  await custom.patchClusterCustomObjectStatus(
    { ...ref, name: short, body: { status: { phase: "Ready", backend: "host-path" } } },
    k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
  );

  for (const ns of [nsA, nsB]) {
    const pod = await core.createNamespacedPod({ namespace: ns, body: podSpec(model) });
    assert.equal(role(pod), "restore", `restore in ${ns}`);
    assert.equal(pod.spec?.schedulingGates, undefined, "a restore is not gated");
    const claims = (pod.spec?.volumes ?? []).map((v) => v.persistentVolumeClaim?.claimName).filter(Boolean);
    assert.deepEqual(claims, [claimName(hash)]);
    // The claim exists once the pod does: a restore in a new namespace gets it at admission.
    await core.readNamespacedPersistentVolumeClaim({ name: claimName(hash), namespace: ns });
    const inits = (pod.spec?.initContainers ?? []).map((c) => c.name);
    assert.ok(inits.includes("warmstart-seed-cache") && inits.includes("warmstart-prewarm"), inits.join(","));
    assert.ok(inits.indexOf("warmstart-seed-cache") < inits.indexOf("warmstart-prewarm"));
  }

  // A different model, pointed at the Ready cache: restores from it, and no election happens for its own hash.
  const other = `org/other-${nsA}`;
  const restored = await core.createNamespacedPod({
    namespace: nsB,
    body: podSpec(other, { [ANN_RESTORE_FROM]: short }),
  });
  assert.equal(role(restored), "restore");
  const ownHash = restored.metadata!.annotations![ANN_HASH]!;
  assert.notEqual(ownHash, hash);
  await cleanupHash(t, shortHash(ownHash));
  assert.deepEqual(
    (restored.spec?.volumes ?? []).map((v) => v.persistentVolumeClaim?.claimName).filter(Boolean),
    [claimName(hash)],
  );
  await assert.rejects(
    coordination.readNamespacedLease({ name: leaseName(ownHash), namespace: SYSTEM_NAMESPACE }),
    (err: unknown) => isNotFound(err),
    "no Lease for a restore-from pod",
  );
  // restore-from a cache that is not Ready: admitted cold.
  const cold = await core.createNamespacedPod({
    namespace: nsB,
    body: podSpec(`org/third-${nsA}`, { [ANN_RESTORE_FROM]: "0123456789abcdef" }),
  });
  assert.equal(role(cold), "cold");
  await cleanupHash(t, shortHash(cold.metadata!.annotations![ANN_HASH]!));
});

test("a hung webhook does not block pods: they are admitted unchanged within the timeout", async (t) => {
  // Our own configuration, pointed at a server that accepts connections and never answers.
  const ns = await tempNamespace(t, "dead", { "warmstart.dev/skip": "true" });
  const { core, admission } = await kube();
  const sockets = new Set<Socket>();
  const hung = createTcpServer((s) => {
    sockets.add(s);
    s.on("error", () => undefined);
  });
  await new Promise<void>((r) => hung.listen(0, "127.0.0.1", r));
  t.after(() => {
    for (const s of sockets) s.destroy();
    hung.close();
  });
  const port = (hung.address() as { port: number }).port;
  const name = uniqueName("warmstart-dead");
  const cfg = webhookConfiguration({
    name,
    url: `https://127.0.0.1:${port}`,
    caBundle: (await createCA("unused")).cert,
    timeoutSeconds: 2,
  });
  // Only this test's namespace is sent to the dead webhook.
  cfg.webhooks![0]!.namespaceSelector = { matchLabels: { "kubernetes.io/metadata.name": ns } };
  await registerWebhook(admission, cfg);
  t.after(() => unregisterWebhook(admission, name));
  await waitFor("the dead webhook to be in the admission chain", () => sockets.size > 0 || probe(), 20_000);
  async function probe(): Promise<boolean> {
    await core.createNamespacedPod({
      namespace: ns,
      dryRun: "All",
      body: {
        metadata: { generateName: "probe-" },
        spec: { containers: [gpuContainer("vllm", ["--model", "x"])] },
      },
    });
    return sockets.size > 0;
  }
  const started = Date.now();
  const pod = await core.createNamespacedPod({
    namespace: ns,
    body: {
      metadata: { name: "admitted" },
      spec: { containers: [gpuContainer("vllm", ["--model", "org/m"])] },
    },
  });
  const elapsed = Date.now() - started;
  assert.equal(role(pod), undefined, "admitted unchanged");
  assert.ok(elapsed < 4000, `admitted within the 2 s timeout (+ slack), took ${elapsed} ms`);
});

test("a malformed AdmissionReview gets a clear 400 and the webhook keeps serving", async () => {
  // Posted as the API server would: with its webhook client certificate.
  const client = await apiServerClientCert();
  const post = (body: string, contentType = "application/json"): Promise<{ status: number; body: string }> =>
    new Promise((resolve, reject) => {
      const req = request(
        `${webhookUrl}/mutate`,
        { method: "POST", rejectUnauthorized: false, headers: { "content-type": contentType }, ...client },
        (res) => {
          let text = "";
          res.on("data", (d: Buffer) => (text += d.toString()));
          res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text }));
        },
      );
      req.on("error", reject);
      req.end(body);
    });
  const broken = await post("{not json");
  assert.equal(broken.status, 400);
  assert.match(broken.body, /not JSON/);
  const wrongShape = await post(
    JSON.stringify({ apiVersion: "admission.k8s.io/v1", kind: "AdmissionReview" }),
  );
  assert.equal(wrongShape.status, 400);
  assert.match(wrongShape.body, /request/);
  const wrongType = await post("{}", "text/plain");
  assert.equal(wrongType.status, 415);
  const huge = await post(JSON.stringify({ pad: "x".repeat(4 * 1024 * 1024) }));
  assert.equal(huge.status, 413);

  // Still serving: a well-formed review of a non-GPU pod is admitted with its uid.
  const ok = await post(
    JSON.stringify({
      apiVersion: "admission.k8s.io/v1",
      kind: "AdmissionReview",
      request: {
        uid: "abc-123",
        operation: "CREATE",
        namespace: "default",
        resource: { group: "", version: "v1", resource: "pods" },
        object: { metadata: { name: "x" }, spec: { containers: [{ name: "c", image: "nginx" }] } },
      },
    }),
  );
  assert.equal(ok.status, 200);
  const review = JSON.parse(ok.body) as { response: { uid: string; allowed: boolean; patch?: string } };
  assert.deepEqual(review.response, { uid: "abc-123", allowed: true });
});

// --- trust: stamps, client certificates, scopes, the record -----------------------------------

const FORGED_LABELS: Record<string, string> = {
  app: "mine",
  "warmstart.dev/capture": "true",
  "warmstart.dev/hash": "0123456789abcdef",
  "warmstart.dev/gated": "true",
};
const FORGED_ANNOTATIONS: Record<string, string> = {
  "warmstart.dev/hash": "01".repeat(32),
  "warmstart.dev/role": "leader",
  "warmstart.dev/election-id": "copied-from-the-holder",
  "warmstart.dev/tree": "../../../etc",
  "warmstart.dev/injected-env": "HF_ENDPOINT",
};
const ours = (m: Record<string, string> | undefined): Record<string, string> =>
  Object.fromEntries(Object.entries(m ?? {}).filter(([k]) => k.startsWith("warmstart.dev/")));

function assertNoForgery(p: k8s.V1Pod, what: string): void {
  const labels = ours(p.metadata?.labels);
  const annotations = ours(p.metadata?.annotations);
  assert.notEqual(labels["warmstart.dev/hash"], "0123456789abcdef", `${what}: forged short hash`);
  assert.notEqual(annotations["warmstart.dev/hash"], "01".repeat(32), `${what}: forged hash`);
  assert.notEqual(
    annotations["warmstart.dev/election-id"],
    "copied-from-the-holder",
    `${what}: forged election id`,
  );
  assert.equal(annotations["warmstart.dev/tree"], undefined, `${what}: forged tree`);
  assert.equal(annotations["warmstart.dev/injected-env"], undefined, `${what}: forged injected env`);
  if (role(p) !== "leader") assert.equal(labels[LABEL_CAPTURE], undefined, `${what}: forged capture label`);
  if (role(p) !== "follower") assert.equal(labels[LABEL_GATED], undefined, `${what}: forged gated label`);
  assert.equal(p.metadata?.labels?.app, "mine", `${what}: the author's own label stays`);
}

test("a pod that forges Warmstart's stamps gets none of them, whatever the webhook decides", async (t) => {
  const ns = await tempNamespace(t, "forge");
  const skipNs = await tempNamespace(t, "forge-skip", { "warmstart.dev/skip": "true" });
  const { core } = await kube();
  const forged = (
    name: string,
    containers: k8s.V1Container[],
    annotations: Record<string, string> = {},
  ): k8s.V1Pod => ({
    metadata: { name, labels: { ...FORGED_LABELS }, annotations: { ...FORGED_ANNOTATIONS, ...annotations } },
    spec: { containers },
  });
  const model = `org/forged-${ns}`;
  const cases: [string, string, k8s.V1Pod][] = [
    ["a frontend", ns, forged("web", [{ name: "web", image: "nginx" }])],
    ["a GPU pod naming no model", ns, forged("cuda", [gpuContainer("c", ["--port", "1"])])],
    ["an opted-out pod", ns, forged("skipped", [gpuContainer("c", ["--model", model])], { [SKIP]: "true" })],
    [
      "a pod of an opted-out namespace",
      skipNs,
      forged("in-skip-ns", [gpuContainer("c", ["--model", model])]),
    ],
    [
      "a pod of the system namespace",
      SYSTEM_NAMESPACE,
      forged(uniqueName("sys"), [{ name: "c", image: "x" }]),
    ],
    [
      "a downloader",
      ns,
      forged("leader", [gpuContainer("c", ["--model", model])], {
        [ANN_CACHE_SIZE_LIMIT]: "500Gi",
        ...UNREADY,
      }),
    ],
    ["its replica", ns, forged("follower", [gpuContainer("c", ["--model", model])])],
  ];
  for (const [what, namespace, body] of cases) {
    const p = await core.createNamespacedPod({ namespace, body });
    if (namespace === SYSTEM_NAMESPACE)
      t.after(() =>
        core.deleteNamespacedPod({ name: body.metadata!.name!, namespace }).then(() => undefined),
      );
    assertNoForgery(p, what);
  }
  const leader = await core.readNamespacedPod({ name: "leader", namespace: ns });
  const hash = leader.metadata!.annotations![ANN_HASH]!;
  await cleanupHash(t, shortHash(hash));
  assert.equal(role(leader), "leader");
  // The capture label it wears is the webhook's, with the election id the Lease holds.
  const { coordination } = await kube();
  const lease = await coordination.readNamespacedLease({
    name: leaseName(hash),
    namespace: SYSTEM_NAMESPACE,
  });
  assert.equal(leader.metadata?.annotations?.[ANN_ELECTION_ID], lease.spec?.holderIdentity);
  // Its own size limit is kept (a user annotation) and used, and the limit is stamped.
  assert.equal(leader.metadata?.annotations?.[ANN_CACHE_SIZE_LIMIT], "500Gi");
  assert.equal(leader.metadata?.annotations?.[ANN_CAPTURE_SIZE_LIMIT], "500Gi");
  assert.equal(leader.spec?.volumes?.find((v) => v.name === "warmstart-cache")?.emptyDir?.sizeLimit, "500Gi");
  assert.equal(role(await core.readNamespacedPod({ name: "follower", namespace: ns })), "follower");
});

test("a pod admitted on fail-open loses its forged stamps and gets a Warning Event saying why", async (t) => {
  const ns = await tempNamespace(t, "failopen");
  const { core, custom } = await kube();
  // A Ready record that says nowhere where its tree is: a restore in a new namespace cannot get
  // its claim, so admission fails and the pod is admitted without a decision.
  const podSpec = (name: string): k8s.V1Pod => ({
    metadata: { name, labels: { ...FORGED_LABELS }, annotations: { ...FORGED_ANNOTATIONS } },
    spec: { containers: [gpuContainer("vllm", ["--model", `org/orphan-${ns}`])] },
  });
  const { hash } = cacheHash(podSpec("x"), classifyPod(podSpec("x")));
  const short = shortHash(hash);
  await cleanupHash(t, short);
  const ref = { group: MODELCACHE.group, version: MODELCACHE.version, plural: MODELCACHE.plural };
  await custom.createClusterCustomObject({
    ...ref,
    body: {
      apiVersion: "warmstart.dev/v1alpha1",
      kind: "ModelCache",
      metadata: { name: short },
      spec: { hash },
    },
  });
  await custom.patchClusterCustomObjectStatus(
    { ...ref, name: short, body: { status: { phase: "Ready" } } },
    k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
  );
  const pod = await core.createNamespacedPod({ namespace: ns, body: podSpec("failed-open") });
  assert.equal(role(pod), undefined, "admitted without a decision");
  assertNoForgery(pod, "a fail-open pod");
  assert.deepEqual(Object.keys(ours(pod.metadata?.labels)), [LABEL_ADMISSION_ID]);
  assert.deepEqual(ours(pod.metadata?.annotations), {});
  const ev = await waitFor("the fail-open Event", async () => {
    const evs = await core.listNamespacedEvent({
      namespace: ns,
      fieldSelector: "involvedObject.name=failed-open",
    });
    return evs.items.find((e) => e.reason === "WarmstartFailOpen");
  });
  assert.equal(ev.type, "Warning");
  assert.match(ev.message ?? "", /records no promoted source/);
});

test("GPU pods left alone get an Event saying why", async (t) => {
  const ns = await tempNamespace(t, "alone");
  const { core } = await kube();
  await core.createNamespacedPod({
    namespace: ns,
    body: { metadata: { generateName: "cuda-" }, spec: { containers: [gpuContainer("c", ["--port", "1"])] } },
  });
  await core.createNamespacedPod({
    namespace: ns,
    body: {
      metadata: { name: "skipped", annotations: { [SKIP]: "true" } },
      spec: { containers: [gpuContainer("c", ["--model", "org/m"])] },
    },
  });
  const events = await waitFor("two WarmstartLeftAlone Events", async () => {
    const evs = (await core.listNamespacedEvent({ namespace: ns })).items.filter(
      (e) => e.reason === "WarmstartLeftAlone",
    );
    return evs.length === 2 ? evs : undefined;
  });
  assert.deepEqual(events.map((e) => e.message).sort(), [
    "left alone: GPU container names no model",
    "left alone: opted out (warmstart.dev/skip annotation)",
  ]);
  assert.ok(
    events.some((e) => e.involvedObject.name?.startsWith("cuda-")),
    "a generateName pod is found too",
  );
});

test("the webhook answers only the API server: a direct review creates no Lease and no record", async (t) => {
  const model = `org/direct-${uniqueName("m")}`;
  const body = (uid: string): string =>
    JSON.stringify({
      apiVersion: "admission.k8s.io/v1",
      kind: "AdmissionReview",
      request: {
        uid,
        operation: "CREATE",
        namespace: "default",
        resource: { group: "", version: "v1", resource: "pods" },
        object: {
          metadata: { name: "direct" },
          spec: { containers: [gpuContainer("vllm", ["--model", model])] },
        },
      },
    });
  const post = (client?: { cert: string; key: string }): Promise<number> =>
    new Promise((resolve, reject) => {
      const req = request(
        `${webhookUrl}/mutate`,
        {
          method: "POST",
          rejectUnauthorized: false,
          headers: { "content-type": "application/json" },
          ...client,
        },
        (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
        },
      );
      req.on("error", reject);
      req.end(body("direct-1"));
    });
  const probe: k8s.V1Pod = {
    metadata: { name: "direct" },
    spec: { containers: [gpuContainer("vllm", ["--model", model])] },
  };
  const { hash } = cacheHash(probe, classifyPod(probe));
  await cleanupHash(t, shortHash(hash));

  assert.equal(await post(), 401, "no client certificate");
  // The cluster CA signed it, but for someone else (the admin): not the API server.
  const admin = {
    cert: await readFile(join(pkiDir, "admin.crt"), "utf8"),
    key: await readFile(join(pkiDir, "admin.key"), "utf8"),
  };
  assert.equal(await post(admin), 403, "a certificate that is not the API server's");
  const ca = await createCA("elsewhere");
  const { issueCert } = await import("../../src/common/certs.js");
  const forgedName = await issueCert(ca, {
    commonName: "warmstart-apiserver-webhook-client",
    usage: "client",
  });
  assert.equal(await post(forgedName), 403, "the right name from another CA");

  const { coordination, custom, admission } = await kube();
  await assert.rejects(
    coordination.readNamespacedLease({ name: leaseName(hash), namespace: SYSTEM_NAMESPACE }),
    (err: unknown) => isNotFound(err),
    "no Lease",
  );
  assert.equal(await getModelCache(custom, hash), undefined, "no ModelCache");

  // Through the API server, a dry run is admitted and leaves nothing behind either.
  const { core } = await kube();
  const dry = await core.createNamespacedPod({ namespace: "default", dryRun: "All", body: probe });
  assert.equal(role(dry), "cold");
  await assert.rejects(
    coordination.readNamespacedLease({ name: leaseName(hash), namespace: SYSTEM_NAMESPACE }),
    (err: unknown) => isNotFound(err),
  );
  assert.equal(await getModelCache(custom, hash), undefined);
  const registered = await admission.readMutatingWebhookConfiguration({ name: "warmstart" });
  assert.equal(registered.webhooks?.[0]?.sideEffects, "NoneOnDryRun");
});

/** Lets these subjects get and patch pods (and their status) in a namespace: RBAC never refuses them there. */
async function allowPodEdits(
  kc: k8s.KubeConfig,
  namespace: string,
  subjects: k8s.RbacV1Subject[],
): Promise<void> {
  const rbac = kc.makeApiClient(k8s.RbacAuthorizationV1Api);
  await rbac.createNamespacedRole({
    namespace,
    body: {
      metadata: { name: "pod-editor" },
      rules: [
        {
          apiGroups: [""],
          resources: ["pods", "pods/status", "pods/ephemeralcontainers"],
          verbs: ["get", "patch", "update"],
        },
      ],
    },
  });
  await rbac.createNamespacedRoleBinding({
    namespace,
    body: {
      metadata: { name: "pod-editor" },
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: "pod-editor" },
      subjects,
    },
  });
}

test("the stamps policy refuses a later change of a stamp by anyone but Warmstart's service accounts", async (t) => {
  const ns = await tempNamespace(t, "vap");
  const { kc, core, admission } = await kube();
  const docs = parseAllDocuments(
    await readFile(join(PACKAGE_ROOT, "deploy/policies/stamps.yaml"), "utf8"),
  ).map((d) => d.toJS() as k8s.KubernetesObject);
  const policy = docs.find((d) => d.kind === "ValidatingAdmissionPolicy") as k8s.V1ValidatingAdmissionPolicy;
  const shipped = docs.find(
    (d) => d.kind === "ValidatingAdmissionPolicyBinding",
  ) as k8s.V1ValidatingAdmissionPolicyBinding;
  try {
    await admission.createValidatingAdmissionPolicy({ body: policy });
  } catch (err) {
    if (!isAlreadyExists(err)) throw err;
    const current = await admission.readValidatingAdmissionPolicy({ name: policy.metadata!.name! });
    await admission.replaceValidatingAdmissionPolicy({
      name: policy.metadata!.name!,
      body: {
        ...policy,
        metadata: { ...policy.metadata, resourceVersion: current.metadata?.resourceVersion },
      },
    });
  }
  // The shipped binding, confined to this test's namespace: the local cluster's roles run as
  // the admin, not as service accounts, and other tests share the cluster.
  const bindingName = `warmstart-stamps-${ns}`;
  await admission.createValidatingAdmissionPolicyBinding({
    body: {
      ...shipped,
      metadata: { name: bindingName },
      spec: {
        ...shipped.spec,
        matchResources: { namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": ns } } },
      },
    },
  });
  t.after(() =>
    admission.deleteValidatingAdmissionPolicyBinding({ name: bindingName }).then(() => undefined),
  );

  // Both identities may patch pods here: what refuses the first is the policy, not RBAC.
  const mallory = "mallory";
  const warmstartSa = `system:serviceaccount:${SYSTEM_NAMESPACE}:warmstart-server`;
  await allowPodEdits(kc, ns, [
    { kind: "User", name: mallory, apiGroup: "rbac.authorization.k8s.io" },
    { kind: "ServiceAccount", name: "warmstart-server", namespace: SYSTEM_NAMESPACE },
  ]);
  const as = (user: string): k8s.CoreV1Api => impersonating(kc, user);
  const strategic = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
  const patch = (api: k8s.CoreV1Api, body: object, dryRun?: string): Promise<k8s.V1Pod> =>
    api.patchNamespacedPod({ name: "target", namespace: ns, body, ...(dryRun ? { dryRun } : {}) }, strategic);

  // A GPU pod left alone: it carries the webhook's admission-id label.
  await core.createNamespacedPod({
    namespace: ns,
    body: { metadata: { name: "target" }, spec: { containers: [gpuContainer("c", ["--port", "1"])] } },
  });
  const capture = { metadata: { labels: { [LABEL_CAPTURE]: "true" } } };
  // The policy reaches the admission chain a moment after it is created: probe with dry runs.
  const refusal = await waitFor("the policy to refuse", async () => {
    try {
      await patch(as(mallory), capture, "All");
      return undefined;
    } catch (err) {
      return (err as { body?: string }).body ?? String(err);
    }
  });
  assert.match(refusal, /warmstart\.dev\/\* labels are written by Warmstart only/);
  await assert.rejects(patch(as(mallory), capture), /written by Warmstart only/, "capture=true refused");
  await assert.rejects(
    as(mallory).patchNamespacedPodStatus({ name: "target", namespace: ns, body: capture }, strategic),
    /written by Warmstart only/,
    "through the status subresource too",
  );
  await assert.rejects(
    patch(as(mallory), { metadata: { annotations: { [ANN_TREE]: "../../etc" } } }),
    /written by Warmstart only/,
  );
  await assert.rejects(
    patch(as(mallory), { metadata: { labels: { [LABEL_ADMISSION_ID]: null } } }),
    /written by Warmstart only/,
    "removing a stamp is a change too",
  );
  // Not the policy's business: the author's own labels and user annotations.
  await patch(as(mallory), {
    metadata: { labels: { team: "a" }, annotations: { [ANN_RESTORE_FROM]: "0".repeat(16) } },
  });
  const after = await core.readNamespacedPod({ name: "target", namespace: ns });
  assert.equal(after.metadata?.labels?.[LABEL_CAPTURE], undefined);
  assert.equal(after.metadata?.labels?.team, "a");
  // Warmstart's own service account may.
  await patch(as(warmstartSa), capture);
  assert.equal(
    (await core.readNamespacedPod({ name: "target", namespace: ns })).metadata?.labels?.[LABEL_CAPTURE],
    "true",
  );

  // Attacker: a debug container added later that mounts a waiting follower's fill volume
  // writable, to swap what the node agent writes there as root.
  await core.createNamespacedPod({
    namespace: ns,
    body: {
      metadata: { name: "filled" },
      spec: {
        containers: [gpuContainer("c", ["--port", "1"])],
        volumes: [{ name: FILL_VOLUME, emptyDir: {} }],
      },
    },
  });
  const debug = (readOnly: boolean): Promise<k8s.V1Pod> =>
    as(mallory).patchNamespacedPodEphemeralcontainers(
      {
        name: "filled",
        namespace: ns,
        body: {
          spec: {
            ephemeralContainers: [
              {
                name: readOnly ? "look" : "swap",
                image: "busybox",
                volumeMounts: [{ name: FILL_VOLUME, mountPath: "/fill", readOnly }],
              },
            ],
          },
        },
      },
      k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.StrategicMergePatch),
    );
  await assert.rejects(debug(false), /warmstart-fill volume is mounted read-only/);
  await debug(true);
});

test("the release controller's pod patches are held to what it does: release a follower, mark a restore, nothing else", async (t) => {
  const ns = await tempNamespace(t, "server-vap");
  const { kc, core, admission } = await kube();
  // This test's copy, bound to its namespace only (other tests share the cluster).
  await installPolicyCopy(t, admission, {
    suffix: "-server-pod-patches",
    name: `server-pod-patches-${ns}`,
    namespace: SYSTEM_NAMESPACE,
    matchResources: { namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": ns } } },
  });
  const server = `system:serviceaccount:${SYSTEM_NAMESPACE}:warmstart-server`;
  await allowPodEdits(kc, ns, [
    { kind: "ServiceAccount", name: "warmstart-server", namespace: SYSTEM_NAMESPACE },
  ]);
  const asServer = impersonating(kc, server);
  const json = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch);
  const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
  // A real follower (gated by the webhook), behind a leader that is never scheduled.
  const worker = (name: string, extra: Partial<k8s.V1PodSpec>): k8s.V1Pod => ({
    metadata: { name },
    spec: { containers: [gpuContainer("vllm", ["--model", `org/server-vap-${ns}`])], ...extra },
  });
  const leader = await core.createNamespacedPod({
    namespace: ns,
    body: worker("leader", { nodeSelector: { "kubernetes.io/hostname": "nowhere" } }),
  });
  await cleanupHash(t, leader.metadata!.labels![LABEL_HASH]!);
  const pod = await core.createNamespacedPod({
    namespace: ns,
    body: worker("follower", { schedulingGates: [{ name: "other/hold" }] }),
  });
  assert.equal(role(pod), "follower");
  const gateIndex = pod.spec!.schedulingGates!.findIndex((g) => g.name === SCHEDULING_GATE);
  assert.ok(gateIndex >= 0, "the test pod carries the cache-ready gate");
  // The policy reaches the admission chain a moment after it is created: probe with dry runs.
  await waitFor("the policy to refuse an image change", async () => {
    try {
      await asServer.patchNamespacedPod(
        {
          namespace: ns,
          name: "follower",
          dryRun: "All",
          body: [{ op: "replace", path: "/spec/containers/0/image", value: "evil:1" }],
        },
        json,
      );
      return false;
    } catch (err) {
      return /changes no image/.test((err as { body?: string }).body ?? String(err));
    }
  });
  // What the release controller does: allowed.
  await asServer.patchNamespacedPod(
    {
      namespace: ns,
      name: "follower",
      body: [
        { op: "remove", path: `/spec/schedulingGates/${gateIndex}` },
        { op: "add", path: `/metadata/annotations/${ANN_TREE.replace("/", "~1")}`, value: "tree" },
        { op: "remove", path: `/metadata/labels/${LABEL_GATED.replace("/", "~1")}` },
      ],
    },
    json,
  );
  await asServer.patchNamespacedPod(
    {
      namespace: ns,
      name: "follower",
      body: { metadata: { annotations: { [ANN_RESTORE_RECORDED]: "true" } } },
    },
    merge,
  );
  // Anything else: refused.
  const refused: Array<[string, object, RegExp]> = [
    [
      "a capture label",
      { metadata: { labels: { [LABEL_CAPTURE]: "true" } } },
      /only removes the warmstart.dev\/gated/,
    ],
    [
      "another annotation",
      { metadata: { annotations: { [ANN_RESTORE_FROM]: "0".repeat(16) } } },
      /only writes/,
    ],
    ["an owner", { metadata: { finalizers: ["x/y"] } }, /changes no image/],
    [
      "another gate removed",
      { spec: { schedulingGates: [] } },
      /only removes the warmstart.dev\/cache-ready/,
    ],
  ];
  for (const [what, body, why] of refused)
    await assert.rejects(
      asServer.patchNamespacedPod({ namespace: ns, name: "follower", body }, merge),
      why,
      what,
    );
  await assert.rejects(
    asServer.patchNamespacedPod(
      {
        namespace: ns,
        name: "follower",
        body: [{ op: "add", path: "/spec/tolerations/-", value: { operator: "Exists" } }],
      },
      json,
    ),
    /changes no image, toleration/,
    "a toleration (pods allow adding one)",
  );
  await assert.rejects(
    asServer.patchNamespacedPodStatus(
      { namespace: ns, name: "follower", body: { metadata: { labels: { a: "b" } } } },
      merge,
    ),
    /never writes a pod's status/,
  );
  const after = await core.readNamespacedPod({ namespace: ns, name: "follower" });
  assert.deepEqual(
    after.spec?.schedulingGates?.map((g) => g.name),
    ["other/hold"],
  );
  assert.equal(after.spec?.containers[0]?.image, "vllm/vllm-openai:v0.6.3");
  assert.equal(after.metadata?.labels?.[LABEL_GATED], undefined, "released");

  // A follower that waits running (another scheduler may place it with others): once its wait
  // ended cold, its decision says so. Only then, and only that.
  const waiting = await core.createNamespacedPod({
    namespace: ns,
    body: worker("waiting", { schedulerName: "elsewhere" }),
  });
  assert.equal(waiting.metadata?.labels?.[LABEL_WAITING], "true");
  const esc = (k: string): string => k.replace("/", "~1");
  const decide = (value: string): object[] => [
    { op: "replace", path: `/metadata/annotations/${esc(ANN_ROLE)}`, value },
    { op: "add", path: `/metadata/annotations/${esc(ANN_REASON)}`, value: "waited 1200s, then started cold" },
  ];
  await assert.rejects(
    asServer.patchNamespacedPod({ namespace: ns, name: "follower", body: decide("cold") }, json),
    /only writes/,
    "a gated follower's decision is not rewritten",
  );
  await assert.rejects(
    asServer.patchNamespacedPod({ namespace: ns, name: "waiting", body: decide("leader") }, json),
    /only writes/,
    "a waiting follower never becomes a leader",
  );
  await asServer.patchNamespacedPod({ namespace: ns, name: "waiting", body: decide("cold") }, json);
  await assert.rejects(
    asServer.patchNamespacedPod({ namespace: ns, name: "waiting", body: decide("restore") }, json),
    /only writes/,
    "settled once",
  );
});

test("resetting a failed record for a new election never overwrites a Ready written meanwhile", async (t) => {
  const { custom } = await kube();
  const hash = createHash("sha256").update(uniqueName("reset")).digest("hex");
  const short = shortHash(hash);
  await cleanupHash(t, short);
  const ref = { group: MODELCACHE.group, version: MODELCACHE.version, plural: MODELCACHE.plural };
  const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
  // A failed capture left the record Failed.
  await custom.createClusterCustomObject({
    ...ref,
    body: {
      apiVersion: "warmstart.dev/v1alpha1",
      kind: "ModelCache",
      metadata: { name: short },
      spec: { hash, electionId: "old" },
    },
  });
  await custom.patchClusterCustomObjectStatus(
    {
      ...ref,
      name: short,
      body: { status: { phase: "Failed", reason: "CaptureFailed", failedCaptures: 1 } },
    },
    merge,
  );
  // Between the webhook's read and its reset, the old election's promote publishes Ready.
  let injected = 0;
  const result = await recordElection(
    custom,
    { hash, electionId: "new", namespace: "team-a" },
    {
      afterRead: async (seen) => {
        if (injected++) return;
        assert.equal(seen.status?.phase, "Failed");
        await custom.patchClusterCustomObjectStatus(
          { ...ref, name: short, body: { status: { phase: "Ready", reason: "Promoted" } } },
          merge,
        );
      },
    },
  );
  assert.equal(injected, 1, "the interleaving happened");
  assert.equal(result?.status?.phase, "Ready", "the caller is told to restore");
  const now = (await getModelCache(custom, short)) as ModelCacheObject;
  assert.equal(now.status?.phase, "Ready", "the Ready stands");
  assert.equal(now.spec.electionId, "old", "the record was not taken over by the new election");

  // Without a write in between, a Failed record is reset for the new election, its count kept,
  // and nothing of the previous election's leader left on it.
  await custom.patchClusterCustomObject(
    {
      ...ref,
      name: short,
      body: { spec: { leader: { namespace: "team-a", name: "old-pod", uid: "old-uid" } } },
    },
    merge,
  );
  await custom.patchClusterCustomObjectStatus(
    {
      ...ref,
      name: short,
      body: { status: { phase: "Failed", reason: "CaptureFailed", electionId: "old", leaderUid: "old-uid" } },
    },
    merge,
  );
  assert.equal(await recordElection(custom, { hash, electionId: "newer", namespace: "team-b" }), undefined);
  const reset = (await getModelCache(custom, short)) as ModelCacheObject;
  assert.deepEqual(
    [reset.status?.phase, reset.spec.electionId, reset.status?.electionId],
    ["Electing", "newer", "newer"],
  );
  assert.deepEqual(reset.spec.leader, { namespace: "team-b" });
  assert.equal(reset.status?.leaderUid, undefined);
  assert.equal(reset.status?.failedCaptures, 1, "the count of failed captures is kept");
});

test("a ModelCache being deleted is never restored from: its hash is elected, restore-from starts cold, no claim is made", async (t) => {
  const ns = await tempNamespace(t, "deleting");
  const { core, custom } = await kube();
  const podSpec = (model: string, annotations?: Record<string, string>): k8s.V1Pod => ({
    metadata: { generateName: "w-", annotations },
    spec: { containers: [gpuContainer("vllm", ["--model", model])] },
  });
  const model = `org/deleting-${ns}`;
  const { hash } = cacheHash(podSpec(model), classifyPod(podSpec(model)));
  const short = shortHash(hash);
  await cleanupHash(t, short);
  const ref = { group: MODELCACHE.group, version: MODELCACHE.version, plural: MODELCACHE.plural };
  const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
  // A finalizer of the test's own keeps the record while it is being deleted, as a node's store would.
  const hold = "warmstart.dev/test-hold";
  await custom.createClusterCustomObject({
    ...ref,
    body: {
      apiVersion: "warmstart.dev/v1alpha1",
      kind: "ModelCache",
      metadata: {
        name: short,
        finalizers: [hold],
        annotations: {
          [ANN_CACHE_SOURCE]: JSON.stringify({
            backend: "host-path",
            provisioner: HOST_PATH_PROVISIONER,
            sizeBytes: 1024,
            node: "gpu-0",
            path: `/var/lib/warmstart/store/${short}`,
            hostPathType: "hostPath",
          }),
        },
      },
      spec: { hash, model },
    },
  });
  t.after(() =>
    custom
      .patchClusterCustomObject({ ...ref, name: short, body: { metadata: { finalizers: null } } }, merge)
      .then(
        () => undefined,
        (err: unknown) => {
          if (!isNotFound(err)) throw err;
        },
      ),
  );
  await custom.patchClusterCustomObjectStatus(
    { ...ref, name: short, body: { status: { phase: "Ready", backend: "host-path" } } },
    merge,
  );
  // `kubectl delete modelcache`: the record stays, phase Ready, until its finalizers are done.
  await custom.deleteClusterCustomObject({ ...ref, name: short });
  const deleting = (await getModelCache(custom, short)) as ModelCacheObject;
  assert.ok(deleting.metadata.deletionTimestamp);
  assert.equal(deleting.status?.phase, "Ready");

  const noClaim = async (): Promise<void> =>
    assert.rejects(
      core.readNamespacedPersistentVolumeClaim({ name: claimName(hash), namespace: ns }),
      (err: unknown) => isNotFound(err),
      "no claim made for a cache being deleted",
    );
  const pod = await core.createNamespacedPod({ namespace: ns, body: podSpec(model) });
  assert.equal(role(pod), "leader", "elected as if there were no record");
  assert.match(
    pod.metadata!.annotations![ANN_REASON]!,
    /won the election \(cache [0-9a-f]{16} is being deleted\)/,
  );
  await noClaim();
  const record = (await getModelCache(custom, short)) as ModelCacheObject;
  assert.equal(record.spec.electionId, undefined, "nothing written to a record being deleted");

  const from = await core.createNamespacedPod({
    namespace: ns,
    body: podSpec(`org/other-${ns}`, { [ANN_RESTORE_FROM]: short }),
  });
  await cleanupHash(t, shortHash(from.metadata!.annotations![ANN_HASH]!));
  assert.equal(role(from), "cold");
  assert.equal(from.metadata!.annotations![ANN_REASON], `restore-from ${short}: the cache is being deleted`);
  await noClaim();
  // The leader goes before the record does: its node agent would otherwise record a new election.
  await core.deleteNamespacedPod({ name: pod.metadata!.name!, namespace: ns, gracePeriodSeconds: 0 });
});

test("the cache-env ConfigMap decorates new leaders; a bad one is refused and the built-in template kept", async (t) => {
  const ns = await tempNamespace(t, "cacheenv");
  const { core, custom } = await kube();
  const name = "warmstart-cache-env";
  const builtIn = Object.fromEntries(DEFAULT_CACHE_ENV_TEMPLATE.map((e) => [e.name, e.value]));
  const put = async (data: Record<string, string>): Promise<void> => {
    try {
      await core.createNamespacedConfigMap({
        namespace: SYSTEM_NAMESPACE,
        body: { metadata: { name }, data },
      });
    } catch (err) {
      if (!isAlreadyExists(err)) throw err;
      await core.replaceNamespacedConfigMap({
        name,
        namespace: SYSTEM_NAMESPACE,
        body: { metadata: { name }, data },
      });
    }
  };
  t.after(() =>
    core.deleteNamespacedConfigMap({ name, namespace: SYSTEM_NAMESPACE }).then(
      () => undefined,
      (err: unknown) => {
        if (!isNotFound(err)) throw err;
      },
    ),
  );
  let n = 0;
  /** A fresh leader (its own model), its env, and its record. */
  const leaderEnv = async (): Promise<{ env: Record<string, string>; pod: k8s.V1Pod }> => {
    const pod = await core.createNamespacedPod({
      namespace: ns,
      body: {
        metadata: { name: `l-${n++}` },
        spec: { containers: [gpuContainer("c", ["--model", `org/env-${ns}-${n}`])] },
      },
    });
    await cleanupHash(t, pod.metadata!.labels![LABEL_HASH]!);
    assert.equal(role(pod), "leader");
    const env = Object.fromEntries((pod.spec!.containers[0]!.env ?? []).map((e) => [e.name, e.value ?? ""]));
    return { env, pod };
  };
  // Built-in entries kept (other tests share the cluster), one more added.
  await put({ ...builtIn, XDG_CACHE_HOME: "{root}/cache/xdg" });
  const custom1 = await waitFor("a leader decorated from the ConfigMap", async () => {
    const l = await leaderEnv();
    return l.env.XDG_CACHE_HOME === "/warmstart/cache-root/cache/xdg" ? l : undefined;
  });
  // The record keeps the template the leader had, for its restores.
  const record = await getModelCache(custom, custom1.pod.metadata!.labels![LABEL_HASH]!);
  assert.match(record?.metadata.annotations?.["warmstart.dev/cache-env"] ?? "", /XDG_CACHE_HOME/);

  // One entry that would point out of the cache root: the whole ConfigMap is refused.
  await put({ ...builtIn, XDG_CACHE_HOME: "{root}/cache/xdg", EVIL: "/etc" });
  const fallback = await waitFor("the built-in template back", async () => {
    const l = await leaderEnv();
    return l.env.XDG_CACHE_HOME === undefined ? l : undefined;
  });
  assert.equal(fallback.env.EVIL, undefined);
  assert.equal(fallback.env.HF_HOME, "/warmstart/cache-root/model/huggingface");
});

test("sharing scope namespace: restore-from another namespace's cache starts cold; its own restores", async (t) => {
  // A webhook of its own with sharing.scope=namespace, over the real API server; reviews are posted
  // to it directly (the cluster's webhook is the one registered, with the cluster scope).
  const { kc, custom } = await kube();
  const nsA = await tempNamespace(t, "scope-a");
  const nsB = await tempNamespace(t, "scope-b");
  const hook = await runWebhook(
    loadWebhookConfig({ host: "127.0.0.1", port: 0, electionEnabled: "true", sharingScope: "namespace" }, {}),
    { kubeConfig: kc, log: pino({ level: "silent" }) },
  );
  t.after(() => hook.stop());
  const review = async (namespace: string, annotations?: Record<string, string>): Promise<k8s.V1Pod> => {
    const pod: k8s.V1Pod = {
      metadata: { name: "w", annotations },
      spec: { containers: [gpuContainer("vllm", ["--model", `org/scoped-${nsA}`])] },
    };
    const res = await fetchReview(hook.url, {
      uid: uniqueName("u"),
      operation: "CREATE",
      namespace,
      resource: { group: "", version: "v1", resource: "pods" },
      object: pod,
    });
    const ops = res.patch
      ? (JSON.parse(Buffer.from(res.patch, "base64").toString()) as jsonpatch.Operation[])
      : [];
    return jsonpatch.applyPatch(structuredClone(pod), ops, true, false).newDocument;
  };
  const leaderA = await review(nsA);
  assert.equal(role(leaderA), "leader");
  const hashA = leaderA.metadata!.annotations![ANN_HASH]!;
  await cleanupHash(t, shortHash(hashA));
  const leaderB = await review(nsB);
  const hashB = leaderB.metadata!.annotations![ANN_HASH]!;
  await cleanupHash(t, shortHash(hashB));
  assert.equal(role(leaderB), "leader", "the same pod in another namespace is another cache");
  assert.notEqual(hashA, hashB);
  // A's cache turns Ready, with where its tree is (as promote would publish it).
  const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
  await custom.patchClusterCustomObject(
    {
      group: MODELCACHE.group,
      version: MODELCACHE.version,
      plural: MODELCACHE.plural,
      name: shortHash(hashA),
      body: {
        metadata: {
          annotations: {
            [ANN_CACHE_SOURCE]: JSON.stringify({
              backend: "host-path",
              provisioner: HOST_PATH_PROVISIONER,
              sizeBytes: 1024,
              node: "gpu-0",
              path: `/var/lib/warmstart/store/${shortHash(hashA)}`,
              hostPathType: "hostPath",
            }),
          },
        },
      },
    },
    merge,
  );
  await custom.patchClusterCustomObjectStatus(
    {
      group: MODELCACHE.group,
      version: MODELCACHE.version,
      plural: MODELCACHE.plural,
      name: shortHash(hashA),
      body: { status: { phase: "Ready" } },
    },
    k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
  );
  const stolen = await review(nsB, { [ANN_RESTORE_FROM]: shortHash(hashA) });
  assert.equal(role(stolen), "cold");
  assert.match(
    stolen.metadata!.annotations![ANN_REASON]!,
    /no cache of that hash in this pod's sharing scope/,
  );
  assert.ok(!JSON.stringify(stolen.spec).includes(claimName(hashA)), "no claim of A's cache mounted");
  const own = await review(nsA, { [ANN_RESTORE_FROM]: hashA });
  assert.equal(role(own), "restore");
});

/** POSTs one AdmissionReview to a webhook started without client authentication. */
function fetchReview(url: string, req: object): Promise<{ patch?: string }> {
  return new Promise((resolve, reject) => {
    const r = request(
      `${url}/mutate`,
      { method: "POST", rejectUnauthorized: false, headers: { "content-type": "application/json" } },
      (res) => {
        let text = "";
        res.on("data", (d: Buffer) => (text += d.toString()));
        res.on("end", () => {
          try {
            resolve((JSON.parse(text) as { response: { patch?: string } }).response);
          } catch (err) {
            reject(new Error(`webhook answered ${res.statusCode}: ${text}`, { cause: err }));
          }
        });
      },
    );
    r.on("error", reject);
    r.end(JSON.stringify({ apiVersion: "admission.k8s.io/v1", kind: "AdmissionReview", request: req }));
  });
}
