/**
 * Helpers for tests on the local cluster's real node: a chart of engine replicas (the model
 * engine stand-in fetching from the local model hub), the engine's own report read from its
 * container log on the node, and the hub's counters.
 */
import { execFile } from "node:child_process";
import { request as httpRequest } from "node:http";
import { request as httpsRequest } from "node:https";
import { mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { promisify } from "node:util";
import * as k8s from "@kubernetes/client-node";
import {
  containerLogDir,
  engineDeployment,
  parseEngineReport,
  type EngineReport,
} from "../tools/localcluster/engine-chart.js";
import assert from "node:assert/strict";
import { getModelCache, type StartupRecord } from "../src/common/modelcache.js";
import { LABEL_HASH } from "../src/core/contract.js";
import { PACKAGE_ROOT } from "../tools/localcluster/versions.js";
import { kube, localCluster, uniqueName, waitFor } from "./harness.js";
import { takeOverRole, type RoleHandle } from "./roles.js";
import { clearNodeLinks, realNodeAddress, shapeNodeLinks } from "../tools/localcluster/links.js";
import {
  STORE_DRIVER,
  createStoreDriverObject,
  storeDriverArgs,
  storeDriverRegistered,
  writePeerTls,
  writePeerToken,
} from "../tools/localcluster/store-driver.js";

export type { EngineReport };
export { STORE_DRIVER };

export interface RealNode {
  name: string;
  /** The node's own loopback address: its agent serves peers there (tools/localcluster/links.ts). */
  address: string;
  podLogsDir: string;
  kubeletRoot: string;
  hub: string;
  images: { warmstart: string; engine: string; engineAsUser: string };
}

/** The local cluster's first real node, or a skip saying why there is none. */
export async function realNodeOrSkip(t: TestContext): Promise<RealNode | undefined> {
  return (await realNodesOrSkip(t, 1))?.[0];
}

/** The local cluster's real nodes, or a skip saying why there are fewer than `n`. */
export async function realNodesOrSkip(t: TestContext, n: number): Promise<RealNode[] | undefined> {
  const st = await localCluster();
  const nodes = (st?.nodes ?? []).filter((x) => x.real && x.podLogsDir);
  if (!st || nodes.length < n || !st.images || !st.roles.modelHub) {
    t.skip(
      `fewer than ${n} real nodes in this cluster (a foreign KUBECONFIG, or cluster up --real-nodes ${n - 1})`,
    );
    return undefined;
  }
  return nodes.map((node, k) => ({
    name: node.name,
    address: node.address ?? realNodeAddress(k),
    podLogsDir: node.podLogsDir!,
    kubeletRoot: node.kubeletRoot,
    hub: st.roles.modelHub!,
    images: st.images!,
  }));
}

/**
 * The node-store backend on these nodes for one test: the CSIDriver object, and each node's agent
 * run by the test with the driver on (--csi-plugin-dir under its kubelet root) and, with `peers`,
 * a peer certificate of one CA for this test, served at the node's own address, as `cluster up
 * --store-driver` runs them (tools/localcluster/store-driver.ts); until each kubelet has registered
 * the driver. The agents' handles, by node name.
 */
export async function serveStoreDriver(
  t: TestContext,
  nodes: RealNode[],
  o: { peers?: boolean } = {},
): Promise<Map<string, RoleHandle>> {
  const { kc, core, apps } = await kube();
  const storage = kc.makeApiClient(k8s.StorageV1Api);
  // Hooks run in the order they were added: this one first, so the pods this test made on the
  // driver's volumes are gone (unpublished by these agents) before the agents and the driver go.
  t.after(async () => {
    const volumes = new Set(
      (await core.listPersistentVolume()).items
        .filter((v) => v.spec?.csi?.driver === STORE_DRIVER && v.spec.claimRef)
        .map((v) => `${v.spec!.claimRef!.namespace}/${v.spec!.claimRef!.name}`),
    );
    const mounting = (await core.listPodForAllNamespaces()).items.filter((p) =>
      (p.spec?.volumes ?? []).some(
        (v) =>
          v.persistentVolumeClaim &&
          volumes.has(`${p.metadata!.namespace}/${v.persistentVolumeClaim.claimName}`),
      ),
    );
    // Their workloads first, or they would be made again at once.
    for (const ns of new Set(mounting.map((p) => p.metadata!.namespace!)))
      await apps.deleteCollectionNamespacedDeployment({ namespace: ns }).catch(() => undefined);
    for (const p of mounting)
      await core
        .deleteNamespacedPod({
          namespace: p.metadata!.namespace!,
          name: p.metadata!.name!,
          gracePeriodSeconds: 0,
        })
        .catch(() => undefined);
    await waitFor(
      "the pods on the driver's volumes gone",
      async () => {
        const left = await Promise.all(
          mounting.map((p) =>
            core
              .readNamespacedPod({ namespace: p.metadata!.namespace!, name: p.metadata!.name! })
              .then((x) => x.metadata?.uid === p.metadata?.uid)
              .catch(() => false),
          ),
        );
        return left.every((x) => !x);
      },
      120_000,
    ).catch(() => undefined);
  });
  // One the cluster already has (`cluster up --store-driver`) stays when the test ends.
  if (await createStoreDriverObject(storage))
    t.after(() => storage.deleteCSIDriver({ name: STORE_DRIVER }).catch(() => undefined));
  const dir = await mkdtemp(join(tmpdir(), "peer-tls-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  if (o.peers) {
    await writePeerTls(dir, nodes);
    for (const node of nodes) await writePeerToken((await kube()).kc, dir, node.name);
  }
  const agents = new Map<string, RoleHandle>();
  for (const node of nodes) {
    const args = storeDriverArgs(node, o.peers ? dir : undefined);
    agents.set(node.name, await takeOverRole(t, `node-agent-${node.name}`, { extraArgs: args }));
  }
  for (const node of nodes)
    await waitFor(
      `the kubelet of ${node.name} to register the driver (CSINode)`,
      () => storeDriverRegistered(storage, node.name),
      60_000,
    );
  return agents;
}

/**
 * Each node's uplink to its peers shaped to `mbit` for this test (as `cluster up --node-link-mbit`
 * does for a whole cluster), so a tree takes seconds to cross, not milliseconds.
 */
export async function shapeLinks(t: TestContext, nodes: RealNode[], mbit: number): Promise<void> {
  const st = await localCluster();
  await shapeNodeLinks(
    nodes.map((n) => n.address),
    mbit,
  );
  t.after(async () => {
    if (st?.nodeLinkMbit) {
      const all = (st.nodes ?? []).flatMap((n) => (n.real && n.address ? [n.address] : []));
      await shapeNodeLinks(all, st.nodeLinkMbit);
    } else await clearNodeLinks();
  });
}

export interface EngineChartOptions {
  name?: string;
  replicas: number;
  model: string;
  image?: string;
  securityContext?: k8s.V1SecurityContext;
  podSecurityContext?: k8s.V1PodSecurityContext;
}

export async function createEngines(
  t: TestContext,
  node: RealNode,
  namespace: string,
  o: EngineChartOptions,
): Promise<void> {
  const { apps } = await kube();
  const body = engineDeployment({
    ...o,
    node: node.name,
    hub: node.hub,
    image: o.image ?? node.images.engine,
    compileSeconds: 1,
  });
  await apps.createNamespacedDeployment({ namespace, body });
  // Deleted at the end so the real node's GPUs are free for the next test at once.
  t.after(async () => {
    await apps
      .deleteNamespacedDeployment({ namespace, name: body.metadata!.name!, gracePeriodSeconds: 0 })
      .catch(() => undefined);
  });
}

/** Lines a container wrote, from the kubelet's log files on the node (CRI format). */
export async function containerLog(node: RealNode, pod: k8s.V1Pod, container: string): Promise<string> {
  const dir = containerLogDir(node.podLogsDir, pod, container);
  const files = (await readdir(dir)).filter((f) => /^\d+\.log$/.test(f)).sort();
  return (await Promise.all(files.map((f) => readFile(join(dir, f), "utf8")))).join("");
}

export async function engineReport(
  node: RealNode,
  pod: k8s.V1Pod,
  container = "engine",
): Promise<EngineReport> {
  const log = await containerLog(node, pod, container);
  const report = parseEngineReport(log);
  if (!report) throw new Error(`no engine report in the log of ${pod.metadata?.name}:\n${log.slice(-2000)}`);
  return report;
}

export interface HubStats {
  bytes: number;
  requests: number;
  repos: Record<string, { bytes: number; requests: number }>;
}

export async function hubStats(node: RealNode): Promise<HubStats> {
  const res = await fetch(`${node.hub}/_stats`);
  return (await res.json()) as HubStats;
}

/** Bytes of one synthetic model as the hub serves it (its file sizes, from the tree listing). */
export async function modelBytes(node: RealNode, model: string): Promise<number> {
  const res = await fetch(`${node.hub}/api/models/${model}/tree/main?recursive=true`);
  const files = (await res.json()) as { size: number }[];
  return files.reduce((n, f) => n + f.size, 0);
}

/** How each init container of a pod ended (name -> exit code), in the order they ran. */
export function initExits(pod: k8s.V1Pod): Record<string, number | undefined> {
  return Object.fromEntries(
    (pod.status?.initContainerStatuses ?? []).map((s) => [s.name, s.state?.terminated?.exitCode]),
  );
}

/**
 * Runs, as root on the real node, a pod that mounts `claim` whole (no subPath, no readOnly),
 * lists the mount's root and tries to write there.
 */
export async function mountByHand(
  t: TestContext,
  node: RealNode,
  namespace: string,
  claim: string,
): Promise<{ entries: string[]; write: string }> {
  const { core } = await kube();
  const name = uniqueName("by-hand");
  const script =
    "import json, os\n" +
    "entries = sorted(os.listdir('/m'))\n" +
    "try:\n    open('/m/planted', 'w').write('x'); write = 'written'\n" +
    "except OSError as e:\n    write = f'{e.strerror} ({e.errno})'\n" +
    "print('BYHAND ' + json.dumps({'entries': entries, 'write': write}))\n";
  await core.createNamespacedPod({
    namespace,
    body: {
      metadata: { name },
      spec: {
        restartPolicy: "Never",
        // Real nodes have no pod network: pods there run on the host's.
        hostNetwork: true,
        nodeSelector: { "kubernetes.io/hostname": node.name },
        tolerations: [{ key: "sim.warmstart.dev/real-node", operator: "Exists", effect: "NoSchedule" }],
        securityContext: { runAsUser: 0 },
        containers: [
          {
            name: "look",
            image: node.images.engine,
            imagePullPolicy: "Never",
            command: ["python3", "-c", script],
            volumeMounts: [{ name: "rox", mountPath: "/m" }],
          },
        ],
        volumes: [{ name: "rox", persistentVolumeClaim: { claimName: claim } }],
      },
    },
  });
  t.after(() => core.deleteNamespacedPod({ name, namespace, gracePeriodSeconds: 0 }).catch(() => undefined));
  const pod = await waitFor(
    `pod ${name} done`,
    async () => {
      const p = await core.readNamespacedPod({ name, namespace });
      return p.status?.phase === "Succeeded" || p.status?.phase === "Failed" ? p : undefined;
    },
    120_000,
  );
  const line = (await containerLog(node, pod, "look")).split("\n").find((l) => l.includes("BYHAND "));
  assert.ok(line, `pod ${name} (${pod.status?.phase}) printed what it saw`);
  return JSON.parse(line.slice(line.indexOf("BYHAND ") + 7)) as { entries: string[]; write: string };
}

/** The record's entry for each of these pods, once every one is there. */
export async function startupsOf(pods: k8s.V1Pod[]): Promise<Map<string, StartupRecord>> {
  const { custom } = await kube();
  const short = pods[0]!.metadata!.labels![LABEL_HASH]!;
  return waitFor(
    "every pod's start on the record",
    async () => {
      const list = (await getModelCache(custom, short))?.status?.startups ?? [];
      const byUid = new Map(list.map((e) => [e.uid, e]));
      return pods.every((p) => byUid.has(p.metadata!.uid!)) ? byUid : undefined;
    },
    60_000,
  );
}

const run = promisify(execFile);

/** `warmstart pods` as a user runs it: the table and its JSON. */
export async function warmstartPods(): Promise<{
  table: string;
  json: { pods: { name: string; startup: unknown }[] };
}> {
  const cli = (args: string[]): Promise<{ stdout: string }> =>
    run(process.execPath, [join(PACKAGE_ROOT, "bin/warmstart"), ...args], {
      env: { ...process.env, LOG_LEVEL: "silent" },
      timeout: 60_000,
    });
  const [table, json] = await Promise.all([cli(["pods"]), cli(["pods", "-o", "json"])]);
  return {
    table: table.stdout,
    json: JSON.parse(json.stdout) as { pods: { name: string; startup: unknown }[] },
  };
}

export async function eventsOf(ns: string, pod: k8s.V1Pod): Promise<k8s.CoreV1Event[]> {
  const { core } = await kube();
  return (await core.listNamespacedEvent({ namespace: ns })).items.filter(
    (e) => e.involvedObject?.uid === pod.metadata?.uid,
  );
}

/** A completion from a server on the node's network (HTTPS with a self-signed certificate too). */
export async function completion(
  port: number,
  model: string,
  scheme: "http" | "https" = "http",
): Promise<string> {
  const body = JSON.stringify({ model, prompt: "Hello, how are", max_tokens: 5 });
  const { status, text } = await new Promise<{ status: number; text: string }>((resolve, reject) => {
    const req = (scheme === "https" ? httpsRequest : httpRequest)(
      {
        host: "127.0.0.1",
        port,
        path: "/v1/completions",
        method: "POST",
        headers: { "Content-Type": "application/json" },
        rejectUnauthorized: false,
      },
      (res) => {
        let text = "";
        res.setEncoding("utf8");
        res.on("data", (d: string) => (text += d));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, text }));
      },
    );
    req.on("error", reject);
    req.end(body);
  });
  assert.equal(status, 200, text);
  return (JSON.parse(text) as { choices: { text: string }[] }).choices[0]!.text;
}
