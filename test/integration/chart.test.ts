/**
 * The Helm chart (deploy/helm/warmstart): `helm lint`, `helm template` with the SPEC 0 values, and
 * every rendered object applied as a server-side dry run against the real API server (schemas,
 * CEL of the admission policy, RBAC references), plus the pieces that must match the code: the
 * webhook configuration as src/webhook/registration.ts writes it, and the CRD as deploy/crds has it.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { createPrivateKey, X509Certificate } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { parse as parseYaml } from "yaml";
import { kube, tempNamespace } from "../harness.js";
import { CHART, objectName, renderChart, runHelm } from "../chart.js";
import { recordsWebhookConfiguration, webhookConfiguration } from "../../src/webhook/registration.js";
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
  // Every pod but the node agent runs as non-root on a read-only root file system; the node agent
  // is a CSI node plugin by default (the store driver), privileged for its mounts to reach the host.
  const plugin = find<k8s.V1DaemonSet>(objs, "DaemonSet", "-node-agent").spec!.template.spec!.containers[0]!;
  assert.equal(plugin.securityContext?.privileged, true, "the store driver's node plugin");
  assert.equal(plugin.securityContext?.readOnlyRootFilesystem, true, "node agent: read-only root");
  const others = objs.filter((x) => x.kind === "Deployment" || x.kind === "Job");
  const withoutDriver = await renderChart({ "nodeAgent.storeDriver.enabled": false });
  for (const o of [...others, ...withoutDriver.filter((x) => x.kind === "DaemonSet")]) {
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
  // The records review likewise, for the chart's node agents' account.
  const vwc = find<k8s.V1ValidatingWebhookConfiguration>(objs, "ValidatingWebhookConfiguration", "-records");
  const recordsFromCode = recordsWebhookConfiguration({
    name: vwc.metadata!.name!,
    service: { namespace: "ws-ns", name: "warmstart-webhook", port: 443 },
    caBundle: "x",
    timeoutSeconds: 5,
    nodeAgentUser: "system:serviceaccount:ws-ns:warmstart-node-agent",
  });
  assert.deepEqual(
    { ...vwc.webhooks![0]!, clientConfig: { ...vwc.webhooks![0]!.clientConfig, caBundle: undefined } },
    {
      ...recordsFromCode.webhooks![0]!,
      clientConfig: { ...recordsFromCode.webhooks![0]!.clientConfig, caBundle: undefined },
    },
  );
  assert.equal(vwc.webhooks![0]!.clientConfig.caBundle, secret.data!["ca.crt"]);

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

void test("storeDriver: the chart issues the node agents' peer certificate (CA-signed, server and client auth, no CA key), mounts it read-only and passes it with the pod's address; an operator's Secret replaces it", async () => {
  const SERVER_AUTH = "1.3.6.1.5.5.7.3.1";
  const CLIENT_AUTH = "1.3.6.1.5.5.7.3.2";
  const agent = (objs: k8s.KubernetesObject[]): k8s.V1PodSpec =>
    find<k8s.V1DaemonSet>(objs, "DaemonSet", "-node-agent").spec!.template.spec!;
  const peerSecrets = (objs: k8s.KubernetesObject[]): k8s.KubernetesObject[] =>
    objs.filter((o) => o.kind === "Secret" && o.metadata?.name?.endsWith("-peer-tls"));

  // On by default for a node-local store; off (or with a shared store claim): no Secret, no peer
  // flag, no mount.
  assert.equal(peerSecrets(await renderChart()).length, 1, "a peer Secret by default");
  for (const values of [{ "nodeAgent.storeDriver.enabled": false }, { "nodeAgent.store.claim": "models" }]) {
    const rendered = await renderChart(values);
    assert.deepEqual(peerSecrets(rendered), [], `no peer Secret with ${JSON.stringify(values)}`);
    const off = agent(rendered);
    assert.ok(!(off.containers[0]!.args ?? []).some((a) => a.startsWith("--peer-")), "no peer flags");
    assert.ok(!(off.volumes ?? []).some((v) => v.name === "peer-tls"));
    assert.ok(!rendered.some((o) => o.kind === "CSIDriver"), "no CSIDriver");
  }

  await runHelm(["lint", "--strict", CHART, "--set", "nodeAgent.storeDriver.enabled=true"]);
  const objs = await renderChart({ "nodeAgent.storeDriver.enabled": true }, { namespace: "ws-ns" });
  const [secret, ...more] = peerSecrets(objs) as k8s.V1Secret[];
  assert.ok(secret && more.length === 0, "one peer Secret");
  assert.equal(secret.metadata?.name, "warmstart-peer-tls");
  assert.equal(secret.metadata?.namespace, "ws-ns");
  assert.equal(secret.type, "kubernetes.io/tls");
  // The leaf and its key, and the CA's certificate: never the CA's key.
  assert.deepEqual(Object.keys(secret.data ?? {}).sort(), ["ca.crt", "tls.crt", "tls.key"]);
  const pem = (k: string): string => Buffer.from(secret.data![k]!, "base64").toString("utf8");
  const ca = new X509Certificate(pem("ca.crt"));
  const leaf = new X509Certificate(pem("tls.crt"));
  assert.equal(ca.ca, true, "ca.crt is a CA");
  assert.equal(leaf.ca, false, "the leaf is no CA (it signs nothing)");
  assert.ok(leaf.checkIssued(ca), "the leaf is issued by the CA");
  assert.ok(leaf.verify(ca.publicKey), "the leaf is signed by the CA's key");
  assert.ok(leaf.checkPrivateKey(createPrivateKey(pem("tls.key"))), "tls.key is the leaf's key");
  assert.ok(
    !/PRIVATE KEY/.test(pem("ca.crt")) && !/PRIVATE KEY/.test(pem("tls.crt")),
    "no key beside certificates",
  );
  // Each node agent serves (server auth) and fetches (client auth) with the same certificate.
  assert.ok(leaf.keyUsage?.includes(SERVER_AUTH), `serverAuth in ${leaf.keyUsage?.join(",")}`);
  assert.ok(leaf.keyUsage?.includes(CLIENT_AUTH), `clientAuth in ${leaf.keyUsage?.join(",")}`);
  assert.ok(new Date(leaf.validTo).getTime() > Date.now() + 365 * 86_400_000, "valid for years");

  const spec = agent(objs);
  const c = spec.containers[0]!;
  for (const a of [
    "--peer-cert=/etc/warmstart/peer-tls/tls.crt",
    "--peer-key=/etc/warmstart/peer-tls/tls.key",
    "--peer-ca=/etc/warmstart/peer-tls/ca.crt",
    "--peer-port=9465",
  ])
    assert.ok(c.args?.includes(a), a);
  assert.ok(
    c.args?.some((a) => a.startsWith("--csi-plugin-dir=")),
    "the driver is served",
  );
  const address = c.env?.find((e) => e.name === "WARMSTART_PEER_ADDRESS");
  assert.equal(
    address?.valueFrom?.fieldRef?.fieldPath,
    "status.podIP",
    "peers reach the pod's (or with hostNetwork the node's) address",
  );
  assert.ok(c.ports?.some((p) => p.name === "peers" && p.containerPort === 9465));
  const mount = c.volumeMounts?.find((m) => m.name === "peer-tls");
  assert.equal(mount?.mountPath, "/etc/warmstart/peer-tls");
  assert.equal(mount?.readOnly, true, "mounted read-only");
  const volume = spec.volumes?.find((v) => v.name === "peer-tls");
  assert.equal(volume?.secret?.secretName, "warmstart-peer-tls");
  assert.equal(volume?.secret?.defaultMode, 0o400);
  // A new certificate (rotation) rolls the agents, which read theirs at start.
  const annotations = find<k8s.V1DaemonSet>(objs, "DaemonSet", "-node-agent").spec!.template.metadata!
    .annotations;
  assert.match(annotations?.["checksum/peer-tls"] ?? "", /^[0-9a-f]{16}$/);
  const port = agent(
    await renderChart({ "nodeAgent.storeDriver.enabled": true, "nodeAgent.peerPort": 19465 }),
  );
  assert.ok(port.containers[0]!.args?.includes("--peer-port=19465"));

  // The operator's Secret: used as it is, nothing generated.
  const own = await renderChart({
    "nodeAgent.storeDriver.enabled": true,
    "nodeAgent.storeDriver.peerTls.secretName": "my-peer-certs",
  });
  assert.deepEqual(peerSecrets(own), [], "no Secret generated");
  assert.ok(!own.some((o) => o.kind === "Secret" && o.metadata?.name === "my-peer-certs"));
  const ownSpec = agent(own);
  assert.equal(ownSpec.volumes?.find((v) => v.name === "peer-tls")?.secret?.secretName, "my-peer-certs");
  assert.ok(ownSpec.containers[0]!.args?.includes("--peer-ca=/etc/warmstart/peer-tls/ca.crt"));
  assert.equal(
    find<k8s.V1DaemonSet>(own, "DaemonSet", "-node-agent").spec!.template.metadata!.annotations?.[
      "checksum/peer-tls"
    ],
    undefined,
  );
  await assert.rejects(
    renderChart({ "nodeAgent.storeDriver.enabled": true, "nodeAgent.peerPort": 0 }),
    /peerPort/,
  );
});

void test("nodeAgent.store.scopeShare reaches the node agents as --store-scope-share; a share outside (0, 1] is refused", async () => {
  const args = async (values: Record<string, unknown>): Promise<string[]> =>
    find<k8s.V1DaemonSet>(await renderChart(values), "DaemonSet", "-node-agent").spec!.template.spec!
      .containers[0]!.args ?? [];
  assert.ok(!(await args({})).some((a) => a.startsWith("--store-scope-share")), "the agent's default (half)");
  assert.ok((await args({ "nodeAgent.store.scopeShare": 0.3 })).includes("--store-scope-share=0.3"));
  await assert.rejects(renderChart({ "nodeAgent.store.scopeShare": 2 }), /scopeShare/);
});
