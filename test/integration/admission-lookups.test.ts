/**
 * What admission reads of the workload's namespace, against the real API server: the DRA claims
 * and DeviceClasses that decide whether a pod asks for a GPU, and the pull secrets a pod names for
 * Warmstart's init image. Each test runs a webhook of its own in this process (the cluster's
 * runs the image built at cluster start) and posts reviews to it.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { request } from "node:https";
import * as k8s from "@kubernetes/client-node";
import jsonpatch from "fast-json-patch";
import { pino } from "pino";
import { cleanupHash, impersonatingConfig, kube, tempNamespace, uniqueName, waitFor } from "../harness.js";
import { renderChart } from "../chart.js";
import { ANN_REASON, ANN_ROLE, INIT_SEED, shortHash, ANN_HASH } from "../../src/core/contract.js";
import { runWebhook, type RunningWebhook } from "../../src/webhook/run.js";
import { loadWebhookConfig } from "../../src/webhook/config.js";
import { draApi } from "../../src/webhook/lookups.js";

const silent = pino({ level: "silent" });

interface Answer {
  pod: k8s.V1Pod;
  warnings: string[];
}

/** Posts a pod creation in `namespace` to an in-process webhook; the pod as the API server would store it. */
function admit(hook: RunningWebhook, namespace: string, pod: k8s.V1Pod): Promise<Answer> {
  const review = {
    apiVersion: "admission.k8s.io/v1",
    kind: "AdmissionReview",
    request: {
      uid: uniqueName("u"),
      operation: "CREATE",
      namespace,
      resource: { group: "", version: "v1", resource: "pods" },
      object: pod,
    },
  };
  return new Promise((resolve, reject) => {
    const r = request(
      `${hook.url}/mutate`,
      { method: "POST", rejectUnauthorized: false, headers: { "content-type": "application/json" } },
      (res) => {
        let text = "";
        res.on("data", (d: Buffer) => (text += d.toString()));
        res.on("end", () => {
          try {
            const answer = (JSON.parse(text) as { response: { patch?: string; warnings?: string[] } })
              .response;
            const ops = answer.patch
              ? (JSON.parse(Buffer.from(answer.patch, "base64").toString()) as jsonpatch.Operation[])
              : [];
            resolve({
              pod: jsonpatch.applyPatch(structuredClone(pod), ops, true, false).newDocument,
              warnings: answer.warnings ?? [],
            });
          } catch (err) {
            reject(new Error(`webhook answered ${res.statusCode}: ${text}`, { cause: err }));
          }
        });
      },
    );
    r.on("error", reject);
    r.end(JSON.stringify(review));
  });
}

const role = (p: k8s.V1Pod): string | undefined => p.metadata?.annotations?.[ANN_ROLE];

/** A vLLM pod whose only GPU would be the DRA claim `claim` (a template's, or a shared claim). */
function draPod(model: string, claim: string, from: { template: string } | { claim: string }): k8s.V1Pod {
  return {
    metadata: { name: "w" },
    spec: {
      containers: [
        {
          name: "vllm",
          image: "vllm/vllm-openai:v0.6.3",
          args: ["--model", model],
          resources: { claims: [{ name: claim }] },
        },
      ],
      resourceClaims: [
        {
          name: claim,
          ...("template" in from
            ? { resourceClaimTemplateName: from.template }
            : { resourceClaimName: from.claim }),
        },
      ],
    },
  };
}

/**
 * A user with exactly the chart's webhook ClusterRole (rendered from the chart in this tree),
 * for the test's length: its reads of the cluster are what the release grants.
 */
async function asChartWebhook(t: { after: (fn: () => Promise<void>) => void }): Promise<k8s.KubeConfig> {
  const { kc } = await kube();
  const rbac = kc.makeApiClient(k8s.RbacAuthorizationV1Api);
  const shipped = (await renderChart()).find(
    (o) => o.kind === "ClusterRole" && o.metadata?.name === "warmstart-webhook",
  ) as k8s.V1ClusterRole;
  const name = uniqueName("chart-webhook");
  await rbac.createClusterRole({ body: { metadata: { name }, rules: shipped.rules } });
  t.after(() => rbac.deleteClusterRole({ name }).then(() => undefined));
  await rbac.createClusterRoleBinding({
    body: {
      metadata: { name },
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name },
      subjects: [{ apiGroup: "rbac.authorization.k8s.io", kind: "User", name }],
    },
  });
  t.after(() => rbac.deleteClusterRoleBinding({ name }).then(() => undefined));
  return impersonatingConfig(kc, name);
}

test("DRA: a claim is a GPU by the DeviceClass its template or claim asks for, never by its names", async (t) => {
  const ns = await tempNamespace(t, "dra");
  const { kc } = await kube();
  const resource = kc.makeApiClient(k8s.ResourceV1Api);
  const id = uniqueName("ws");
  // A cluster's own name for NVIDIA GPUs (its selector names the driver, as NVIDIA's classes do),
  // and a simulated driver's class, as the DRA example driver installs it.
  const a100 = `${id}-a100`;
  const simulated = `gpu.${id}.example.com`;
  const classes: Array<[string, string]> = [
    [a100, "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"],
    [simulated, "device.driver == 'gpu.example.com'"],
  ];
  for (const [name, expression] of classes) {
    await resource.createDeviceClass({
      body: { metadata: { name }, spec: { selectors: [{ cel: { expression } }] } },
    });
    t.after(() => resource.deleteDeviceClass({ name }).then(() => undefined));
  }
  const spec = (deviceClassName: string): k8s.V1ResourceClaimSpec => ({
    devices: { requests: [{ name: "r", exactly: { deviceClassName } }] },
  });
  await resource.createNamespacedResourceClaimTemplate({
    namespace: ns,
    body: { metadata: { name: "compute" }, spec: { spec: spec(a100) } },
  });
  await resource.createNamespacedResourceClaimTemplate({
    namespace: ns,
    body: { metadata: { name: "single-gpu" }, spec: { spec: spec(simulated) } },
  });
  await resource.createNamespacedResourceClaim({
    namespace: ns,
    body: { metadata: { name: "pool" }, spec: spec(a100) },
  });

  // Election off: a GPU pod that downloads is stamped cold, with nothing left in the cluster.
  const hook = await runWebhook(loadWebhookConfig({ host: "127.0.0.1", port: 0 }, {}), {
    kubeConfig: await asChartWebhook(t),
    log: silent,
  });
  t.after(() => hook.stop());
  const model = `org/dra-${ns}`;

  const neutral = await admit(hook, ns, draPod(model, "accel", { template: "compute" }));
  assert.deepEqual(neutral.warnings, []);
  assert.equal(role(neutral.pod), "cold", "NVIDIA's GPU behind names that say nothing of one");
  assert.equal(neutral.pod.metadata?.annotations?.[ANN_REASON], "election disabled");
  const shared = await admit(hook, ns, draPod(model, "accel", { claim: "pool" }));
  assert.equal(role(shared.pod), "cold", "a shared ResourceClaim of the class");

  for (const [why, pod] of [
    ["a claim named gpu of the simulated driver's class", draPod(model, "gpu", { template: "single-gpu" })],
    [
      "a claim named gpu of a template that does not exist",
      draPod(model, "gpu", { template: "no-such-gpu" }),
    ],
    ["another namespace's template", draPod(model, "gpu", { template: "compute" })],
  ] as const) {
    const ans = await admit(hook, why.startsWith("another") ? "default" : ns, pod);
    assert.deepEqual(ans.warnings, [], why);
    assert.equal(role(ans.pod), undefined, why);
    assert.deepEqual(ans.pod, pod, `${why}: admitted as written, not a GPU pod`);
  }
});

test("DRA: the API versions the cluster serves are found, and a webhook that may not read claims admits the pod as written", async (t) => {
  const ns = await tempNamespace(t, "dra-ro");
  const { kc } = await kube();
  const v1 = kc.makeApiClient(k8s.ResourceV1Api);
  const v1beta1 = kc.makeApiClient(k8s.ResourceV1beta1Api);
  await v1.createNamespacedResourceClaimTemplate({
    namespace: ns,
    body: {
      metadata: { name: "t" },
      spec: {
        spec: { devices: { requests: [{ name: "r", exactly: { deviceClassName: "gpu.nvidia.com" } }] } },
      },
    },
  });
  // This cluster serves v1 alone: v1beta1's 404 (a Status that names no object) moves on to the
  // next version, and v1's 404 that names the object is an object that is not there.
  const unservedFirst = draApi(
    v1beta1 as unknown as k8s.ResourceV1Api,
    v1 as unknown as k8s.ResourceV1beta1Api,
  );
  const read = (await unservedFirst.readClaimTemplate(ns, "t")) as k8s.V1ResourceClaimTemplate;
  assert.equal(read.spec.spec.devices?.requests?.[0]?.exactly?.deviceClassName, "gpu.nvidia.com");
  assert.equal(await unservedFirst.readClaimTemplate(ns, "missing"), undefined);
  const noDra = draApi(v1beta1 as unknown as k8s.ResourceV1Api, v1beta1);
  assert.equal(await noDra.readClaim(ns, "t"), undefined, "no DRA served: no claim");
  assert.deepEqual(await noDra.listDeviceClasses(), []);

  // A user with no rights at all: its reads of the claim and the DeviceClasses are refused, and
  // the pod is admitted as written.
  const hook = await runWebhook(loadWebhookConfig({ host: "127.0.0.1", port: 0 }, {}), {
    kubeConfig: impersonatingConfig(kc, uniqueName("nobody")),
    log: silent,
  });
  t.after(() => hook.stop());
  const pod = draPod(`org/dra-${ns}`, "accel", { template: "t" });
  const ans = await admit(hook, ns, pod);
  assert.match(
    ans.warnings[0] ?? "",
    /admitted without a cache decision: reading (ResourceClaimTemplate|DeviceClasses).*403/,
  );
  assert.equal(role(ans.pod), undefined);
  assert.deepEqual(ans.pod.spec, pod.spec);
});

test("pull secrets: a pod restores only where it names the init image's pull secret, itself or through its ServiceAccount; no Secret is copied", async (t) => {
  const ns = await tempNamespace(t, "pull");
  const { kc, core } = await kube();
  // The ServiceAccount admission plugin gives a pod that names no pull secret its
  // ServiceAccount's, before any webhook sees it: a dry run shows what the webhook is sent.
  await core.createNamespacedServiceAccount({
    namespace: ns,
    body: { metadata: { name: "puller" }, imagePullSecrets: [{ name: "regcred" }] },
  });
  const sent = await waitFor("the ServiceAccount's pull secret on a pod", async () => {
    const dry = await core
      .createNamespacedPod({
        namespace: ns,
        dryRun: "All",
        body: {
          metadata: { name: "probe" },
          spec: { serviceAccountName: "puller", containers: [{ name: "c", image: "busybox" }] },
        },
      })
      .catch(() => undefined);
    return dry?.spec?.imagePullSecrets?.length ? dry.spec.imagePullSecrets : undefined;
  });
  assert.deepEqual(
    sent.map((s) => s.name),
    ["regcred"],
  );

  const hook = await runWebhook(
    loadWebhookConfig(
      { host: "127.0.0.1", port: 0, electionEnabled: "true", imagePullSecrets: "regcred" },
      {},
    ),
    { kubeConfig: kc, log: silent },
  );
  t.after(() => hook.stop());
  const pod = (imagePullSecrets?: k8s.V1LocalObjectReference[]): k8s.V1Pod => ({
    metadata: { name: "w" },
    spec: {
      containers: [
        {
          name: "vllm",
          image: "vllm/vllm-openai:v0.6.3",
          args: ["--model", `org/pull-${ns}`],
          resources: { limits: { "nvidia.com/gpu": "1" } },
        },
      ],
      ...(imagePullSecrets ? { imagePullSecrets } : {}),
    },
  });
  const leader = await admit(hook, ns, pod());
  assert.equal(role(leader.pod), "leader", "a leader runs no init container of ours");
  await cleanupHash(t, shortHash(leader.pod.metadata!.annotations![ANN_HASH]!));

  const bare = await admit(hook, ns, pod());
  assert.equal(role(bare.pod), "cold");
  assert.match(
    bare.pod.metadata!.annotations![ANN_REASON]!,
    /init image may not be pullable: it needs pull secret regcred/,
  );
  assert.equal(bare.pod.spec?.initContainers, undefined);
  assert.equal(bare.pod.spec?.imagePullSecrets, undefined, "no Secret named that the namespace may lack");

  const viaAccount = await admit(hook, ns, pod(sent.map((s) => ({ name: s.name }))));
  assert.equal(role(viaAccount.pod), "follower");
  assert.ok(viaAccount.pod.spec?.initContainers?.some((c) => c.name === INIT_SEED));
  assert.deepEqual(viaAccount.pod.spec?.imagePullSecrets, [{ name: "regcred" }]);

  const secrets = await core.listNamespacedSecret({ namespace: ns });
  assert.deepEqual(
    secrets.items.map((s) => s.metadata?.name).filter((n) => n === "regcred"),
    [],
    "no Secret copied into the workload's namespace",
  );
});
