/**
 * What a stolen token of a role can reach beyond its code's needs, on the rendered chart and on the
 * real API server: the cluster agent's ConfigMap and Secret writes in the release namespace (held
 * by templates/cluster-agent-policy.yaml to its request records and its credentials Secret, since
 * RBAC cannot name them), and who reaches the node agents (templates/node-agent-networkpolicy.yaml;
 * /metrics answers loopback only unless nodeAgent.metrics.remote).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { parseAllDocuments } from "yaml";
import { impersonatingConfig, kube, tempNamespace, waitFor } from "../harness.js";
import { grants, renderChart } from "../chart.js";
import { SecretStore, type InstalledCredentials } from "../../src/cluster-agent/credentials.js";
import { Workloads, type RequestRecord } from "../../src/cluster-agent/workloads.js";
import { PACKAGE_ROOT } from "../../tools/localcluster/versions.js";

const AGENT = {
  "clusterAgent.enabled": true,
  "clusterAgent.clusterId": "c1",
  "controlPlane.enabled": true,
};
const SUFFIX = "-cluster-agent-objects";

const policyOf = (objs: k8s.KubernetesObject[]): k8s.V1ValidatingAdmissionPolicy | undefined =>
  objs.find((o) => o.kind === "ValidatingAdmissionPolicy" && o.metadata?.name?.endsWith(SUFFIX));
const bindingOf = (objs: k8s.KubernetesObject[]): k8s.V1ValidatingAdmissionPolicyBinding | undefined =>
  objs.find((o) => o.kind === "ValidatingAdmissionPolicyBinding" && o.metadata?.name?.endsWith(SUFFIX));
const refusal = (err: unknown): string => (err as { body?: string }).body ?? String(err);
const mergePatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);

void test("no role may write a ConfigMap or Secret of the release namespace by any name unless a policy holds its token", async () => {
  const objs = await renderChart({ ...AGENT, "snapshots.enabled": true, "uninstall.deleteData": true });
  const writes = ["create", "update", "patch", "delete"];
  const unnamed = grants(objs).filter(
    (g) =>
      (g.resource === "configmaps" || g.resource === "secrets") &&
      writes.includes(g.verb) &&
      !g.names &&
      g.where === "warmstart-system",
  );
  const accounts = [...new Set(unnamed.map((g) => g.account))].sort();
  // The uninstall hook runs after every role and policy is gone, to delete the agent's records.
  assert.deepEqual(accounts, ["warmstart-cluster-agent", "warmstart-uninstall-agent"]);
  const policy = policyOf(objs);
  assert.ok(policy, "the cluster agent's objects policy is rendered with the agent");
  assert.deepEqual(policy.spec?.matchConditions, [
    {
      name: "the-cluster-agent",
      expression:
        "request.userInfo.username == 'system:serviceaccount:warmstart-system:warmstart-cluster-agent'",
    },
  ]);
  assert.equal(policy.spec?.failurePolicy, "Fail");
  assert.deepEqual(policy.spec?.matchConstraints?.resourceRules?.[0]?.resources, ["configmaps", "secrets"]);
  assert.deepEqual(policy.spec?.matchConstraints?.resourceRules?.[0]?.operations, [
    "CREATE",
    "UPDATE",
    "DELETE",
  ]);
  assert.match(JSON.stringify(policy.spec?.validations), /warmstart-cluster-agent-credentials/);
  assert.deepEqual(bindingOf(objs)?.spec, { policyName: policy.metadata?.name, validationActions: ["Deny"] });
  // Nothing to hold without the agent; with the policies off, none of them.
  assert.equal(policyOf(await renderChart()), undefined);
  assert.equal(policyOf(await renderChart({ ...AGENT, "stampsPolicy.enabled": false })), undefined);
});

void test("the standalone deploy/cluster-agent.yaml carries the chart's cluster agent policy", async () => {
  const text = await readFile(join(PACKAGE_ROOT, "deploy/cluster-agent.yaml"), "utf8");
  const objs = parseAllDocuments(text).map((d) => d.toJSON() as k8s.KubernetesObject);
  const chart = await renderChart(AGENT);
  assert.deepEqual(policyOf(objs)?.spec, policyOf(chart)?.spec);
  assert.deepEqual(bindingOf(objs)?.spec, bindingOf(chart)?.spec);
});

void test("the node agents' NetworkPolicy: peers from node agents only, metrics from metricsFrom only, none with hostNetwork", async () => {
  const netpol = (objs: k8s.KubernetesObject[]): k8s.V1NetworkPolicy | undefined =>
    objs.find((o) => o.kind === "NetworkPolicy" && o.metadata?.name === "warmstart-node-agent");
  const selector = {
    "app.kubernetes.io/instance": "warmstart",
    "app.kubernetes.io/component": "node-agent",
  };
  const closed = netpol(await renderChart({ "nodeAgent.storeDriver.enabled": false }));
  assert.ok(closed, "rendered by default");
  assert.deepEqual(closed.spec?.podSelector, { matchLabels: selector });
  assert.deepEqual(closed.spec?.policyTypes, ["Ingress"]);
  assert.deepEqual(closed.spec?.ingress, [], "nobody but the node (its kubelet's probes) reaches them");

  const scraper = {
    namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "monitoring" } },
    podSelector: { matchLabels: { "app.kubernetes.io/name": "prometheus" } },
  };
  const open = netpol(
    await renderChart({
      "nodeAgent.storeDriver.enabled": true,
      "nodeAgent.metrics.remote": true,
      "nodeAgent.networkPolicy.metricsFrom": [scraper],
    }),
  );
  assert.deepEqual(open?.spec?.ingress, [
    { ports: [{ protocol: "TCP", port: 9465 }], from: [{ podSelector: { matchLabels: selector } }] },
    { ports: [{ protocol: "TCP", port: 9464 }], from: [scraper] },
  ]);
  assert.equal(netpol(await renderChart({ hostNetwork: true })), undefined, "not with hostNetwork");
  assert.equal(netpol(await renderChart({ "nodeAgent.networkPolicy.enabled": false })), undefined);
});

void test("node-agent metrics answer loopback only by default; nodeAgent.metrics.remote opens them", async () => {
  const args = (objs: k8s.KubernetesObject[]): string[] =>
    (objs.find((o) => o.kind === "DaemonSet") as k8s.V1DaemonSet).spec!.template.spec!.containers[0]!.args!;
  assert.ok(!args(await renderChart()).includes("--metrics-remote"));
  assert.ok(args(await renderChart({ "nodeAgent.metrics.remote": true })).includes("--metrics-remote"));
});

void test("a cluster agent's token writes only its request records and its credentials Secret", async (t) => {
  const { kc, core } = await kube();
  const rbac = kc.makeApiClient(k8s.RbacAuthorizationV1Api);
  const admission = kc.makeApiClient(k8s.AdmissionregistrationV1Api);
  const ns = await tempNamespace(t, "ca-objects");
  const objs = await renderChart({ ...AGENT, "clusterAgent.namespaces": [ns] }, { namespace: ns });
  // The chart's Role and RoleBinding in the release namespace, for the impersonated account.
  const role = objs.find(
    (o) => o.kind === "Role" && o.metadata?.namespace === ns && o.metadata.name === "warmstart-cluster-agent",
  ) as k8s.V1Role;
  const binding = objs.find(
    (o) =>
      o.kind === "RoleBinding" &&
      o.metadata?.namespace === ns &&
      o.metadata.name === "warmstart-cluster-agent",
  ) as k8s.V1RoleBinding;
  await rbac.createNamespacedRole({ namespace: ns, body: role });
  await rbac.createNamespacedRoleBinding({ namespace: ns, body: binding });
  // What the agent must not touch: the chart's ConfigMaps.
  for (const name of ["warmstart-cache-env", "warmstart-storage-profiles"])
    await core.createNamespacedConfigMap({ namespace: ns, body: { metadata: { name }, data: { a: "b" } } });

  const agent = impersonatingConfig(kc, `system:serviceaccount:${ns}:warmstart-cluster-agent`);
  const as = agent.makeApiClient(k8s.CoreV1Api);
  const poison = () =>
    as.patchNamespacedConfigMap(
      {
        name: "warmstart-cache-env",
        namespace: ns,
        body: { data: { LD_PRELOAD: "{root}/cache/home/x.so" } },
        dryRun: "All",
      },
      mergePatch,
    );
  // RBAC alone lets the token rewrite the env restored pods are pointed into.
  await poison();

  const name = `ca-objects-${randomBytes(3).toString("hex")}`;
  const policy = policyOf(objs)!;
  await admission.createValidatingAdmissionPolicy({ body: { ...policy, metadata: { name } } });
  t.after(() => admission.deleteValidatingAdmissionPolicy({ name }).then(() => undefined));
  await admission.createValidatingAdmissionPolicyBinding({
    body: {
      metadata: { name },
      spec: {
        ...bindingOf(objs)!.spec,
        policyName: name,
        matchResources: {
          namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": ns } },
        },
      },
    },
  });
  t.after(() => admission.deleteValidatingAdmissionPolicyBinding({ name }).then(() => undefined));
  const held = /writes only its request records/;
  await waitFor("the policy to refuse the env ConfigMap", () =>
    poison().then(
      () => false,
      (err: unknown) => held.test(refusal(err)),
    ),
  );

  // The agent's own code, as its token: records and credentials written, read, replaced, deleted.
  const workloads = new Workloads(
    as,
    agent.makeApiClient(k8s.AppsV1Api),
    ns,
    { nodeSelector: [], gpuTypeLabel: "nvidia.com/gpu.product" },
    [ns],
  );
  const rec: RequestRecord = {
    requestId: "r-1",
    messageId: "m-1",
    name: "model",
    namespace: ns,
    state: "accepted",
    updatedAt: new Date().toISOString(),
  };
  await workloads.writeRecord(rec);
  await workloads.writeRecord({ ...rec, state: "applied" });
  assert.equal((await workloads.readRecord("r-1"))?.state, "applied");
  assert.deepEqual(
    (await workloads.listRecords()).map((r) => r.requestId),
    ["r-1"],
  );
  await workloads.deleteRecord("r-1");
  assert.equal(await workloads.readRecord("r-1"), undefined);
  const secrets = new SecretStore(as, ns, "warmstart-cluster-agent-credentials");
  const creds: InstalledCredentials = {
    token: "t-1",
    expiresAt: Date.now() + 3_600_000,
    renewBeforeMs: 60_000,
    generation: 1,
    capacity: [],
    issuer: "cp",
    lifetimeMs: 3_600_000,
  };
  await secrets.save(creds);
  await secrets.save({ ...creds, token: "t-2", generation: 2 });
  assert.equal((await secrets.load())?.token, "t-2");

  const dry = { namespace: ns, dryRun: "All" };
  const record = (id: string, labels: Record<string, string>): k8s.V1ConfigMap => ({
    metadata: { name: `warmstart-request-${id}`, labels },
    data: {},
  });
  const own = { "app.kubernetes.io/managed-by": "warmstart-cluster-agent" };
  const attacks: Array<[string, () => Promise<unknown>, RegExp]> = [
    ["rewrite the cache env (LD_PRELOAD into restored pods)", poison, held],
    [
      "rewrite the cache env by server-side apply",
      () =>
        as.patchNamespacedConfigMap(
          {
            name: "warmstart-cache-env",
            namespace: ns,
            body: { apiVersion: "v1", kind: "ConfigMap", data: { HOME: "/tmp" } },
            fieldManager: "x",
            force: true,
            dryRun: "All",
          },
          k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.ServerSideApply),
        ),
      held,
    ],
    [
      "label the cache env as a record",
      () =>
        as.patchNamespacedConfigMap(
          {
            name: "warmstart-cache-env",
            namespace: ns,
            body: { metadata: { labels: { ...own, "cluster-agent.warmstart.dev/request-id": "x" } } },
            dryRun: "All",
          },
          mergePatch,
        ),
      held,
    ],
    [
      "delete the storage profiles",
      () => as.deleteNamespacedConfigMap({ name: "warmstart-storage-profiles", ...dry }),
      held,
    ],
    [
      "rewrite the namespace's root CA bundle",
      () =>
        as.patchNamespacedConfigMap(
          { name: "kube-root-ca.crt", namespace: ns, body: { data: { "ca.crt": "x" } }, dryRun: "All" },
          mergePatch,
        ),
      held,
    ],
    [
      "create another ConfigMap",
      () => as.createNamespacedConfigMap({ ...dry, body: { metadata: { name: "warmstart-cache-env-2" } } }),
      held,
    ],
    [
      "create a record without its labels",
      () => as.createNamespacedConfigMap({ ...dry, body: record("x", {}) }),
      held,
    ],
    [
      "create a record labelled for another request",
      () =>
        as.createNamespacedConfigMap({
          ...dry,
          body: record("x", { ...own, "cluster-agent.warmstart.dev/request-id": "y" }),
        }),
      held,
    ],
    [
      "create a record that blocks its own deletion",
      () =>
        as.createNamespacedConfigMap({
          ...dry,
          body: {
            ...record("x", { ...own, "cluster-agent.warmstart.dev/request-id": "x" }),
            metadata: {
              name: "warmstart-request-x",
              labels: { ...own, "cluster-agent.warmstart.dev/request-id": "x" },
              finalizers: ["example.com/hold"],
            },
          },
        }),
      held,
    ],
    [
      "create another account's token Secret under its credentials' name",
      () =>
        as.createNamespacedSecret({
          ...dry,
          body: {
            metadata: {
              name: "warmstart-cluster-agent-credentials-2",
              annotations: { "kubernetes.io/service-account.name": "default" },
            },
            type: "kubernetes.io/service-account-token",
          },
        }),
      /writes only its credentials Secret/,
    ],
    [
      "pre-create a Secret the chart adopts (the peer certificate)",
      () =>
        as.createNamespacedSecret({
          ...dry,
          body: {
            metadata: { name: "warmstart-peer-tls" },
            type: "kubernetes.io/tls",
            stringData: { "tls.crt": "x", "tls.key": "x", "ca.crt": "x" },
          },
        }),
      /writes only its credentials Secret/,
    ],
  ];
  // The token Secret under the credentials' own name, once that Secret is gone.
  await core.deleteNamespacedSecret({ name: "warmstart-cluster-agent-credentials", namespace: ns });
  attacks.push([
    "create a token Secret of another account under its credentials' name",
    () =>
      as.createNamespacedSecret({
        ...dry,
        body: {
          metadata: {
            name: "warmstart-cluster-agent-credentials",
            annotations: { "kubernetes.io/service-account.name": "default" },
          },
          type: "kubernetes.io/service-account-token",
        },
      }),
    /writes only its credentials Secret/,
  ]);
  for (const [what, attempt, why] of attacks)
    await assert.rejects(attempt(), (err) => why.test(refusal(err)), what);
  const env = await core.readNamespacedConfigMap({ name: "warmstart-cache-env", namespace: ns });
  assert.deepEqual(env.data, { a: "b" });
});
