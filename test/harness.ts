/**
 * Integration-test harness: a real API server (the local cluster, or $KUBECONFIG), clients,
 * throwaway namespaces cleaned up after each test, and waits on conditions instead of sleeps.
 */
import { spawn } from "node:child_process";
import * as https from "node:https";
import { randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { TestContext } from "node:test";
import * as k8s from "@kubernetes/client-node";
import { readState, status as clusterStatus, type ClusterState } from "../tools/localcluster/cluster.js";
import { SYSTEM_NAMESPACE, isNotFound } from "../src/common/kube.js";
import { LABEL_HASH, MODELCACHE } from "../src/core/contract.js";

export interface Kube {
  kc: k8s.KubeConfig;
  core: k8s.CoreV1Api;
  apps: k8s.AppsV1Api;
  coordination: k8s.CoordinationV1Api;
  custom: k8s.CustomObjectsApi;
  admission: k8s.AdmissionregistrationV1Api;
}

let cached: Kube | undefined;

/** Clients for the cluster under test: $KUBECONFIG if set, else the running local cluster. */
export async function kube(): Promise<Kube> {
  if (cached) return cached;
  let file = process.env.KUBECONFIG;
  if (!file) {
    const st = await clusterStatus();
    if (!st.running) throw new Error("no cluster: run `bin/warmstart cluster up` or set KUBECONFIG");
    file = st.kubeconfig;
  }
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(file);
  cached = {
    kc,
    core: kc.makeApiClient(k8s.CoreV1Api),
    apps: kc.makeApiClient(k8s.AppsV1Api),
    coordination: kc.makeApiClient(k8s.CoordinationV1Api),
    custom: kc.makeApiClient(k8s.CustomObjectsApi),
    admission: kc.makeApiClient(k8s.AdmissionregistrationV1Api),
  };
  return cached;
}

/** The local cluster's recorded state (nodes, kubelet roots, role URLs); undefined on a foreign cluster. */
/** The core API as `user`, through the admin's credentials (impersonation). */
export function impersonating(kc: k8s.KubeConfig, user: string): k8s.CoreV1Api {
  return impersonatingConfig(kc, user).makeApiClient(k8s.CoreV1Api);
}

/**
 * A config that acts as `user` with the given user extras, through the admin's credentials: a
 * service account token bound to a pod carries its node as the extra
 * `authentication.kubernetes.io/node-name`, which policies read.
 */
export function impersonatingConfig(
  kc: k8s.KubeConfig,
  user: string,
  extra: Record<string, string> = {},
): k8s.KubeConfig {
  class Impersonating extends k8s.KubeConfig {
    override async applySecurityAuthentication(
      context: Parameters<k8s.KubeConfig["applySecurityAuthentication"]>[0],
    ): Promise<void> {
      await super.applySecurityAuthentication(context);
      for (const [k, v] of Object.entries(extra))
        context.setHeaderParam(`Impersonate-Extra-${encodeURIComponent(k)}`, v);
    }
  }
  const ikc = new Impersonating();
  ikc.loadFromOptions({
    clusters: kc.clusters,
    users: [{ ...kc.getCurrentUser()!, name: "impersonating", impersonateUser: user }],
    contexts: [{ name: "impersonating", cluster: kc.getCurrentCluster()!.name, user: "impersonating" }],
    currentContext: "impersonating",
  });
  return ikc;
}

/** Grants `user` these cluster-wide rules (a ClusterRole and its binding, both named `name`) for the test. */
export async function grantCluster(
  t: { after: (fn: () => Promise<void>) => void },
  name: string,
  user: string,
  rules: k8s.V1PolicyRule[],
): Promise<void> {
  const rbac = (await kube()).kc.makeApiClient(k8s.RbacAuthorizationV1Api);
  await rbac.createClusterRole({ body: { metadata: { name }, rules } });
  t.after(() => rbac.deleteClusterRole({ name }).then(() => undefined));
  await rbac.createClusterRoleBinding({
    body: {
      metadata: { name },
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name },
      subjects: [{ kind: "User", apiGroup: "rbac.authorization.k8s.io", name: user }],
    },
  });
  t.after(() => rbac.deleteClusterRoleBinding({ name }).then(() => undefined));
}

export async function localCluster(): Promise<ClusterState | undefined> {
  return readState();
}

export function uniqueName(prefix: string): string {
  return `${prefix}-${randomBytes(3).toString("hex")}`;
}

/** A fresh namespace, deleted (without waiting) when the test ends. */
export async function tempNamespace(
  t: TestContext,
  prefix = "t",
  labels: Record<string, string> = {},
): Promise<string> {
  const { core } = await kube();
  const name = uniqueName(prefix);
  await core.createNamespace({ body: { metadata: { name, labels } } });
  t.after(async () => {
    await core.deleteNamespace({ name, propagationPolicy: "Background" }).catch((err: unknown) => {
      if (!isNotFound(err)) throw err;
    });
  });
  // Pods are refused until the namespace's default ServiceAccount exists.
  await waitFor(`ServiceAccount default in ${name}`, async () => {
    await core.readNamespacedServiceAccount({ name: "default", namespace: name });
    return true;
  });
  return name;
}

/**
 * Poll `check` until it returns a truthy value (returned) or the timeout passes. Errors count as
 * "not yet"; the last one is reported on timeout. Backs off from 25 ms to 500 ms.
 */
export async function waitFor<T>(
  what: string,
  check: () => Promise<T | undefined | null | false> | T | undefined | null | false,
  timeoutMs = 30_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let delay = 25;
  let last: unknown;
  let lastValue: unknown;
  for (;;) {
    try {
      const v = await check();
      lastValue = v;
      if (v) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) {
      const detail = last
        ? `; last error: ${last instanceof Error ? last.message : JSON.stringify(last)}`
        : `; last value: ${JSON.stringify(lastValue)}`;
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${detail}`);
    }
    await sleep(delay);
    delay = Math.min(delay * 2, 500);
  }
}

export const podCondition = (pod: k8s.V1Pod, type: string): k8s.V1PodCondition | undefined =>
  pod.status?.conditions?.find((c) => c.type === type);

export const isPodReady = (pod: k8s.V1Pod): boolean => podCondition(pod, "Ready")?.status === "True";

export async function listPods(namespace: string, labelSelector?: string): Promise<k8s.V1Pod[]> {
  const { core } = await kube();
  return (await core.listNamespacedPod({ namespace, labelSelector })).items;
}

/** A minimal GPU worker pod template (the image never runs: simulated nodes only report status). */
export function gpuContainer(name: string, args: string[] = [], gpus = 1): k8s.V1Container {
  return {
    name,
    image: "vllm/vllm-openai:v0.6.3",
    args,
    resources: { limits: { "nvidia.com/gpu": String(gpus) } },
  };
}

/** A Deployment `worker` (label app=worker) of GPU workers running `args`, as a chart would make it. */
export async function createWorkers(
  namespace: string,
  opts: { replicas: number; args: string[]; annotations?: Record<string, string> },
): Promise<void> {
  const { apps } = await kube();
  const labels = { app: "worker" };
  await apps.createNamespacedDeployment({
    namespace,
    body: {
      metadata: { name: "worker" },
      spec: {
        replicas: opts.replicas,
        selector: { matchLabels: labels },
        template: {
          metadata: { labels, annotations: opts.annotations },
          spec: { containers: [gpuContainer("vllm", opts.args)] },
        },
      },
    },
  });
}

/** Runs a command to its end (or `timeoutMs`), collecting what it wrote; `env` adds variables. */
export function runToEnd(
  cmd: string,
  args: string[],
  timeoutMs: number,
  env: Record<string, string> = {},
): Promise<{ status: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, {
      stdio: ["ignore", "pipe", "pipe"],
      timeout: timeoutMs,
      env: { ...process.env, ...env },
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    child.on("error", reject);
    child.on("close", (status) => resolve({ status, stdout, stderr }));
  });
}

/** Leases and caches a test created in cluster scope are removed with it. */
export async function cleanupHash(
  t: { after: (fn: () => Promise<void>) => void },
  short: string,
): Promise<void> {
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

/**
 * Creates an object from its JSON as written, past the client's typed models: they drop fields
 * newer than the client (a pod's `workloadRef`, Kubernetes 1.35), which the API server and the
 * webhook must see.
 */
export async function createRaw<T>(path: string, body: object): Promise<T> {
  const { kc } = await kube();
  const url = new URL(`${kc.getCurrentCluster()!.server}${path}`);
  const opts: https.RequestOptions = {
    method: "POST",
    hostname: url.hostname,
    port: url.port,
    path: url.pathname,
    headers: { "Content-Type": "application/json" },
  };
  await kc.applyToHTTPSOptions(opts);
  return new Promise<T>((resolve, reject) => {
    const req = https.request(opts, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d: string) => (text += d));
      res.on("end", () => {
        if ((res.statusCode ?? 500) >= 300) reject(new Error(`POST ${path}: ${res.statusCode} ${text}`));
        else resolve(JSON.parse(text) as T);
      });
    });
    req.on("error", reject);
    req.end(JSON.stringify(body));
  });
}
