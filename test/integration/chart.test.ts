/**
 * The Helm chart (deploy/helm/warmstart): `helm lint`, `helm template` with the SPEC 0 values, and
 * every rendered object applied as a server-side dry run against the real API server (schemas,
 * CEL of the admission policy, RBAC references), plus the pieces that must match the code: the
 * webhook configuration as src/webhook/registration.ts writes it, and the CRD as deploy/crds has it.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { parse as parseYaml } from "yaml";
import { kube, tempNamespace } from "../harness.js";
import { CHART, objectName, renderChart, runHelm } from "../chart.js";
import { webhookConfiguration } from "../../src/webhook/registration.js";
import { PACKAGE_ROOT } from "../../tools/localcluster/versions.js";

const EVERYTHING = {
  "clusterAgent.enabled": true,
  "clusterAgent.clusterId": "c1",
  "controlPlane.enabled": true,
  "snapshots.enabled": true,
  "uninstall.deleteData": true,
  "webhook.clientAuth.caBundle": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
  "webhook.clientAuth.names": ["kube-apiserver-webhook-client"],
  "clusterAgent.controlPlaneCaBundle": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
  "nodeAgent.store.budget": "500Gi",
  storageProfiles: { "nfs.csi.k8s.io": { backend: "shared-volume", prewarm: false } },
};

const find = <T extends k8s.KubernetesObject>(objs: k8s.KubernetesObject[], kind: string, suffix = ""): T => {
  const o = objs.find((x) => x.kind === kind && (x.metadata?.name ?? "").endsWith(suffix));
  assert.ok(o, `${kind} *${suffix} rendered`);
  return o as T;
};

const args = (objs: k8s.KubernetesObject[], suffix: string): string[] =>
  find<k8s.V1Deployment>(objs, "Deployment", suffix).spec!.template.spec!.containers[0]!.args ?? [];

void test("helm lint passes with the default values and with every feature on", async () => {
  const flags = Object.entries(EVERYTHING).flatMap(([k, v]) =>
    typeof v === "string" ? ["--set-string", `${k}=${v}`] : ["--set-json", `${k}=${JSON.stringify(v)}`],
  );
  for (const extra of [[], flags]) {
    const { stdout } = await runHelm(["lint", "--strict", CHART, ...extra]);
    assert.match(stdout, /1 chart\(s\) linted, 0 chart\(s\) failed/);
  }
  // The values schema refuses what the roles would refuse at boot.
  await assert.rejects(runHelm(["template", CHART, "--set", "sharing.scope=everyone"]), /sharing\/scope/);
  await assert.rejects(runHelm(["template", CHART, "--set", "election.deadline=soon"]), /election\/deadline/);
});

void test("helm template: SPEC 0 values reach the webhook (election off, 60m, namespace scope by default)", async () => {
  const defaults = await renderChart();
  const hook = args(defaults, "-webhook");
  for (const a of [
    "--election-enabled=false",
    "--election-deadline=60m",
    "--sharing-scope=namespace",
    "--init-cpu-request=50m",
    "--init-memory-request=64Mi",
  ])
    assert.ok(hook.includes(a), `default ${a}`);
  assert.ok(!hook.some((a) => a.startsWith("--init-memory-limit")), "no memory limit on prewarm by default");
  assert.ok(!hook.some((a) => a.startsWith("--image-pull-secret")));
  const pulled = args(await renderChart({ imagePullSecrets: [{ name: "a" }, { name: "b" }] }), "-webhook");
  assert.ok(pulled.includes("--image-pull-secret=a,b"), "the release's pull secrets reach decorated pods");
  const set = await renderChart({
    "election.enabled": true,
    "election.deadline": "15m",
    "sharing.scope": "group",
  });
  const hook2 = args(set, "-webhook");
  for (const a of ["--election-enabled=true", "--election-deadline=15m", "--sharing-scope=group"])
    assert.ok(hook2.includes(a), `set ${a}`);
  // The init containers run the same image as the roles.
  const image = find<k8s.V1Deployment>(defaults, "Deployment", "-webhook").spec!.template.spec!.containers[0]!
    .image;
  assert.ok(hook.includes(`--image=${image}`));
  // Off by default: the cluster agent, the control plane, the uninstall hook.
  for (const kind of ["Job", "PersistentVolumeClaim"])
    assert.ok(!defaults.some((o) => o.kind === kind), `no ${kind}`);
  assert.ok(!defaults.some((o) => o.metadata?.name?.endsWith("-cluster-agent")), "no cluster agent");
});

void test("the cluster agent is a Recreate singleton probed on /version, /livez and /healthz", async () => {
  const objs = await renderChart(EVERYTHING);
  const d = find<k8s.V1Deployment>(objs, "Deployment", "-cluster-agent");
  assert.equal(d.spec?.replicas, 1);
  assert.equal(d.spec?.strategy?.type, "Recreate");
  const c = d.spec.template.spec!.containers[0]!;
  assert.equal(c.startupProbe?.httpGet?.path, "/version");
  assert.equal(c.livenessProbe?.httpGet?.path, "/livez");
  assert.equal(c.readinessProbe?.httpGet?.path, "/healthz");
  // The control plane keeps its database on a claim that outlives the release.
  const pvc = find<k8s.V1PersistentVolumeClaim>(objs, "PersistentVolumeClaim", "-control-plane");
  assert.equal(pvc.metadata?.annotations?.["helm.sh/resource-policy"], "keep");
  // Every pod but the node agent runs as non-root on a read-only root file system.
  for (const o of objs.filter((x) => x.kind === "Deployment" || x.kind === "DaemonSet" || x.kind === "Job")) {
    const spec = (o as k8s.V1Deployment).spec!.template.spec!;
    for (const ct of spec.containers) {
      assert.equal(ct.securityContext?.readOnlyRootFilesystem, true, `${objectName(o)}: read-only root`);
      assert.equal(ct.securityContext?.allowPrivilegeEscalation, false, `${objectName(o)}: no escalation`);
      assert.deepEqual(
        ct.securityContext?.capabilities?.drop,
        ["ALL"],
        `${objectName(o)}: capabilities dropped`,
      );
      if (o.kind !== "DaemonSet")
        assert.equal(ct.securityContext?.runAsNonRoot, true, `${objectName(o)}: non-root`);
    }
  }
});

void test("the webhook configuration is the one src/webhook/registration.ts registers, behind the chart's Service", async () => {
  const objs = await renderChart({}, { namespace: "ws-ns" });
  const mwc = find<k8s.V1MutatingWebhookConfiguration>(objs, "MutatingWebhookConfiguration");
  const fromCode = webhookConfiguration({
    name: mwc.metadata!.name!,
    service: { namespace: "ws-ns", name: "warmstart-webhook", port: 443 },
    caBundle: "x",
    timeoutSeconds: 5,
  });
  const strip = (w: k8s.V1MutatingWebhook): k8s.V1MutatingWebhook => ({
    ...w,
    clientConfig: { ...w.clientConfig, caBundle: undefined },
  });
  assert.deepEqual(strip(mwc.webhooks![0]!), strip(fromCode.webhooks![0]!));
  // Its CA bundle is the CA of the certificate the webhook serves.
  const secret = find<k8s.V1Secret>(objs, "Secret", "-webhook-tls");
  assert.equal(mwc.webhooks![0]!.clientConfig.caBundle, secret.data!["ca.crt"]);

  // With cert-manager served, the certificate is its and the bundle is injected.
  const cm = await renderChart({}, { extra: ["--api-versions", "cert-manager.io/v1"] });
  const cmWebhook = find<k8s.V1MutatingWebhookConfiguration>(cm, "MutatingWebhookConfiguration");
  assert.equal(
    cmWebhook.metadata?.annotations?.["cert-manager.io/inject-ca-from"],
    "warmstart-system/warmstart-webhook",
  );
  assert.equal(cmWebhook.webhooks![0]!.clientConfig.caBundle, undefined);
  find(cm, "Certificate", "-webhook");
  assert.ok(!cm.some((o) => o.kind === "Secret" && o.metadata?.name?.endsWith("-webhook-tls")));
});

void test("the chart's CRD is deploy/crds/modelcache.yaml, kept on uninstall unless asked", async () => {
  const source = parseYaml(
    await readFile(join(PACKAGE_ROOT, "deploy/crds/modelcache.yaml"), "utf8"),
  ) as k8s.V1CustomResourceDefinition;
  const kept = find<k8s.V1CustomResourceDefinition>(await renderChart(), "CustomResourceDefinition");
  assert.deepEqual(kept.spec, source.spec);
  assert.equal(kept.metadata?.annotations?.["helm.sh/resource-policy"], "keep");
  const removed = find<k8s.V1CustomResourceDefinition>(
    await renderChart({ "crds.keep": false }),
    "CustomResourceDefinition",
  );
  assert.equal(removed.metadata?.annotations?.["helm.sh/resource-policy"], undefined);
});

void test("the stamps policy is deploy/policies/stamps.yaml, exempting only the release controller", async () => {
  const text = await readFile(join(PACKAGE_ROOT, "deploy/policies/stamps.yaml"), "utf8");
  const [source] = text.split("\n---\n").map((d) => parseYaml(d) as k8s.V1ValidatingAdmissionPolicy);
  const objs = await renderChart({}, { namespace: "ws-ns" });
  const policy = find<k8s.V1ValidatingAdmissionPolicy>(objs, "ValidatingAdmissionPolicy", "-stamps");
  const { matchConditions, validations, ...rest } = policy.spec!;
  const { matchConditions: _m, validations: sourceValidations, ...sourceRest } = source!.spec!;
  assert.deepEqual(rest, sourceRest);
  assert.deepEqual(validations!.slice(0, -1), sourceValidations, "the same rules, then the gate's");
  assert.match(validations!.at(-1)!.expression, /warmstart\.dev\/cache-ready/);
  assert.deepEqual(matchConditions, [
    {
      name: "not-warmstart",
      expression: "request.userInfo.username != 'system:serviceaccount:ws-ns:warmstart-server'",
    },
  ]);
  const binding = find<k8s.V1ValidatingAdmissionPolicyBinding>(
    objs,
    "ValidatingAdmissionPolicyBinding",
    "-stamps",
  );
  assert.equal(binding.spec?.policyName, policy.metadata?.name);
  assert.deepEqual(binding.spec?.validationActions, ["Deny"]);
});

void test("every rendered object passes a server-side dry run against the real API server", async (t) => {
  const { kc } = await kube();
  const ns = await tempNamespace(t, "chart");
  const objs = await renderChart(
    { ...EVERYTHING, "clusterAgent.namespaces": [ns] },
    { namespace: ns, release: "dry" },
  );
  assert.ok(objs.length >= 40, `rendered ${objs.length} objects`);
  const client = k8s.KubernetesObjectApi.makeApiClient(kc);
  const failures: string[] = [];
  for (const o of objs) {
    try {
      await client.patch(
        o,
        undefined,
        "All",
        "warmstart-chart-test",
        true,
        k8s.PatchStrategy.ServerSideApply,
      );
    } catch (err) {
      const body = (err as { body?: string }).body ?? String(err);
      failures.push(`${objectName(o)}: ${body.slice(0, 400)}`);
    }
  }
  assert.deepEqual(failures, []);
});

void test("safe defaults: the admission port is closed when the API server's addresses are unknown; client names are required", async () => {
  // `helm template` cannot look anything up: the addresses are unknown.
  const offline = find<k8s.V1NetworkPolicy>(await renderChart(), "NetworkPolicy", "-webhook");
  assert.deepEqual(offline.spec?.ingress, [], "no rule: nobody reaches the port");
  assert.deepEqual(offline.spec?.policyTypes, ["Ingress"]);
  const known = find<k8s.V1NetworkPolicy>(
    await renderChart({ "webhook.networkPolicy.apiServerCIDRs": ["10.0.0.1/32"] }),
    "NetworkPolicy",
    "-webhook",
  );
  const rule = known.spec?.ingress?.[0] as { from?: unknown } | undefined;
  assert.deepEqual(rule?.from, [{ ipBlock: { cidr: "10.0.0.1/32" } }]);
  await assert.rejects(
    renderChart({ "webhook.clientAuth.caBundle": EVERYTHING["webhook.clientAuth.caBundle"] }),
    /webhook.clientAuth.names/,
  );
});

void test("stores: a shared store claim or a volume per tree, never both; a volume per tree gives the node agent its image and pull secrets", async () => {
  const agent = (objs: k8s.KubernetesObject[]): string[] =>
    find<k8s.V1DaemonSet>(objs, "DaemonSet").spec!.template.spec!.containers[0]!.args ?? [];
  assert.ok(
    !agent(await renderChart()).some((a) => /^--(tree-volume-class|image)=/.test(a)),
    "none by default",
  );
  const trees = await renderChart({
    "nodeAgent.store.treeVolumeClass": "hyperdisk-ml",
    "snapshots.enabled": true,
    imagePullSecrets: [{ name: "reg" }],
  });
  const a = agent(trees);
  assert.ok(a.includes("--tree-volume-class=hyperdisk-ml"));
  assert.ok(
    a.some(
      (x) =>
        x.startsWith("--image=") &&
        x.endsWith(find<k8s.V1DaemonSet>(trees, "DaemonSet").spec!.template.spec!.containers[0]!.image!),
    ),
  );
  assert.ok(a.includes("--image-pull-secret=reg"));
  await assert.rejects(
    renderChart({ "nodeAgent.store.treeVolumeClass": "hyperdisk-ml", "nodeAgent.store.claim": "store" }),
    /claim .* or treeVolumeClass .* not both/,
  );
});
