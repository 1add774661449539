/**
 * The chart installed for real: a local cluster of its own (Kubernetes and one
 * real kubelet node, no Warmstart processes), `helm install` with the locally built image, every
 * role running as a pod from that image on the real node with the chart's RBAC, and the story
 * through them: a chart of engine replicas downloads its model once, the cache turns Ready, the
 * followers restore. Then the operators' side (the kubectl plugin, the dashboard's API, the stamps
 * policy, the cluster agent with the in-chart control plane), `helm upgrade`, and `helm uninstall`
 * twice: by default the CRD and the data stay; with uninstall.deleteData and crds.keep=false
 * nothing of Warmstart is left.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { request as httpsRequest } from "node:https";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, readdir, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { isPodReady, uniqueName, waitFor } from "../harness.js";
import { engineReport, hubStats, initExits, modelBytes, type RealNode } from "../realnode.js";
import { parseManifests, runHelm, CHART, objectName } from "../chart.js";
import { engineDeployment } from "../../tools/localcluster/engine-chart.js";
import { freePort } from "../../tools/localcluster/processes.js";
import { PACKAGE_ROOT } from "../../tools/localcluster/versions.js";
import { REAL_NODE_TAINT } from "../../tools/localcluster/realnode.js";
import { ControlPlaneClient } from "../../src/control-plane/client.js";
import { isNotFound } from "../../src/common/kube.js";
import {
  ANN_ROLE,
  INIT_PREWARM,
  INIT_SEED,
  LABEL_HASH,
  MODELCACHE,
  SCHEDULING_GATE,
} from "../../src/core/contract.js";

const RELEASE = "warmstart";
const SYSTEM = "warmstart-system";
const READY_MS = 240_000;

interface LocalState {
  kubeconfig: string;
  apiServer: string;
  nodes: { name: string; real?: boolean; kubeletRoot: string; podLogsDir?: string; address?: string }[];
  roles: { modelHub?: string };
  images: { warmstart: string; engine: string; engineAsUser: string };
}

const role = (p: k8s.V1Pod): string | undefined => p.metadata?.annotations?.[ANN_ROLE];

void test(
  "the chart on a real node: roles from the image run the story; upgrade and uninstall leave nothing behind",
  { timeout: 20 * 60_000 },
  async (t) => {
    if (process.env.WARMSTART_REAL_NODES === "0") {
      t.skip("real nodes are turned off for this run (WARMSTART_REAL_NODES=0)");
      return;
    }
    // A cluster of its own: the chart's pods are the only Warmstart roles in it.
    const dir = await mkdtemp(join(tmpdir(), "ws-chart-"));
    const env = { ...process.env, WARMSTART_STATE_DIR: dir };
    const cli = (...args: string[]): ReturnType<typeof spawnSync> =>
      spawnSync(process.execPath, [join(PACKAGE_ROOT, "bin/warmstart"), ...args], { env, encoding: "utf8" });
    t.after(async () => {
      // For a look around after a failure: WARMSTART_KEEP_INSTALL_CLUSTER=1 (then `cluster down` by hand).
      if (process.env.WARMSTART_KEEP_INSTALL_CLUSTER) return t.diagnostic(`kept: WARMSTART_STATE_DIR=${dir}`);
      cli("cluster", "down");
      await rm(dir, { recursive: true, force: true, maxRetries: 3 });
    });
    const up = cli(
      "cluster",
      "up",
      "--bare",
      "--nodes",
      "0",
      "--real-nodes",
      "1",
      "--no-csi",
      "--hub-model-mib",
      "32",
    );
    assert.equal(up.status, 0, `cluster up: ${String(up.stderr).slice(-3000)}`);
    const st = JSON.parse(await readFile(join(dir, "state.json"), "utf8")) as LocalState;
    const nodeState = st.nodes.find((n) => n.real)!;
    const node: RealNode = {
      name: nodeState.name,
      address: nodeState.address!,
      podLogsDir: nodeState.podLogsDir!,
      kubeletRoot: nodeState.kubeletRoot,
      hub: st.roles.modelHub!,
      images: st.images,
    };
    const kc = new k8s.KubeConfig();
    kc.loadFromFile(st.kubeconfig);
    const core = kc.makeApiClient(k8s.CoreV1Api);
    const apps = kc.makeApiClient(k8s.AppsV1Api);
    const custom = kc.makeApiClient(k8s.CustomObjectsApi);
    const ext = kc.makeApiClient(k8s.ApiextensionsV1Api);
    const rbac = kc.makeApiClient(k8s.RbacAuthorizationV1Api);
    const admission = kc.makeApiClient(k8s.AdmissionregistrationV1Api);
    const helmEnv = { KUBECONFIG: st.kubeconfig };
    const helm = (...args: string[]): Promise<{ stdout: string; stderr: string }> => runHelm(args, helmEnv);

    // `cluster up` applies the CRD for its own roles; here the chart installs and owns it.
    await ext.deleteCustomResourceDefinition({ name: `${MODELCACHE.plural}.${MODELCACHE.group}` });
    await waitFor("the CRD gone", async () => !(await crdExists()), 30_000);

    const engines = "engines";
    await core.createNamespace({ body: { metadata: { name: engines } } });
    await waitFor("the default ServiceAccount", () =>
      core.readNamespacedServiceAccount({ name: "default", namespace: engines }).then(() => true),
    );

    // The real node is the pods' host: every role on its network, each on a port of its own.
    const [webhookPort, serverPort, agentPort, clusterAgentPort, controlPlanePort] = await Promise.all(
      Array.from({ length: 5 }, freePort),
    );
    const store = join(dir, "nodes", node.name, "store-chart");
    const onRealNode = {
      nodeSelector: { "kubernetes.io/hostname": node.name },
      tolerations: [{ key: REAL_NODE_TAINT.key, operator: "Exists", effect: REAL_NODE_TAINT.effect }],
    };
    // The API server presents a client certificate to webhooks when `cluster up` configured it.
    const clientCa = join(dir, "pki", "ca.crt");
    const withClientAuth = existsSync(join(dir, "pki", "admission.yaml"));
    const values = {
      image: { ref: st.images.warmstart, pullPolicy: "Never" },
      hostNetwork: true,
      election: { enabled: true },
      // No kube-proxy: the pods reach the API server where it listens.
      extraEnv: [
        { name: "KUBERNETES_SERVICE_HOST", value: "127.0.0.1" },
        { name: "KUBERNETES_SERVICE_PORT", value: new URL(st.apiServer).port },
      ],
      ...onRealNode,
      webhook: {
        replicas: 1,
        port: webhookPort,
        ...(withClientAuth
          ? {
              clientAuth: {
                caBundle: await readFile(clientCa, "utf8"),
                names: ["warmstart-apiserver-webhook-client"],
              },
            }
          : {}),
      },
      server: { port: serverPort },
      nodeAgent: {
        kubeletRoot: node.kubeletRoot,
        podLogsDir: node.podLogsDir,
        // The node's root mount is private here.
        mountPropagation: "None",
        store: { hostPath: store },
        warmup: "1s",
        port: agentPort,
        ...onRealNode,
      },
      clusterAgent: {
        enabled: true,
        clusterId: "local-chart",
        controlPlaneUrl: `http://127.0.0.1:${controlPlanePort}`,
        namespaces: [engines],
        port: clusterAgentPort,
        extraArgs: ["--debounce=1s", "--gpu-poll-interval=2s", "--queue-wait=2s"],
      },
      controlPlane: { enabled: true, port: controlPlanePort, persistence: { enabled: false } },
    };
    const valuesFile = join(dir, "values.json");
    await writeFile(valuesFile, JSON.stringify(values));

    const systemPods = async (): Promise<k8s.V1Pod[]> =>
      (await core.listNamespacedPod({ namespace: SYSTEM })).items.filter(
        (p) => !p.metadata?.deletionTimestamp,
      );

    await t.test("helm install: every role runs from the image on the real node", async () => {
      const started = Date.now();
      await helm("install", RELEASE, CHART, "-n", SYSTEM, "-f", valuesFile, "--wait", "--timeout", "4m");
      t.diagnostic(`helm install --wait: ${((Date.now() - started) / 1000).toFixed(1)} s`);
      const pods = await systemPods();
      const components = pods.map((p) => p.metadata!.labels!["app.kubernetes.io/component"]).sort();
      assert.deepEqual(components, ["cluster-agent", "control-plane", "node-agent", "server", "webhook"]);
      for (const p of pods) {
        assert.equal(p.spec?.nodeName, node.name, `${p.metadata?.name} on the real node`);
        assert.ok(isPodReady(p), `${p.metadata?.name} Ready`);
        for (const c of p.status?.containerStatuses ?? []) {
          assert.equal(c.image.replace(/^docker\.io\/library\//, ""), st.images.warmstart, `${c.name} image`);
          assert.equal(c.restartCount, 0, `${c.name} never restarted (read-only root file system)`);
        }
      }
    });

    const model = `synthetic/${uniqueName("chart")}`;
    const chart = engineDeployment({
      replicas: 3,
      model,
      node: node.name,
      hub: node.hub,
      image: st.images.engine,
      compileSeconds: 1,
    });
    const enginePods = async (): Promise<k8s.V1Pod[]> =>
      (await core.listNamespacedPod({ namespace: engines, labelSelector: "app=engine" })).items.filter(
        (p) => !p.metadata?.deletionTimestamp,
      );
    const allReady = (n: number): Promise<k8s.V1Pod[]> =>
      waitFor(
        `${n} Ready engines`,
        async () => {
          const pods = await enginePods();
          return pods.length === n && pods.every(isPodReady) ? pods : undefined;
        },
        READY_MS,
      );
    const assertRestored = async (pod: k8s.V1Pod): Promise<void> => {
      assert.deepEqual(initExits(pod), { [INIT_SEED]: 0, [INIT_PREWARM]: 0 });
      const r = await engineReport(node, pod);
      assert.equal(r.fetchedBytes, 0, `${pod.metadata?.name} fetched nothing`);
      assert.equal(r.compileCache, "hit", `${pod.metadata?.name} found its compile cache`);
    };
    let short = "";

    await t.test(
      "the story through the chart's roles: one download, a Ready cache, restored followers",
      async () => {
        const started = Date.now();
        await apps.createNamespacedDeployment({ namespace: engines, body: chart });
        const pods = await allReady(3);
        t.diagnostic(`3 engines Ready in ${((Date.now() - started) / 1000).toFixed(1)} s`);
        const leaders = pods.filter((p) => role(p) === "leader");
        const followers = pods.filter((p) => role(p) === "follower");
        assert.equal(leaders.length, 1, "one leader");
        assert.equal(followers.length, 2, "two followers");
        const size = await modelBytes(node, model);
        assert.equal((await hubStats(node)).repos[model]?.bytes, size, "the hub served the model once");
        short = pods[0]!.metadata!.labels![LABEL_HASH]!;
        const cache = (await custom.getClusterCustomObject({ ...MODELCACHE, name: short })) as {
          status?: { phase?: string; node?: string };
        };
        assert.equal(cache.status?.phase, "Ready");
        assert.equal(cache.status?.node, node.name);
        for (const f of followers) await assertRestored(f);
        assert.ok((await readdir(store)).includes(short), "the tree is in the chart's store");
      },
    );

    await t.test("operators: the kubectl plugin and the dashboard's API show the cache", async () => {
      // As the chart's notes say: kubectl-warmstart on the PATH, beside the warmstart command.
      const plugins = join(dir, "plugins");
      await mkdir(plugins, { recursive: true });
      await symlink(join(PACKAGE_ROOT, "bin/kubectl-warmstart"), join(plugins, "kubectl-warmstart"));
      const path = `${plugins}${delimiter}${process.env.PATH ?? ""}`;
      const hasKubectl = spawnSync("kubectl", ["version", "--client"], {
        env: { ...process.env, PATH: path },
      });
      const viaKubectl = hasKubectl.status === 0;
      // Without kubectl, the plugin is run as kubectl runs it: found on the PATH, with kubectl's environment.
      const out = spawnSync(
        viaKubectl ? "kubectl" : "kubectl-warmstart",
        [...(viaKubectl ? ["warmstart"] : []), "caches", "-o", "json"],
        { env: { ...process.env, PATH: path, KUBECONFIG: st.kubeconfig }, encoding: "utf8" },
      );
      t.diagnostic(
        `kubectl warmstart caches: run ${viaKubectl ? "through kubectl" : "as kubectl would (no kubectl here)"}`,
      );
      assert.equal(out.status, 0, String(out.stderr));
      const caches = JSON.parse(out.stdout) as { hash: string; phase: string; restores: number }[];
      const mine = caches.find((c) => c.hash === short);
      assert.equal(mine?.phase, "Ready");
      assert.equal(mine?.restores, 2);

      const secret = await core.readNamespacedSecret({ name: `${RELEASE}-server-token`, namespace: SYSTEM });
      const token = Buffer.from(secret.data!.token!, "base64").toString();
      const api = `http://127.0.0.1:${serverPort}/api/snapshot`;
      assert.equal((await fetch(api)).status, 401, "the API needs the token");
      const snap = (await (await fetch(api, { headers: { authorization: `Bearer ${token}` } })).json()) as {
        caches: { hash: string; phase: string }[];
      };
      assert.equal(snap.caches.find((c) => c.hash === short)?.phase, "Ready");
    });

    await t.test(
      "attacks: stamps changed after admission are refused; the webhook answers only the API server",
      async () => {
        const [pod] = (await enginePods()).filter((p) => role(p) === "follower");
        const name = pod!.metadata!.name!;
        const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
        const forge = (body: object): Promise<unknown> =>
          core.patchNamespacedPod({ name, namespace: engines, body }, merge);
        await assert.rejects(
          forge({ metadata: { labels: { [LABEL_HASH]: "0000000000000000" } } }),
          /labels are written by Warmstart only/,
        );
        await assert.rejects(
          forge({ metadata: { annotations: { [ANN_ROLE]: null } } }),
          /annotations .* are written by Warmstart only/,
        );
        await assert.rejects(
          forge({ metadata: { annotations: { "warmstart.dev/tree": "../.." } } }),
          /written by Warmstart only/,
        );
        // The user's own annotations stay the user's.
        await forge({ metadata: { annotations: { "warmstart.dev/skip": "true" } } });
        // Only the release controller lifts the cache-ready gate: a follower waiting on a leader
        // that is still compiling keeps it against anyone else. (A gate a pod's author writes is
        // removed at admission, like the stamps.)
        const slow = engineDeployment({
          name: "slow",
          replicas: 2,
          model: `synthetic/${uniqueName("slow")}`,
          node: node.name,
          hub: node.hub,
          image: st.images.engine,
          compileSeconds: 600,
        });
        await apps.createNamespacedDeployment({ namespace: engines, body: slow });
        const gated = await waitFor("a gated follower", async () =>
          (await core.listNamespacedPod({ namespace: engines, labelSelector: "app=slow" })).items.find((p) =>
            p.spec?.schedulingGates?.some((g) => g.name === SCHEDULING_GATE),
          ),
        );
        await assert.rejects(
          core.patchNamespacedPod(
            {
              name: gated.metadata!.name!,
              namespace: engines,
              body: [
                { op: "test", path: "/spec/schedulingGates/0/name", value: SCHEDULING_GATE },
                { op: "remove", path: "/spec/schedulingGates/0" },
              ],
            },
            k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch),
          ),
          /cache-ready scheduling gate is removed by Warmstart only/,
        );
        await apps.deleteNamespacedDeployment({ name: "slow", namespace: engines, gracePeriodSeconds: 0 });
        await waitFor(
          "the slow engines gone",
          async () =>
            (await core.listNamespacedPod({ namespace: engines, labelSelector: "app=slow" })).items.length ===
            0,
          60_000,
        );

        if (!withClientAuth) {
          t.diagnostic("this cluster's API server presents no client certificate: direct posts not tried");
          return;
        }
        // Without a certificate, and with the cluster admin's (signed by the same CA, another name).
        const post = (cert: { cert?: Buffer; key?: Buffer }): Promise<number> =>
          new Promise<number>((resolve, reject) => {
            const req = httpsRequest(
              `https://127.0.0.1:${webhookPort}/mutate`,
              {
                method: "POST",
                rejectUnauthorized: false,
                headers: { "content-type": "application/json" },
                ...cert,
              },
              (res) => {
                res.resume();
                resolve(res.statusCode ?? 0);
              },
            );
            req.on("error", reject);
            req.end(review);
          });
        const review = JSON.stringify({
          apiVersion: "admission.k8s.io/v1",
          kind: "AdmissionReview",
          request: { uid: "forged", operation: "CREATE", namespace: engines, object: chart.spec!.template },
        });
        assert.equal(await post({}), 401, "a review posted without a client certificate");
        const admin = {
          cert: await readFile(join(dir, "pki", "admin.crt")),
          key: await readFile(join(dir, "pki", "admin.key")),
        };
        assert.equal(await post(admin), 403, "a review posted with another certificate of the cluster's CA");
      },
    );

    await t.test(
      "the cluster agent registers with the in-chart control plane and deploys a request",
      async () => {
        const health = await waitFor(
          "the cluster agent ready",
          async () => {
            const res = await fetch(`http://127.0.0.1:${clusterAgentPort}/healthz`);
            return res.ok ? ((await res.json()) as { gpus: number }) : undefined;
          },
          60_000,
        );
        assert.equal(health.gpus, 4);
        const tokens = await core.readNamespacedSecret({
          name: `${RELEASE}-control-plane-tokens`,
          namespace: SYSTEM,
        });
        const operator = new ControlPlaneClient({
          baseUrl: `http://127.0.0.1:${controlPlanePort}`,
          token: Buffer.from(tokens.data!["operator-token"]!, "base64").toString(),
        });
        await operator.submit({
          name: "requested",
          namespace: engines,
          model: "m",
          image: "img:1",
          gpuType: "NVIDIA-L40S",
        });
        // Applied server-side: created with nothing but the chart's rights in that namespace.
        await waitFor(
          "the requested Deployment",
          () => apps.readNamespacedDeployment({ name: "requested", namespace: engines }).then(() => true),
          60_000,
        );
        await apps.deleteNamespacedDeployment({ name: "requested", namespace: engines });
      },
    );

    await t.test(
      "helm upgrade: new settings roll out, the certificate and token stay, disabled roles leave nothing",
      async () => {
        const cert = async (): Promise<string | undefined> =>
          (await core.readNamespacedSecret({ name: `${RELEASE}-webhook-tls`, namespace: SYSTEM })).data?.[
            "tls.crt"
          ];
        const token = async (): Promise<string | undefined> =>
          (await core.readNamespacedSecret({ name: `${RELEASE}-server-token`, namespace: SYSTEM })).data
            ?.token;
        const before = { cert: await cert(), token: await token() };
        const webhookBefore = (await systemPods()).find(
          (p) => p.metadata?.labels?.["app.kubernetes.io/component"] === "webhook",
        );
        const { stdout: manifest } = await helm("get", "manifest", RELEASE, "-n", SYSTEM);
        const agentObjects = parseManifests(manifest).filter((o) =>
          ["cluster-agent", "control-plane"].includes(
            o.metadata?.labels?.["app.kubernetes.io/component"] ?? "",
          ),
        );
        assert.ok(
          agentObjects.length >= 10,
          `the agent and control plane have ${agentObjects.length} objects`,
        );

        await helm(
          "upgrade",
          RELEASE,
          CHART,
          "-n",
          SYSTEM,
          "-f",
          valuesFile,
          "--wait",
          "--timeout",
          "4m",
          "--set",
          "webhook.cacheSizeLimit=100Gi",
          "--set",
          "clusterAgent.enabled=false",
          "--set",
          "controlPlane.enabled=false",
        );
        assert.equal(await cert(), before.cert, "the webhook's certificate is kept");
        assert.equal(await token(), before.token, "the server's token is kept");
        const webhook = await waitFor(
          "the new webhook pod alone",
          async () => {
            const ws = (await systemPods()).filter(
              (p) => p.metadata?.labels?.["app.kubernetes.io/component"] === "webhook",
            );
            return ws.length === 1 &&
              ws[0]!.metadata!.name !== webhookBefore?.metadata?.name &&
              isPodReady(ws[0]!)
              ? ws[0]
              : undefined;
          },
          120_000,
        );
        assert.ok(webhook.spec!.containers[0]!.args!.includes("--cache-size-limit=100Gi"));
        for (const o of agentObjects)
          assert.equal(await exists(o), false, `${objectName(o)} removed by the upgrade`);

        // The upgraded webhook admits a scale-up as a restore of the Ready cache.
        await apps.patchNamespacedDeploymentScale(
          { name: "engine", namespace: engines, body: { spec: { replicas: 4 } } },
          k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
        );
        const pods = await allReady(4);
        const restored = pods.filter((p) => role(p) === "restore");
        assert.equal(restored.length, 1, "the new replica restores");
        await assertRestored(restored[0]!);
        assert.equal(
          (await hubStats(node)).repos[model]?.bytes,
          await modelBytes(node, model),
          "still one download",
        );
      },
    );

    await t.test("helm uninstall keeps the CRD and the data, and nothing else", async () => {
      await apps.deleteNamespacedDeployment({ name: "engine", namespace: engines });
      await waitFor("the engines gone", async () => (await enginePods()).length === 0, 120_000);
      const { stdout: manifest } = await helm("get", "manifest", RELEASE, "-n", SYSTEM);
      const rendered = parseManifests(manifest);
      await helm("uninstall", RELEASE, "-n", SYSTEM, "--wait", "--timeout", "4m");
      await waitFor("the roles' pods gone", async () => (await systemPods()).length === 0, 120_000);
      for (const o of rendered) {
        const kept = o.kind === "CustomResourceDefinition";
        assert.equal(await exists(o), kept, `${objectName(o)} ${kept ? "kept" : "removed"}`);
      }
      // The data: the record, the claim and its volume, the stored tree.
      const cache = (await custom.getClusterCustomObject({ ...MODELCACHE, name: short })) as {
        status?: { phase?: string };
      };
      assert.equal(cache.status?.phase, "Ready");
      await core.readNamespacedPersistentVolumeClaim({ name: `rox-${short}`, namespace: engines });
      assert.ok((await readdir(store)).includes(short), "the stored tree is kept");
    });

    await t.test("with uninstall.deleteData and crds.keep=false, uninstall removes every trace", async () => {
      // Installed again over the kept CRD (the release adopts it), then removed with its data.
      await helm(
        "install",
        RELEASE,
        CHART,
        "-n",
        SYSTEM,
        "-f",
        valuesFile,
        "--wait",
        "--timeout",
        "4m",
        "--set",
        "uninstall.deleteData=true",
        "--set",
        "crds.keep=false",
      );
      // The agent has written its credentials Secret by the time it is ready.
      await waitFor(
        "the agent's credentials",
        () =>
          core
            .readNamespacedSecret({ name: `${RELEASE}-cluster-agent-credentials`, namespace: SYSTEM })
            .then(() => true),
        60_000,
      );
      const started = Date.now();
      await helm("uninstall", RELEASE, "-n", SYSTEM, "--wait", "--timeout", "5m");
      t.diagnostic(`helm uninstall with its data: ${((Date.now() - started) / 1000).toFixed(1)} s`);
      assert.equal(await crdExists(), false, "the CRD is gone");
      const pvs = await core.listPersistentVolume();
      assert.deepEqual(
        pvs.items.map((p) => p.metadata?.name),
        [],
        "no volume left",
      );
      const claims = await core.listNamespacedPersistentVolumeClaim({ namespace: engines });
      assert.deepEqual(
        claims.items.map((c) => c.metadata?.name),
        [],
        "no claim left",
      );
      assert.deepEqual(await readdir(store), [], "the store is empty");
      await waitFor("the roles' pods gone", async () => (await systemPods()).length === 0, 120_000);
      const left = [
        ...(await core.listNamespacedConfigMap({ namespace: SYSTEM })).items.map(
          (o) => `ConfigMap/${o.metadata?.name}`,
        ),
        ...(await core.listNamespacedSecret({ namespace: SYSTEM })).items.map(
          (o) => `Secret/${o.metadata?.name}`,
        ),
        ...(await core.listNamespacedServiceAccount({ namespace: SYSTEM })).items.map(
          (o) => `ServiceAccount/${o.metadata?.name}`,
        ),
        ...(await kc.makeApiClient(k8s.BatchV1Api).listNamespacedJob({ namespace: SYSTEM })).items.map(
          (o) => `Job/${o.metadata?.name}`,
        ),
        ...(await rbac.listClusterRole()).items
          .map((o) => `ClusterRole/${o.metadata?.name}`)
          .filter((n) => n.includes(RELEASE)),
        ...(await rbac.listClusterRoleBinding()).items
          .map((o) => `ClusterRoleBinding/${o.metadata?.name}`)
          .filter((n) => n.includes(RELEASE)),
        ...(await admission.listMutatingWebhookConfiguration()).items.map(
          (o) => `MutatingWebhookConfiguration/${o.metadata?.name}`,
        ),
        ...(await admission.listValidatingAdmissionPolicy()).items.map(
          (o) => `ValidatingAdmissionPolicy/${o.metadata?.name}`,
        ),
      ];
      assert.deepEqual(
        left,
        ["ConfigMap/kube-root-ca.crt", "ServiceAccount/default"],
        "what the namespace had before",
      );
    });

    async function crdExists(): Promise<boolean> {
      return ext.readCustomResourceDefinition({ name: `${MODELCACHE.plural}.${MODELCACHE.group}` }).then(
        () => true,
        (err: unknown) => {
          if (isNotFound(err)) return false;
          throw err;
        },
      );
    }

    /** Whether a rendered object is still in the cluster. */
    async function exists(o: k8s.KubernetesObject): Promise<boolean> {
      const client = k8s.KubernetesObjectApi.makeApiClient(kc);
      return client
        .read({
          apiVersion: o.apiVersion!,
          kind: o.kind!,
          metadata: { name: o.metadata!.name!, namespace: o.metadata?.namespace ?? "" },
        })
        .then(
          () => true,
          (err: unknown) => {
            if (isNotFound(err)) return false;
            throw err;
          },
        );
    }
  },
);
