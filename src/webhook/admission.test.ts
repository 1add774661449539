import { test } from "node:test";
import assert from "node:assert/strict";
import { pino } from "pino";
import type { V1Pod } from "@kubernetes/client-node";
import { admissionHandler, decide, type AdmissionDeps, type ClusterView } from "./admission.js";
import { loadWebhookConfig } from "./config.js";
import { createWebhookMetrics } from "./metrics.js";
import type { AdmissionReview } from "./server.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import { ANN_ROLE } from "../core/contract.js";

const gpuPod = (model = "org/m"): V1Pod => ({
  metadata: { name: "w", namespace: "ns" },
  spec: {
    containers: [
      {
        name: "vllm",
        image: "vllm:1",
        args: ["--model", model],
        resources: { limits: { "nvidia.com/gpu": "1" } },
      },
    ],
  },
});

const review = (pod: V1Pod, extra: Partial<AdmissionReview["request"]> = {}): AdmissionReview => ({
  apiVersion: "admission.k8s.io/v1",
  kind: "AdmissionReview",
  request: {
    uid: "u-1",
    operation: "CREATE",
    namespace: "ns",
    resource: { group: "", version: "v1", resource: "pods" },
    object: pod,
    ...extra,
  },
});

function deps(
  cluster: Partial<ClusterView>,
  flags: Record<string, unknown> = {},
): AdmissionDeps & { calls: string[] } {
  const calls: string[] = [];
  const view: ClusterView = {
    getModelCache: () => Promise.resolve(undefined),
    tryAcquire: () => Promise.resolve({ role: "leader", leaseUid: "lease-uid" }),
    recordElection: () => Promise.resolve(undefined),
    releaseLease: (_h, uid) => {
      calls.push(`release ${uid}`);
      return Promise.resolve();
    },
    restoreProfile: () => Promise.resolve({ prewarm: true, prewarmParallelism: 6, treePath: "." }),
    followerProfile: () => Promise.resolve({ prewarm: true, prewarmParallelism: 6 }),
    ...cluster,
  };
  return {
    cfg: loadWebhookConfig({ electionEnabled: "true", ...flags }, {}),
    cluster: view,
    log: pino({ level: "silent" }),
    metrics: createWebhookMetrics(),
    recordEvent: () => undefined,
    calls,
  };
}

test("pods that download nothing, opted-out pods and the system namespace are left alone", async () => {
  const web: V1Pod = { metadata: { name: "web" }, spec: { containers: [{ name: "web", image: "nginx" }] } };
  assert.equal((await decide(review(web), deps({}))).role, "pass");
  const skipped = gpuPod();
  skipped.metadata!.annotations = { "warmstart.dev/skip": "true" };
  assert.equal((await decide(review(skipped), deps({}))).role, "pass");
  const sys = await decide(review(gpuPod(), { namespace: "warmstart-system" }), deps({}));
  assert.deepEqual([sys.role, sys.reason], ["pass", "system namespace"]);
});

test("election disabled admits cold; a dry run never takes a Lease", async () => {
  let acquired = 0;
  const cluster = {
    tryAcquire: () => (acquired++, Promise.resolve({ role: "leader" as const, leaseUid: "x" })),
  };
  const off = await decide(review(gpuPod()), deps(cluster, { electionEnabled: "false" }));
  assert.deepEqual([off.role, off.reason], ["cold", "election disabled"]);
  const dry = await decide(review(gpuPod(), { dryRun: true }), deps(cluster));
  assert.equal(dry.role, "cold");
  assert.equal(acquired, 0);
  assert.equal(dry.pod?.metadata?.annotations?.[ANN_ROLE], "cold");
});

test("a pod admitted just after its cache turned Ready restores instead of starting a second capture", async () => {
  // The first look saw no Ready cache; by the time this pod won the (new) Lease, the cache was Ready.
  const ready: ModelCacheObject = {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: "0123456789abcdef" },
    spec: { hash: "0123456789abcdef".repeat(4) },
    status: { phase: "Ready" },
  };
  const d = deps({ recordElection: () => Promise.resolve(ready) });
  const decision = await decide(review(gpuPod()), d);
  assert.equal(decision.role, "restore");
  assert.deepEqual(d.calls, ["release lease-uid"], "the Lease it took is given back");
  assert.equal(decision.pod?.metadata?.annotations?.[ANN_ROLE], "restore");
});

test("any error admits the pod unchanged, with its uid and a warning", async () => {
  const d = deps({ getModelCache: () => Promise.reject(new Error("connection refused")) });
  const res = await admissionHandler(d)(review(gpuPod()));
  assert.equal(res.uid, "u-1");
  assert.equal(res.allowed, true);
  assert.equal(res.patch, undefined);
  assert.match(res.warnings?.[0] ?? "", /connection refused/);
  const failOpen = await d.metrics.registry.getSingleMetricAsString("warmstart_webhook_fail_open_total");
  assert.match(failOpen, /cause="error"} 1/);
});

test("a cluster that does not answer in time admits the pod unchanged before the API server gives up", async () => {
  const d = deps({ getModelCache: () => new Promise(() => undefined) }, { timeoutSeconds: 1 });
  const started = Date.now();
  const res = await admissionHandler(d)(review(gpuPod()));
  assert.ok(Date.now() - started < 1000, "answered inside the 1 s webhook timeout");
  assert.equal(res.patch, undefined);
  assert.match(res.warnings?.[0] ?? "", /no decision within/);
});

test("a leader's answer is a base64 JSON patch that stamps the pod", async () => {
  const res = await admissionHandler(deps({}))(review(gpuPod()));
  assert.equal(res.patchType, "JSONPatch");
  const ops = JSON.parse(Buffer.from(res.patch!, "base64").toString()) as { path: string }[];
  assert.ok(ops.some((o) => o.path.startsWith("/metadata/annotations")));
  assert.ok(ops.some((o) => o.path.startsWith("/spec/volumes")));
});

test("after repeated failed captures a hash is admitted cold instead of re-elected", async () => {
  const failed = (failures: number): ModelCacheObject => ({
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: "0123456789abcdef" },
    spec: { hash: "0123456789abcdef".repeat(4) },
    status: { phase: "Failed", reason: "CaptureFailed", message: "no space left on device", failures },
  });
  const twice = await decide(review(gpuPod()), deps({ getModelCache: () => Promise.resolve(failed(2)) }));
  assert.equal(twice.role, "leader", "a failed attempt is retried");
  const thrice = await decide(review(gpuPod()), deps({ getModelCache: () => Promise.resolve(failed(3)) }));
  assert.equal(thrice.role, "cold");
  assert.match(thrice.reason, /failed 3 times .*no space left/);
});

test("a Lease won by a pod that is then admitted unchanged is given back", async () => {
  // The record cannot be written (e.g. the CRD is missing): the pod fails open, the Lease goes.
  const failing = deps({ recordElection: () => Promise.reject(new Error("modelcaches not found")) });
  const res = await admissionHandler(failing)(review(gpuPod()));
  assert.equal(res.patch, undefined, "admitted unchanged");
  assert.deepEqual(failing.calls, ["release lease-uid"]);

  // The answer was given up on while the Lease was being created: given back too.
  let release: () => void = () => undefined;
  const slow = deps(
    {
      tryAcquire: () =>
        new Promise((resolve) => {
          release = () => resolve({ role: "leader", leaseUid: "late-uid" });
        }),
    },
    { timeoutSeconds: 1 },
  );
  const answer = await admissionHandler(slow)(review(gpuPod()));
  assert.match(answer.warnings?.[0] ?? "", /no decision within/);
  release();
  await new Promise((r) => setTimeout(r, 20));
  assert.deepEqual(slow.calls, ["release late-uid"]);
});
