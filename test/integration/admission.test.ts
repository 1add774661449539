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
  gpuContainer,
  kube,
  listPods,
  localCluster,
  podCondition,
  tempNamespace,
  uniqueName,
  waitFor,
  createWorkers,
} from "../harness.js";
import {
  ANN_HASH,
  ANN_RESTORE_FROM,
  ANN_ROLE,
  LABEL_CAPTURE,
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
import { SYSTEM_NAMESPACE, isNotFound } from "../../src/common/kube.js";
import { registerWebhook, unregisterWebhook, webhookConfiguration } from "../../src/webhook/registration.js";
import { createCA } from "../../src/common/certs.js";

let webhookUrl: string;

before(async () => {
  const st = await localCluster();
  if (!st?.roles.webhook) throw new Error("these tests need the webhook role of `warmstart cluster up`");
  webhookUrl = st.roles.webhook;
});

const role = (p: k8s.V1Pod): string | undefined => p.metadata?.annotations?.[ANN_ROLE];

/** Leases and caches a test created in cluster scope are removed with it. */
async function cleanupHash(t: { after: (fn: () => Promise<void>) => void }, short: string): Promise<void> {
  const { coordination, custom, core } = await kube();
  t.after(async () => {
    const pvs = await core.listPersistentVolume({ labelSelector: `${LABEL_HASH}=${short}` });
    for (const pv of pvs.items) await core.deletePersistentVolume({ name: pv.metadata!.name! });
    await coordination
      .deleteNamespacedLease({ name: `warmstart-capture-${short}`, namespace: SYSTEM_NAMESPACE })
      .catch((err: unknown) => {
        if (!isNotFound(err)) throw err;
      });
    await custom
      .deleteClusterCustomObject({
        group: MODELCACHE.group,
        version: MODELCACHE.version,
        plural: MODELCACHE.plural,
        name: short,
      })
      .catch((err: unknown) => {
        if (!isNotFound(err)) throw err;
      });
  });
}

test("a chart's 4 GPU workers get 1 leader and 3 gated followers of one hash; its frontend is untouched", async (t) => {
  const ns = await tempNamespace(t, "chart");
  const { core } = await kube();
  const model = `meta-llama/Llama-3.1-8B-Instruct-${ns}`;
  await createWorkers(ns, { replicas: 4, args: ["--model", model, "--tensor-parallel-size", "1"] });
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
    metadata: { name },
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
            metadata: { name: `t${trial}-p${i}` },
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
          metadata: { generateName: "worker-" },
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
  const post = (body: string, contentType = "application/json"): Promise<{ status: number; body: string }> =>
    new Promise((resolve, reject) => {
      const req = request(
        `${webhookUrl}/mutate`,
        { method: "POST", rejectUnauthorized: false, headers: { "content-type": contentType } },
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
