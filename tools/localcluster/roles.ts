import { request } from "node:https";
import { setTimeout as sleep } from "node:timers/promises";
import * as k8s from "@kubernetes/client-node";
import type { ClusterState } from "./cluster.js";
import { freePort, isAlive, type ProcessRecord } from "./processes.js";
import { mkdir, readFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import {
  STORE_DRIVER,
  createStoreDriverObject,
  storeDriverArgs,
  storeDriverRegistered,
  writePeerToken,
} from "./store-driver.js";

/** The URLs of the Warmstart roles the local cluster runs (absent until a role exists). */
export interface RoleUrls {
  webhook?: string;
  server?: string;
  controlPlane?: string;
  clusterAgent?: string;
  /** The local model hub (with real nodes). */
  modelHub?: string;
}

export interface RoleContext {
  state: ClusterState;
  launch: (name: string, args: string[], env?: Record<string, string>) => Promise<ProcessRecord>;
  progress: (line: string) => void;
}

/** Start every Warmstart role wired to the local cluster. */
export async function startRoles(ctx: RoleContext): Promise<RoleUrls> {
  const roles: RoleUrls = {};
  roles.webhook = await startWebhook(ctx);
  await startNodeAgents(ctx);
  roles.server = await startServer(ctx);
  roles.controlPlane = await startControlPlane(ctx);
  roles.clusterAgent = await startClusterAgent(ctx, roles.controlPlane);
  return roles;
}

async function startClusterAgent(ctx: RoleContext, controlPlane: string): Promise<string> {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const { readTokenFile } = await import("../../src/control-plane/tokens.js");
  const tokens = await readTokenFile(join(ctx.state.stateDir, "control-plane", "cluster-tokens"));
  const token = tokens.find((e) => e.clusterId === "local")?.token;
  if (!token) throw new Error("the control plane has no registration token for cluster local");
  ctx.progress(`starting the cluster agent at ${url} (registers the simulated GPUs with the control plane)`);
  const rec = await ctx.launch(
    "cluster-agent",
    [
      "cluster-agent",
      `--control-plane-url=${controlPlane}`,
      "--cluster-id=local",
      "--cluster-name=warmstart-local",
      "--listen-host=127.0.0.1",
      `--port=${port}`,
      // A local cluster changes on purpose: short waits so GPU changes show at once.
      "--debounce=1s",
      "--gpu-poll-interval=5s",
      "--backoff-cap=30s",
      "--queue-wait=5s",
    ],
    { WARMSTART_CLUSTER_TOKEN: token },
  );
  await waitUntil("the cluster agent to register", rec, async () => (await fetch(`${url}/healthz`)).ok);
  return url;
}

async function startControlPlane(ctx: RoleContext): Promise<string> {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const dir = join(ctx.state.stateDir, "control-plane");
  await mkdir(dir, { recursive: true, mode: 0o700 });
  // One registration token per cluster id: the local agent's (cluster id "local") is minted once.
  const { addClusterToken } = await import("../../src/control-plane/tokens.js");
  const tokenFile = join(dir, "cluster-tokens");
  await addClusterToken(tokenFile, "local");
  ctx.progress(`starting the reference control plane at ${url}`);
  const rec = await ctx.launch("control-plane", [
    "control-plane",
    "--host=127.0.0.1",
    `--port=${port}`,
    `--db=${join(dir, "control-plane.db")}`,
    `--operator-token-file=${join(dir, "operator-token")}`,
    `--cluster-token-file=${tokenFile}`,
  ]);
  await waitUntil("the control plane", rec, async () => (await fetch(`${url}/healthz`)).ok);
  return url;
}

async function startServer(ctx: RoleContext): Promise<string> {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  ctx.progress(`starting the server (release controller, dashboard) at ${url}`);
  const rec = await ctx.launch("server", ["server", "--host=127.0.0.1", `--port=${port}`]);
  await waitUntil("the server", rec, async () => (await fetch(`${url}/healthz`)).ok);
  return url;
}

async function startWebhook(ctx: RoleContext): Promise<string> {
  const port = await freePort();
  const url = `https://127.0.0.1:${port}`;
  ctx.progress(
    `starting the webhook at ${url} (election on, sharing scope ${ctx.state.sharingScope ?? "cluster"}) and registering it with the API server`,
  );
  const rec = await ctx.launch("webhook", [
    "webhook",
    "--host=127.0.0.1",
    `--port=${port}`,
    `--register-url=${url}`,
    "--election-enabled=true",
    // A cluster recorded before the scope was: the scope it ran with then.
    `--sharing-scope=${ctx.state.sharingScope ?? "cluster"}`,
    // Only the API server may post reviews: it presents the client certificate `cluster up` issued
    // (a cluster started before it did keeps an open webhook).
    ...(existsSync(join(ctx.state.stateDir, "pki", "webhook-client.crt"))
      ? [
          `--client-ca-file=${join(ctx.state.stateDir, "pki", "ca.crt")}`,
          "--client-name=warmstart-apiserver-webhook-client",
        ]
      : []),
    // Init containers run the image every real node has (simulated nodes never start them).
    ...(ctx.state.images ? [`--image=${ctx.state.images.warmstart}`] : []),
  ]);
  await waitUntil("the webhook", rec, async () => {
    await httpsGet(`${url}/healthz`);
    return true;
  });
  // Webhook configuration takes a moment to reach the admission chain: dry-run until it mutates.
  const core = kubeConfig(ctx).makeApiClient(k8s.CoreV1Api);
  await waitUntil("admission through the webhook", rec, async () => {
    const pod = await core.createNamespacedPod({
      namespace: "default",
      dryRun: "All",
      body: {
        metadata: { name: "warmstart-probe" },
        spec: {
          containers: [
            {
              name: "probe",
              image: "probe",
              args: ["--model", "probe"],
              resources: { limits: { "nvidia.com/gpu": "1" } },
            },
          ],
        },
      },
    });
    return pod.metadata?.annotations?.["warmstart.dev/role"] !== undefined;
  });
  return url;
}

async function waitUntil(
  what: string,
  rec: ProcessRecord,
  check: () => Promise<boolean>,
  timeoutMs = 30_000,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    if (!(await isAlive(rec))) {
      const log = await readFile(rec.log, "utf8").catch(() => "");
      throw new Error(`${rec.name} exited; last log lines:\n${log.split("\n").slice(-10).join("\n")}`);
    }
    try {
      if (await check()) return;
    } catch (err) {
      last = err;
    }
    await sleep(100);
  }
  throw new Error(`timed out waiting for ${what}${last ? `: ${(last as Error).message}` : ""}`);
}

function httpsGet(url: string): Promise<void> {
  return new Promise((resolve, reject) => {
    // Only a liveness probe of our own child on loopback: its certificate is checked by the API server.
    const req = request(url, { rejectUnauthorized: false, timeout: 2000 }, (res) => {
      res.resume();
      if (res.statusCode === 200) resolve();
      else reject(new Error(`status ${res.statusCode}`));
    });
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", reject);
    req.end();
  });
}

/**
 * One node agent per node, each with that node's kubelet root and a cache store folder beside it
 * (host-path backend). The warm-up is short: simulated pods turn Ready at once. With the store
 * driver on (`cluster up --store-driver`), each real node's agent also serves the driver and its
 * peers, as the chart's do, and the cluster waits until every such kubelet has registered it.
 */
async function startNodeAgents(ctx: RoleContext): Promise<void> {
  const driver = ctx.state.storeDriver;
  const storage = driver ? kubeConfig(ctx).makeApiClient(k8s.StorageV1Api) : undefined;
  if (storage) {
    ctx.progress(`creating the CSIDriver ${STORE_DRIVER}`);
    await createStoreDriverObject(storage);
  }
  const serving: [string, ProcessRecord][] = [];
  for (const node of ctx.state.nodes) {
    const port = await freePort();
    const store = join(dirname(node.kubeletRoot), "store");
    const served = driver?.nodes.includes(node.name) && node.address ? node.address : undefined;
    if (served) await writePeerToken(kubeConfig(ctx), driver!.peerTls, node.name);
    ctx.progress(
      `starting the node agent of ${node.name} (store ${store}, metrics on port ${port}` +
        `${served ? `, serving ${STORE_DRIVER}, peers at ${served}` : ""})`,
    );
    const rec = await ctx.launch(`node-agent-${node.name}`, [
      "node-agent",
      `--node=${node.name}`,
      `--kubelet-root=${node.kubeletRoot}`,
      `--store=${store}`,
      // A real node's kubelet writes its containers' logs here; a simulated node has none.
      `--pod-logs-dir=${node.podLogsDir ?? join(dirname(node.kubeletRoot), "pod-logs")}`,
      "--warmup=1s",
      "--resync=15s",
      // A real node's captures are flushed before commit, as in production: unflushed, the kernel
      // writes a capture back while the restores it released start, and they stall behind it.
      ...(node.real ? [] : ["--no-durable"]),
      ...(served
        ? storeDriverArgs(
            { name: node.name, kubeletRoot: node.kubeletRoot, address: served },
            driver!.peerTls,
          )
        : ["--host=127.0.0.1"]),
      `--port=${port}`,
    ]);
    await waitUntil(
      `the node agent of ${node.name}`,
      rec,
      async () => (await fetch(`http://127.0.0.1:${port}/healthz`)).ok,
    );
    if (served) serving.push([node.name, rec]);
  }
  if (!storage || !serving.length) return;
  ctx.progress(
    `waiting for the kubelets of ${serving.map(([n]) => n).join(", ")} to register ${STORE_DRIVER}`,
  );
  for (const [name, rec] of serving)
    await waitUntil(
      `the kubelet of ${name} to register ${STORE_DRIVER} (CSINode)`,
      rec,
      () => storeDriverRegistered(storage, name),
      60_000,
    );
}

function kubeConfig(ctx: RoleContext): k8s.KubeConfig {
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(ctx.state.kubeconfig);
  return kc;
}
