import { performance } from "node:perf_hooks";
import { test } from "node:test";
import assert from "node:assert/strict";
import { pino } from "pino";
import type { V1Pod } from "@kubernetes/client-node";
import { decide, type AdmissionDeps, type ClusterView } from "./admission.js";
import { admissionHandler } from "./handler.js";
import { loadWebhookConfig } from "./config.js";
import { createWebhookMetrics } from "./metrics.js";
import type { AdmissionReview } from "./server.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import jsonpatch from "fast-json-patch";
import {
  ANN_CACHE_ENV,
  ANN_REASON,
  ANN_ROLE,
  type CachePhase,
  LABEL_ADMISSION_ID,
  LABEL_CAPTURE,
} from "../core/contract.js";
import type { AdmissionResponse } from "./server.js";
import type { PendingEvent } from "./events.js";
import { DEFAULT_CACHE_ENV_TEMPLATE } from "../core/decorate.js";
import { resolveProfile, unshareable } from "../promote/profiles.js";

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

/** The pod the API server would store: the answer's patch applied to what was sent. */
function admitted(sent: V1Pod, res: AdmissionResponse): V1Pod {
  if (!res.patch) return sent;
  const ops = JSON.parse(Buffer.from(res.patch, "base64").toString()) as jsonpatch.Operation[];
  return jsonpatch.applyPatch(structuredClone(sent), ops, true, false).newDocument;
}

function deps(
  cluster: Partial<ClusterView>,
  flags: Record<string, unknown> = {},
): AdmissionDeps & { calls: string[]; events: PendingEvent[] } {
  const calls: string[] = [];
  const events: PendingEvent[] = [];
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
    namespaceLabels: () => Promise.resolve({}),
    cacheEnvTemplate: () => Promise.resolve(DEFAULT_CACHE_ENV_TEMPLATE),
    ...cluster,
  };
  return {
    cfg: loadWebhookConfig({ electionEnabled: "true", ...flags }, {}),
    cluster: view,
    log: pino({ level: "silent" }),
    metrics: createWebhookMetrics(),
    recordEvent: (ev) => events.push(ev),
    calls,
    events,
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

test("a restore's seed is told the record's manifest digest where it mounts the captured tree itself, so it refuses any other tree", async () => {
  const digest = "ab".repeat(32);
  const ready: ModelCacheObject = {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: "0123456789abcdef" },
    spec: { hash: "0123456789abcdef".repeat(4) },
    status: { phase: "Ready", manifestDigest: digest, backend: "node-store" },
  };
  const seedArgs = async (cache: ModelCacheObject): Promise<string[]> => {
    const decision = await decide(review(gpuPod()), deps({ getModelCache: () => Promise.resolve(cache) }));
    assert.equal(decision.role, "restore");
    return decision.pod?.spec?.initContainers?.find((c) => c.args?.[0] === "seed")?.args ?? [];
  };
  const args = await seedArgs(ready);
  assert.equal(args[args.indexOf("--manifest-digest") + 1], digest);
  // Snapshot-clone's volume holds the tree captured again, with a manifest of its own.
  const clone = await seedArgs({ ...ready, status: { ...ready.status, backend: "snapshot-clone" } });
  assert.ok(!clone.includes("--manifest-digest"), "no digest for a clone's own manifest");
});

test("any error admits the pod undecorated, with its uid and a warning", async () => {
  const d = deps({ getModelCache: () => Promise.reject(new Error("connection refused")) });
  const pod = gpuPod();
  const res = await admissionHandler(d)(review(pod));
  assert.equal(res.uid, "u-1");
  assert.equal(res.allowed, true);
  // Only the label its Event finds it by: no decoration, no role.
  assert.deepEqual(Object.keys(admitted(pod, res).metadata?.labels ?? {}), [LABEL_ADMISSION_ID]);
  assert.deepEqual(admitted(pod, res).spec, pod.spec);
  assert.match(res.warnings?.[0] ?? "", /connection refused/);
  const failOpen = await d.metrics.registry.getSingleMetricAsString("warmstart_webhook_fail_open_total");
  assert.match(failOpen, /cause="error"} 1/);
});

test("a cluster that does not answer in time admits the pod unchanged before the API server gives up", async () => {
  const d = deps({ getModelCache: () => new Promise(() => undefined) }, { timeoutSeconds: 1 });
  const started = Date.now();
  const res = await admissionHandler(d)(review(gpuPod()));
  assert.ok(Date.now() - started < 1000, "answered inside the 1 s webhook timeout");
  assert.equal(admitted(gpuPod(), res).metadata?.annotations?.[ANN_ROLE], undefined);
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
    status: {
      phase: "Failed",
      reason: "CaptureFailed",
      message: "no space left on device",
      failedCaptures: failures,
    },
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
  assert.equal(admitted(gpuPod(), res).metadata?.annotations?.[ANN_ROLE], undefined, "admitted undecorated");
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

const FORGED_LABELS = {
  app: "mine",
  "warmstart.dev/capture": "true",
  "warmstart.dev/hash": "0123456789abcdef",
  "warmstart.dev/gated": "true",
};
const FORGED_ANNOTATIONS = {
  note: "mine",
  "warmstart.dev/hash": "01".repeat(32),
  "warmstart.dev/role": "leader",
  "warmstart.dev/election-id": "copied-from-the-holder",
  "warmstart.dev/tree": "../../../etc",
  "warmstart.dev/injected-env": "HF_ENDPOINT",
  "warmstart.dev/capture-size-limit": "1Ei",
};
const forge = (p: V1Pod, annotations: Record<string, string> = {}): V1Pod => ({
  ...p,
  metadata: {
    ...p.metadata,
    labels: { ...FORGED_LABELS },
    annotations: { ...FORGED_ANNOTATIONS, ...annotations },
  },
});
const ours = (m: Record<string, string> | undefined): Record<string, string> =>
  Object.fromEntries(Object.entries(m ?? {}).filter(([k]) => k.startsWith("warmstart.dev/")));

test("the author's stamps are removed whatever the decision, fail-open included", async () => {
  const web: V1Pod = { metadata: { name: "web" }, spec: { containers: [{ name: "web", image: "nginx" }] } };
  const noModel: V1Pod = {
    metadata: { name: "g" },
    spec: { containers: [{ name: "c", image: "cuda", resources: { limits: { "nvidia.com/gpu": "1" } } }] },
  };
  const cases: [
    string,
    V1Pod,
    Partial<ClusterView>,
    Record<string, unknown>,
    Partial<AdmissionReview["request"]>,
  ][] = [
    ["no GPU", forge(web), {}, {}, {}],
    ["no model", forge(noModel), {}, {}, {}],
    ["opted out", forge(gpuPod(), { "warmstart.dev/skip": "true" }), {}, {}, {}],
    [
      "namespace opted out",
      forge(gpuPod()),
      { namespaceLabels: () => Promise.resolve({ "warmstart.dev/skip": "true" }) },
      {},
      {},
    ],
    ["system namespace", forge(gpuPod()), {}, {}, { namespace: "warmstart-system" }],
    ["malformed", { metadata: { labels: { ...FORGED_LABELS } } }, {}, {}, {}],
    ["fail-open", forge(gpuPod()), { getModelCache: () => Promise.reject(new Error("boom")) }, {}, {}],
    [
      "timeout",
      forge(gpuPod()),
      { getModelCache: () => new Promise(() => undefined) },
      { timeoutSeconds: 1 },
      {},
    ],
    ["cold", forge(gpuPod()), {}, { electionEnabled: "false" }, {}],
    ["dry run", forge(gpuPod()), {}, {}, { dryRun: true }],
    ["follower", forge(gpuPod()), { tryAcquire: () => Promise.resolve({ role: "follower" }) }, {}, {}],
  ];
  for (const [name, pod, cluster, flags, extra] of cases) {
    const res = await admissionHandler(deps(cluster, flags))(review(pod, extra));
    const after = admitted(pod, res);
    const labels = ours(after.metadata?.labels);
    const annotations = ours(after.metadata?.annotations);
    assert.equal(labels[LABEL_CAPTURE], undefined, `${name}: no capture label`);
    assert.notEqual(annotations["warmstart.dev/election-id"], "copied-from-the-holder", name);
    assert.equal(annotations["warmstart.dev/tree"], undefined, `${name}: no forged tree`);
    assert.equal(annotations["warmstart.dev/injected-env"], undefined, name);
    assert.equal(annotations["warmstart.dev/capture-size-limit"], undefined, name);
    assert.notEqual(annotations["warmstart.dev/hash"], "01".repeat(32), name);
    assert.notEqual(labels["warmstart.dev/hash"], "0123456789abcdef", name);
    if (!annotations["warmstart.dev/role"]) {
      // Left alone or failed open: nothing of ours but the label its Event finds it by.
      assert.deepEqual(
        Object.keys(labels).filter((k) => k !== LABEL_ADMISSION_ID),
        [],
        name,
      );
      assert.deepEqual(
        Object.keys(annotations).filter((k) => k !== "warmstart.dev/skip"),
        [],
        name,
      );
    }
    // The author's own labels and annotations are untouched.
    assert.equal(after.metadata?.labels?.app, "mine", name);
    if (name !== "malformed") assert.equal(after.metadata?.annotations?.note, "mine", name);
  }
});

test("a GPU pod whose env doubles itself is answered at once, its forged stamps removed", async () => {
  const base = gpuPod();
  const c = base.spec!.containers[0]!;
  const env = [
    { name: "A0", value: "xxxxxxxx" },
    ...Array.from({ length: 40 }, (_, i) => ({ name: `A${i + 1}`, value: `$(A${i})$(A${i})` })),
  ];
  const pod = forge({
    ...base,
    spec: { ...base.spec!, containers: [{ ...c, env, args: [...(c.args ?? []), "$(A40)"] }] },
  });
  assert.ok(JSON.stringify(pod.spec).length < 4_000, "a small pod");
  const t0 = performance.now();
  const res = await admissionHandler(deps({}, {}))(review(pod, {}));
  const ms = performance.now() - t0;
  assert.ok(ms < 1_000, `answered in ${ms} ms`);
  const annotations = ours(admitted(pod, res).metadata?.annotations);
  assert.notEqual(annotations["warmstart.dev/election-id"], "copied-from-the-holder");
  assert.notEqual(annotations["warmstart.dev/hash"], "01".repeat(32));
  assert.equal(annotations["warmstart.dev/tree"], undefined);
});

test("only a real leader carries capture=true, with the election id the webhook minted", async () => {
  let minted = "";
  const d = deps({
    tryAcquire: (_h, id) => ((minted = id), Promise.resolve({ role: "leader", leaseUid: "l" })),
  });
  const pod = forge(gpuPod());
  const after = admitted(pod, await admissionHandler(d)(review(pod)));
  assert.equal(after.metadata?.labels?.[LABEL_CAPTURE], "true");
  assert.ok(minted && after.metadata?.annotations?.["warmstart.dev/election-id"] === minted);
  assert.equal(after.metadata?.annotations?.["warmstart.dev/capture-size-limit"], "200Gi");
  assert.deepEqual(after.spec?.schedulingGates, undefined);
});

test("the count of failed captures decides cold; other failed elections are re-elected", async () => {
  const record = (status: Record<string, unknown>): ModelCacheObject => ({
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: "0123456789abcdef" },
    spec: { hash: "0123456789abcdef".repeat(4) },
    status: { phase: "Failed", ...status },
  });
  // Five elections retired for deadlines or deleted leaders: none was a failed capture.
  const retired = await decide(
    review(gpuPod()),
    deps({ getModelCache: () => Promise.resolve(record({ reason: "ElectionFailed", failures: 5 })) }),
  );
  assert.equal(retired.role, "leader");
  const limit = await decide(
    review(gpuPod()),
    deps({ getModelCache: () => Promise.resolve(record({ failedCaptures: 2 })) }, { maxFailedCaptures: 2 }),
  );
  assert.equal(limit.role, "cold");
  assert.match(limit.reason, /capture failed 2 times .*warmstart cache retry [0-9a-f]{16} elects again/);
});

test("restore-from reaches only a cache of the pod's own sharing scope", async () => {
  const A = "aa".repeat(32);
  const cache = (scope: string | undefined, phase: CachePhase = "Ready"): ModelCacheObject => ({
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: A.slice(0, 16) },
    spec: { hash: A, inputs: { v: 1, image: "i", ...(scope ? { scope } : {}) } },
    status: { phase },
  });
  const from = (ref: string): V1Pod => {
    const p = gpuPod();
    p.metadata!.annotations = { "warmstart.dev/restore-from": ref };
    return p;
  };
  const run = async (c: ModelCacheObject, scope: string, ref = A.slice(0, 16)): Promise<string> => {
    const d = deps({ getModelCache: () => Promise.resolve(c) }, { sharingScope: scope });
    return (await decide(review(from(ref)), d)).role;
  };
  assert.equal(await run(cache(undefined), "cluster"), "restore");
  assert.equal(await run(cache("namespace:ns"), "namespace"), "restore", "its own namespace");
  // The attacker in namespace ns names a cache of namespace victim: cold, with no hint it exists.
  const other = await decide(
    review(from(A.slice(0, 16))),
    deps({ getModelCache: () => Promise.resolve(cache("namespace:victim")) }, { sharingScope: "namespace" }),
  );
  assert.deepEqual(
    [other.role, other.reason],
    ["cold", `restore-from ${A.slice(0, 16)}: no cache of that hash in this pod's sharing scope`],
  );
  assert.equal(
    await run(cache(undefined), "namespace"),
    "cold",
    "a cluster-wide cache is outside a namespace scope",
  );
  assert.equal(await run(cache("group:g"), "group"), "cold", "the namespace is in no group");
  assert.equal(
    await run(cache("cluster"), "cluster", "bb".repeat(32)),
    "cold",
    "a full hash must match exactly",
  );
  assert.equal(await run(cache(undefined), "cluster", "../../x"), "cold");
  assert.equal(await run(cache(undefined, "Capturing"), "cluster"), "cold");
});

test("group scope: namespaces of one share-group share a hash, others do not", async () => {
  const hashIn = async (labels: Record<string, string>, namespace: string): Promise<string | undefined> =>
    (
      await decide(
        review(gpuPod(), { namespace }),
        deps({ namespaceLabels: () => Promise.resolve(labels) }, { sharingScope: "group" }),
      )
    ).hash;
  const g = { "warmstart.dev/share-group": "ml" };
  assert.equal(await hashIn(g, "a"), await hashIn(g, "b"));
  assert.notEqual(await hashIn(g, "a"), await hashIn({ "warmstart.dev/share-group": "web" }, "a"));
  assert.notEqual(await hashIn({}, "a"), await hashIn({}, "b"));
});

test("GPU pods left alone, and fail-open admits, get an Event saying why; frontends and dry runs none", async () => {
  const noModel: V1Pod = {
    metadata: { generateName: "g-" },
    spec: { containers: [{ name: "c", image: "cuda", resources: { limits: { "nvidia.com/gpu": "1" } } }] },
  };
  const d = deps({});
  const res = await admissionHandler(d)(review(noModel));
  assert.equal(d.events.length, 1);
  const ev = d.events[0]!;
  assert.deepEqual(
    [ev.type, ev.reason, ev.message],
    ["Normal", "WarmstartLeftAlone", "left alone: GPU container names no model"],
  );
  assert.equal(
    admitted(noModel, res).metadata?.labels?.[LABEL_ADMISSION_ID],
    ev.admissionId,
    "found by its label",
  );

  const skipped = gpuPod();
  skipped.metadata!.annotations = { "warmstart.dev/skip": "true" };
  await admissionHandler(d)(review(skipped));
  assert.equal(d.events[1]?.message, "left alone: opted out (warmstart.dev/skip annotation)");

  const web: V1Pod = { metadata: { name: "web" }, spec: { containers: [{ name: "web", image: "nginx" }] } };
  const webRes = await admissionHandler(d)(review(web));
  assert.equal(webRes.patch, undefined, "a frontend is not touched");
  await admissionHandler(d)(review(noModel, { dryRun: true }));
  assert.equal(d.events.length, 2);

  const failing = deps({ getModelCache: () => Promise.reject(new Error("etcd is down")) });
  await admissionHandler(failing)(review(gpuPod()));
  assert.deepEqual(
    failing.events.map((e) => [e.type, e.reason, e.message]),
    [["Warning", "WarmstartFailOpen", "admitted without a cache decision: etcd is down"]],
  );
});

test("a credential in the model URL never reaches the record, the pod's reason or an Event", async () => {
  const token = "hf_SuperSecret123";
  let recorded: string | undefined;
  const d = deps({
    recordElection: (o) => ((recorded = o.model), Promise.resolve(undefined)),
  });
  const pod = gpuPod(`https://user:${token}@hub.local/org/m`);
  const res = await admissionHandler(d)(review(pod));
  assert.equal(recorded, "https://<redacted>@hub.local/org/m");
  const after = admitted(pod, res);
  assert.ok(!JSON.stringify(after.metadata).includes(token));
  assert.ok(!JSON.stringify(d.events).includes(token));
  // The pod's own args are its own: they are not rewritten.
  assert.ok(JSON.stringify(after.spec).includes(token));
  const failing = deps({ getModelCache: () => Promise.reject(new Error(`GET https://u:${token}@x failed`)) });
  const failed = await admissionHandler(failing)(review(pod));
  assert.ok(!JSON.stringify(failed).includes(token) && !JSON.stringify(failing.events).includes(token));
});

test("the size limit a pod asks for is used, capped by the cluster's maximum, and explained", async () => {
  const asking = (limit: string): V1Pod => {
    const p = gpuPod();
    p.metadata!.annotations = { "warmstart.dev/cache-size-limit": limit };
    return p;
  };
  const limitOf = async (limit: string, flags: Record<string, unknown> = {}): Promise<[string?, string?]> => {
    const decision = await decide(review(asking(limit)), deps({}, flags));
    const vol = decision.pod?.spec?.volumes?.find((v) => v.name === "warmstart-cache");
    return [vol?.emptyDir?.sizeLimit, decision.pod?.metadata?.annotations?.[ANN_REASON]];
  };
  assert.deepEqual(await limitOf("500Gi"), ["500Gi", "won the election"]);
  const [capped, why] = await limitOf("5Ti", { maxCacheSizeLimit: "2Ti" });
  assert.equal(capped, "2Ti");
  assert.match(why ?? "", /above the cluster's maximum; using 2Ti/);
  assert.equal((await limitOf("junk", { cacheSizeLimit: "300Gi" }))[0], "300Gi");
  assert.throws(
    () => loadWebhookConfig({ cacheSizeLimit: "2Ti", maxCacheSizeLimit: "1Ti" }, {}),
    /above the maximum/,
  );
  assert.throws(() => loadWebhookConfig({ cacheSizeLimit: "big" }, {}), /not a size/);
});

test("the cache-env template in force decorates leaders and followers; a restore replays its leader's", async () => {
  const mine = [{ name: "HF_HOME", value: "{root}/model/hub" }];
  const envOf = (p: V1Pod | undefined): string[] =>
    (p?.spec?.containers[0]?.env ?? []).map((e) => `${e.name}=${e.value ?? "(ref)"}`);
  const leader = await decide(review(gpuPod()), deps({ cacheEnvTemplate: () => Promise.resolve(mine) }));
  assert.deepEqual(envOf(leader.pod), ["HF_HOME=/warmstart/cache-root/model/hub"]);
  const follower = await decide(
    review(gpuPod()),
    deps({
      cacheEnvTemplate: () => Promise.resolve(mine),
      tryAcquire: () => Promise.resolve({ role: "follower" }),
    }),
  );
  assert.ok(envOf(follower.pod).includes("HF_HOME=/warmstart/cache-root/model/hub"));
  const ready: ModelCacheObject = {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: {
      name: "0123456789abcdef",
      annotations: { [ANN_CACHE_ENV]: JSON.stringify([{ name: "HF_HOME", value: "{root}/model/old" }]) },
    },
    spec: { hash: "0123456789abcdef".repeat(4) },
    status: { phase: "Ready" },
  };
  const restored = await decide(
    review(gpuPod()),
    deps({ cacheEnvTemplate: () => Promise.resolve(mine), getModelCache: () => Promise.resolve(ready) }),
  );
  assert.equal(restored.role, "restore");
  assert.ok(
    envOf(restored.pod).includes("HF_HOME=/warmstart/cache-root/model/old"),
    envOf(restored.pod).join(),
  );
});

test("a record being deleted is never restored from: the pod is elected, and restore-from starts cold", async () => {
  // `kubectl delete modelcache`: the record keeps phase Ready while its finalizers roll it back.
  const hash = "0123456789abcdef".repeat(4);
  const deleting: ModelCacheObject = {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: {
      name: hash.slice(0, 16),
      deletionTimestamp: new Date(),
      finalizers: ["warmstart.dev/cleanup"],
    },
    spec: { hash },
    status: { phase: "Ready", failedCaptures: 9 },
  };
  const claims: string[] = [];
  const cluster: Partial<ClusterView> = {
    getModelCache: () => Promise.resolve(deleting),
    ensureClaim: (_c, ns) => (claims.push(ns), Promise.resolve()),
  };
  const elected = await decide(review(gpuPod()), deps(cluster));
  assert.equal(elected.role, "leader", "elected as if there were no record, its failures no longer counted");
  assert.equal(elected.reason, `won the election (cache ${elected.hash!.slice(0, 16)} is being deleted)`);
  const from = gpuPod();
  from.metadata!.annotations = { "warmstart.dev/restore-from": ` ${hash.slice(0, 16).toUpperCase()} ` };
  // A record of no scope is the cluster's: restore-from reaches it only under that scope.
  const requested = await decide(review(from), deps(cluster, { sharingScope: "cluster" }));
  assert.deepEqual(
    [requested.role, requested.reason],
    ["cold", `restore-from ${hash.slice(0, 16)}: the cache is being deleted`],
  );
  assert.deepEqual(claims, [], "no claim is made again while the rollback removes them");
});

test("a follower gets its leader's recorded cache env; without a record of this election, the one in force", async () => {
  const mine = [{ name: "HF_HOME", value: "{root}/model/hub" }];
  const envOf = (p: V1Pod | undefined): string[] =>
    (p?.spec?.containers[0]?.env ?? []).map((e) => `${e.name}=${e.value ?? "(ref)"}`);
  const record = (phase: CachePhase): ModelCacheObject => ({
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: {
      name: "0123456789abcdef",
      annotations: { [ANN_CACHE_ENV]: JSON.stringify([{ name: "HF_HOME", value: "{root}/model/leader" }]) },
    },
    spec: { hash: "0123456789abcdef".repeat(4) },
    status: { phase },
  });
  const follower = async (cache: ModelCacheObject | undefined): Promise<string[]> =>
    envOf(
      (
        await decide(
          review(gpuPod()),
          deps({
            cacheEnvTemplate: () => Promise.resolve(mine),
            getModelCache: () => Promise.resolve(cache),
            tryAcquire: () => Promise.resolve({ role: "follower" }),
          }),
        )
      ).pod,
    );
  for (const phase of ["Electing", "Capturing", "Promoting"] as const)
    assert.ok((await follower(record(phase))).includes("HF_HOME=/warmstart/cache-root/model/leader"), phase);
  // A Failed record speaks for the previous election; the new leader resets it with the template in force.
  assert.ok((await follower(record("Failed"))).includes("HF_HOME=/warmstart/cache-root/model/hub"));
  assert.ok((await follower(undefined)).includes("HF_HOME=/warmstart/cache-root/model/hub"));
});

test("by default a cache is its namespace's: the same pod in two namespaces gets two hashes", async () => {
  const inNs = async (namespace: string): Promise<string | undefined> =>
    (await decide(review(gpuPod(), { namespace }), deps({}))).hash;
  const [a, b] = [await inNs("team-a"), await inNs("team-b")];
  assert.ok(a && b);
  assert.notEqual(a, b, "another namespace never meets this namespace's cache");
  const shared = async (namespace: string): Promise<string | undefined> =>
    (await decide(review(gpuPod(), { namespace }), deps({}, { sharingScope: "cluster" }))).hash;
  assert.equal(await shared("team-a"), await shared("team-b"), "widened by the operator: shared");
});

test("a follower's init containers get requests (quotas), no memory limit by default, and the pod's own pull secrets only", async () => {
  const pod = gpuPod();
  pod.spec!.imagePullSecrets = [{ name: "own" }, { name: "registry" }];
  const follower = await decide(
    review(pod),
    deps(
      { tryAcquire: () => Promise.resolve({ role: "follower" }) },
      { imagePullSecrets: "registry,mirror" },
    ),
  );
  assert.equal(follower.role, "follower");
  const inits = follower.pod!.spec!.initContainers!;
  assert.ok(inits.length >= 2);
  for (const c of inits) {
    assert.deepEqual(c.resources, { requests: { cpu: "50m", memory: "64Mi" } }, c.name);
  }
  assert.deepEqual(
    follower.pod!.spec!.imagePullSecrets!.map((s) => s.name),
    ["own", "registry"],
    "a Secret the pod's namespace may lack is never named",
  );
  const limited = await decide(
    review(gpuPod()),
    deps(
      { tryAcquire: () => Promise.resolve({ role: "follower" }) },
      { initCpuLimit: "1", initMemoryLimit: "2Gi" },
    ),
  );
  assert.deepEqual(limited.pod!.spec!.initContainers![0]!.resources?.limits, { cpu: "1", memory: "2Gi" });
  assert.throws(() => loadWebhookConfig({ initCpuRequest: "lots" }, {}), /CPU quantity/);
});

test("stores whose storage cannot share one tree (per-pod clones, a shared volume that mounts whole) start every pod cold at admission: no election, nobody gated", async () => {
  const storeOf = (provisioner: string) => () => {
    const p = resolveProfile(new Map(), provisioner);
    const refused = unshareable(p);
    return Promise.resolve({
      prewarm: p.prewarm,
      prewarmParallelism: p.prewarmParallelism,
      backend: p.backend,
      ...(refused ? { unshareable: refused } : {}),
    });
  };
  for (const [provisioner, reason] of [
    ["ebs.csi.aws.com", /clones a volume per pod \(EBS volumes attach to one node/],
    ["filestore.csi.storage.gke.io", /would mount the whole store, every cache in it, not one tree/],
    ["nvmesh-csi.excelero.com", /would mount the whole store/],
  ] as const) {
    const acquired: string[] = [];
    const d = deps({
      followerProfile: storeOf(provisioner),
      tryAcquire: (hash) => (acquired.push(hash), Promise.resolve({ role: "leader", leaseUid: "l" })),
    });
    const first = await decide(review(gpuPod()), d);
    const second = await decide(review(gpuPod()), d);
    for (const x of [first, second]) {
      assert.equal(x.role, "cold", provisioner);
      assert.match(x.reason, reason);
      assert.equal(x.pod?.spec?.schedulingGates, undefined, "not gated");
    }
    assert.deepEqual(acquired, [], `${provisioner}: no Lease taken`);
  }
  // A shared volume whose profile narrows each PV to the tree's folder is elected as before.
  const elected = await decide(
    review(gpuPod()),
    deps({
      followerProfile: storeOf("nfs.csi.k8s.io"),
      tryAcquire: () => Promise.resolve({ role: "leader", leaseUid: "l" }),
    }),
  );
  assert.equal(elected.role, "leader");
});

// SPEC 1.3 "Groups and gangs: never deadlock": a follower something waits for is never gated.
const follower = (extra: Partial<ClusterView> = {}): Partial<ClusterView> => ({
  tryAcquire: () => Promise.resolve({ role: "follower" }),
  ...extra,
});
const gated = (p: V1Pod | undefined): boolean =>
  (p?.spec?.schedulingGates ?? []).some((g) => g.name === "warmstart.dev/cache-ready");

test("a plain follower on the default scheduler is gated; a gang member waits running, even under followerMode=gate", async () => {
  const plain = await decide(review(gpuPod()), deps(follower()));
  assert.equal(plain.role, "follower");
  assert.ok(gated(plain.pod), "gated: nothing waits for it");
  assert.equal(plain.pod?.metadata?.labels?.["warmstart.dev/gated"], "true");
  assert.match(plain.reason, /gated: nothing waits for it/);

  const member = gpuPod();
  (member.spec as unknown as Record<string, unknown>).workloadRef = { name: "engines", podGroup: "all" };
  for (const mode of ["auto", "gate", "wait"]) {
    const d = await decide(review(member), deps(follower(), { followerMode: mode }));
    assert.equal(d.role, "follower", mode);
    assert.ok(!gated(d.pod), `${mode}: a gang member is never gated`);
    assert.equal(d.pod?.metadata?.labels?.["warmstart.dev/waiting"], "true");
    assert.equal(d.pod?.metadata?.labels?.["warmstart.dev/gated"], undefined);
    assert.equal(d.pod?.metadata?.annotations?.["warmstart.dev/gang"], "workload/engines/all");
    if (mode === "gate") assert.match(d.reason, /refused for gang members/);
  }
});

test("a waiting follower mounts nothing that can keep it Pending, and stops waiting at its deadline", async () => {
  const before = Date.now();
  const d = await decide(review(gpuPod()), deps(follower(), { followerMode: "wait", waitDeadline: "7m" }));
  const spec = d.pod!.spec!;
  assert.ok(!spec.volumes?.some((v) => v.persistentVolumeClaim), "no claim (rox-<short> does not exist yet)");
  assert.ok(spec.volumes?.some((v) => v.name === "warmstart-fill" && v.emptyDir?.sizeLimit));
  const until = Date.parse(d.pod!.metadata!.annotations!["warmstart.dev/wait-until"]!);
  assert.ok(
    until >= before + 7 * 60_000 && until <= Date.now() + 7 * 60_000,
    "admission time plus the wait deadline",
  );
  const seed = spec.initContainers?.find((c) => c.name === "warmstart-seed-cache");
  assert.deepEqual(
    seed?.args?.slice(seed.args.indexOf("--fill-until"), seed.args.indexOf("--fill-until") + 2),
    ["--fill-until", new Date(until).toISOString()],
  );
  assert.ok(
    [...(spec.initContainers ?? []), ...spec.containers].every((c) =>
      (c.volumeMounts ?? []).every((m) => m.name !== "warmstart-fill" || m.readOnly === true),
    ),
    "every container mounts the fill volume read-only",
  );
});

test("a pod's own container that names the fill volume gets it read-only (only the agent writes it)", async () => {
  const pod = gpuPod();
  pod.spec!.containers.push({
    name: "sneaky",
    image: "busybox",
    volumeMounts: [{ name: "warmstart-fill", mountPath: "/x" }],
  });
  const d = await decide(review(pod), deps(follower(), { followerMode: "wait" }));
  const sneaky = d.pod!.spec!.containers.find((c) => c.name === "sneaky")!;
  assert.equal(sneaky.volumeMounts?.[0]?.readOnly, true);
});

const lwsRank = (rank: number): V1Pod => {
  const p = gpuPod();
  p.metadata!.labels = {
    "leaderworkerset.sigs.k8s.io/name": "sglang",
    "apps.kubernetes.io/pod-index": String(rank),
    "leaderworkerset.sigs.k8s.io/group-index": "0",
  };
  p.metadata!.annotations = {
    "leaderworkerset.sigs.k8s.io/size": "2",
    ...(rank > 0 ? { "leaderworkerset.sigs.k8s.io/leader-name": "sglang-0" } : {}),
  };
  return p;
};

test("ranks of one group hash apart, and a rank the pod cannot tell apart never follows its own group", async () => {
  const groups: string[] = [];
  const a = await decide(
    review(lwsRank(0)),
    deps({
      tryAcquire: (_h, _e, _n, g) => (
        groups.push(g ?? ""),
        Promise.resolve({ role: "leader", leaseUid: "x" })
      ),
    }),
  );
  const b = await decide(review(lwsRank(1)), deps({}));
  assert.notEqual(a.hash, b.hash, "rank 0 and rank 1 are two caches");
  assert.deepEqual(groups, ["ns/lws/sglang/0"], "the Lease records the leader's group");
  assert.equal(a.pod?.metadata?.annotations?.["warmstart.dev/rank"], "0");

  // Two Ray workers of one cluster hash equal: the second is never the first's follower.
  const ray = (): V1Pod => {
    const p = gpuPod();
    p.metadata!.labels = { "ray.io/cluster": "c", "ray.io/node-type": "worker", "ray.io/group": "g" };
    return p;
  };
  const same = await decide(
    review(ray()),
    deps(follower({ tryAcquire: () => Promise.resolve({ role: "follower", leaderGroup: "ns/ray/c" }) })),
  );
  assert.equal(same.role, "cold");
  assert.match(same.reason, /another rank of its own group \(ray c\)/);
  const other = await decide(
    review(ray()),
    deps(follower({ tryAcquire: () => Promise.resolve({ role: "follower", leaderGroup: "ns/ray/other" }) })),
  );
  assert.equal(other.role, "follower", "a rank of another group follows");
  assert.ok(!gated(other.pod), "and waits running");
});

test("a pod that names none of the init image's pull secrets starts cold instead of stuck on its init containers", async () => {
  const ready: ModelCacheObject = {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: "0123456789abcdef" },
    spec: { hash: "0123456789abcdef".repeat(4) },
    status: { phase: "Ready" },
  };
  const flags = { imagePullSecrets: "regcred,mirror" };
  const claims: string[] = [];
  const restoring = {
    getModelCache: () => Promise.resolve(ready),
    ensureClaim: (_c: ModelCacheObject, ns: string) => (claims.push(ns), Promise.resolve()),
  };
  const following = { tryAcquire: () => Promise.resolve({ role: "follower" as const }) };

  for (const cluster of [restoring, following]) {
    const d = await decide(review(gpuPod()), deps(cluster, flags));
    assert.equal(d.role, "cold");
    assert.equal(
      d.reason,
      "init image may not be pullable: it needs pull secret regcred or mirror, which the pod does not name (itself or through its ServiceAccount)",
    );
    assert.equal(d.pod?.metadata?.annotations?.[ANN_REASON], d.reason);
    assert.equal(d.pod?.spec?.initContainers, undefined, "no init container that cannot be pulled");
    assert.equal(d.pod?.spec?.imagePullSecrets, undefined, "no Secret named that may not be there");
  }
  assert.deepEqual(claims, [], "no claim made for a restore that does not happen");

  // One of them, named by the pod or merged in from its ServiceAccount: restored as usual.
  const named = gpuPod();
  named.spec!.imagePullSecrets = [{ name: "mirror" }];
  for (const cluster of [restoring, following]) {
    const d = await decide(review(named), deps(cluster, flags));
    assert.ok(d.role === "restore" || d.role === "follower", d.reason);
    assert.deepEqual(d.pod?.spec?.imagePullSecrets, [{ name: "mirror" }]);
    assert.ok(d.pod?.spec?.initContainers?.length);
  }
  // A leader runs no init container of ours: it leads wherever it is.
  assert.equal((await decide(review(gpuPod()), deps({}, flags))).role, "leader");
  // No pull secret configured: the image is pullable without one.
  assert.equal((await decide(review(gpuPod()), deps(restoring))).role, "restore");

  // The Event says it.
  const d = deps(following, flags);
  await admissionHandler(d)(review(gpuPod()));
  assert.match(d.events[0]?.message ?? "", /^cold: init image may not be pullable: .*regcred or mirror/);
});

/** A pod whose only GPU is a DRA claim, under the names given. */
const draPod = (claim: string, template: string): V1Pod => {
  const pod = gpuPod();
  pod.spec!.containers[0]!.resources = { claims: [{ name: claim }] };
  pod.spec!.resourceClaims = [{ name: claim, resourceClaimTemplateName: template }];
  return pod;
};

test("a DRA claim is a GPU by the device classes the cluster says it asks for, never by its names", async () => {
  const asked: string[] = [];
  const cluster: Partial<ClusterView> = {
    claimGpuClasses: (namespace, refs) => {
      asked.push(...refs.map((r) => `${namespace}/${r.template}`));
      // The template "compute" asks for NVIDIA's GPU class; "gpu" for the example driver's.
      return Promise.resolve(
        new Map(
          refs.map((r) => [`template/${r.template}`, r.template === "compute" ? ["gpu.nvidia.com"] : []]),
        ),
      );
    },
  };
  const neutral = await decide(review(draPod("accel", "compute")), deps(cluster));
  assert.equal(neutral.role, "leader", neutral.reason);
  const spoof = await decide(review(draPod("gpu", "gpu")), deps(cluster));
  assert.deepEqual([spoof.role, spoof.reason], ["pass", "no GPU requested"]);
  assert.equal(spoof.admissionId, undefined, "no Event: not a GPU pod");
  assert.deepEqual(asked, ["ns/compute", "ns/gpu"]);

  // Without the cluster's answer (`warmstart explain`, offline) the names decide.
  assert.equal((await decide(review(draPod("gpu", "gpu")), deps({}))).role, "leader");
});

test("a DRA lookup that fails admits the pod as written, with a warning and an Event saying why", async () => {
  const d = deps({
    claimGpuClasses: () => Promise.reject(new Error("reading ResourceClaimTemplate ns/t: 503")),
  });
  const pod = draPod("accel", "compute");
  const res = await admissionHandler(d)(review(pod));
  assert.equal(res.allowed, true);
  assert.deepEqual(admitted(pod, res).spec, pod.spec);
  assert.match(res.warnings?.[0] ?? "", /ResourceClaimTemplate ns\/t: 503/);
  assert.equal(d.events[0]?.reason, "WarmstartFailOpen");
});
