import { request as httpsRequest } from "node:https";
import { request as httpRequest } from "node:http";
import { mkdir, open, readFile, readdir, rename, rm, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import * as k8s from "@kubernetes/client-node";
import { ensureBinaries } from "./build.js";
import { createCA, createSigningKeyPair, issueCert } from "../../src/common/certs.js";
import {
  freePort,
  isAlive,
  processStartTime,
  startAgain,
  startDetached,
  stopProcess,
  type ProcessRecord,
} from "./processes.js";
import { ensureSimulatedNode } from "./nodes.js";
import { ensureHostPackages } from "./host-packages.js";
import { clearNodeLinks, realNodeAddress, shapeNodeLinks } from "./links.js";
import { startCsi, type CsiState } from "./csi/stack.js";
import { buildImages, writeImageArchive } from "./images/build.js";
import { TINY_MODEL } from "./images/vllm.js";
import {
  findTasks,
  killTasks,
  realNodePaths,
  startRealNode,
  stopContainers,
  unmountUnder,
} from "./realnode.js";
import { GANG_FEATURE_GATES, PACKAGE_ROOT, VERSIONS, binDir, stateDir } from "./versions.js";
import { SYSTEM_NAMESPACE, isAlreadyExists } from "../../src/common/kube.js";
import { startRoles, type RoleUrls } from "./roles.js";
import {
  checkStoreDriverOptions,
  enableStoreDriver,
  storeDriverWanted,
  type StoreDriverState,
} from "./store-driver.js";
import type { SharingScope } from "../../src/core/contract.js";

export interface ClusterOptions {
  nodes: number;
  gpusPerNode: number;
  /** Kubelet nodes that run real containers (SPEC 5), beside the simulated ones. */
  realNodes: number;
  /** Each real node's uplink to its peers, Mbit/s (links.ts); unshaped when absent. */
  nodeLinkMbit?: number;
  /** Size of every synthetic model the local hub serves, and the bandwidth all its clients share. */
  hubModelMiB: number;
  hubMiBs: number;
  /** The CSI stack on the first real node (driver stand-in, sidecars, classes). */
  csi: boolean;
  /**
   * Warmstart's own CSI driver and peer certificates on every real node's agent (store-driver.ts):
   * true asks for it, false leaves it off; unset, it is on wherever it can be (real nodes, roles).
   */
  storeDriver?: boolean;
  bare: boolean;
  /** The webhook's sharing scope (the product's default is `namespace`; the demo and tests share). */
  sharingScope?: SharingScope;
  /**
   * Real vLLM on every real node, and the hub's real tiny model (images/vllm.ts). Off by default:
   * about 5.5 GiB an image, imported into each real node.
   */
  vllm?: boolean;
  progress: (line: string) => void;
}

export interface NodeState {
  name: string;
  gpus: number;
  kubeletRoot: string;
  /** A kubelet node running real containers. */
  real?: boolean;
  /** Real nodes: where the kubelet writes container logs (`<ns>_<pod>_<uid>/<container>/N.log`). */
  podLogsDir?: string;
  /** Real nodes: the node's own loopback address, where its agent serves peers (links.ts). */
  address?: string;
}

export interface ClusterState {
  running: boolean;
  kubeconfig: string;
  apiServer: string;
  versions: typeof VERSIONS;
  startedAt: string;
  nodes: NodeState[];
  roles: RoleUrls;
  /** Images present on every real node (`vllm`: real vLLM, its CPU build, with `cluster up --vllm`). */
  images?: { warmstart: string; engine: string; engineAsUser: string; pause: string; vllm?: string };
  /** Real models the hub serves (`tiny`: one real vLLM loads and answers with). */
  models?: { tiny: string };
  /** The CSI stack, when it runs. */
  csi?: CsiState;
  /** Warmstart's own CSI driver, when the real nodes' agents serve it (`--store-driver`). */
  storeDriver?: StoreDriverState;
  /** Who shares a cache: the webhook's `--sharing-scope`. */
  sharingScope: SharingScope;
  /** The real nodes' uplinks, Mbit/s, when shaped. */
  nodeLinkMbit?: number;
  processes: ProcessRecord[];
  stateDir: string;
}

const STATE_FILE = "state.json";

export async function readState(dir = stateDir()): Promise<ClusterState | undefined> {
  try {
    return JSON.parse(await readFile(join(dir, STATE_FILE), "utf8")) as ClusterState;
  } catch {
    return undefined;
  }
}

async function writeState(state: ClusterState): Promise<void> {
  const file = join(state.stateDir, STATE_FILE);
  // Owner-only: it records the roles' environment (the cluster agent's token among it).
  await writeFile(`${file}.tmp`, JSON.stringify(state, null, 2), { mode: 0o600 });
  await rename(`${file}.tmp`, file);
}

/** Current status: the recorded state, with `running` true only if every process is alive. */
export async function status(dir = stateDir()): Promise<ClusterState | { running: false; stateDir: string }> {
  const state = await readState(dir);
  if (!state) return { running: false, stateDir: dir };
  const alive = await Promise.all(state.processes.map(isAlive));
  return { ...state, running: state.processes.length > 0 && alive.every(Boolean) };
}

/** One `up` or `down` at a time per state folder: an exclusive lock file naming its holder's pid. */
async function withLock<T>(dir: string, fn: () => Promise<T>): Promise<T> {
  await mkdir(dir, { recursive: true });
  const lock = join(dir, ".lock");
  for (let i = 0; ; i++) {
    try {
      const fh = await open(lock, "wx");
      await fh.writeFile(`${process.pid} ${await processStartTime(process.pid)}`);
      await fh.close();
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
      const [pid, start] = (await readFile(lock, "utf8").catch(() => "")).split(" ");
      const holderAlive = pid && (await processStartTime(Number(pid))) === start;
      if (!holderAlive) {
        await rm(lock, { force: true });
        continue;
      }
      if (i === 0) process.stderr.write(`waiting for another warmstart cluster command (pid ${pid})...\n`);
      await sleep(500);
    }
  }
  try {
    return await fn();
  } finally {
    await rm(lock, { force: true });
  }
}

export async function up(opts: ClusterOptions): Promise<ClusterState> {
  checkStoreDriverOptions(opts);
  const storeDriver = storeDriverWanted(opts);
  const dir = stateDir();
  return withLock(dir, async () => {
    const existing = await status(dir);
    if (existing.running) {
      const driverLater = storeDriver && !existing.storeDriver;
      // Its agents run without the driver: only a fresh cluster gets it (never quietly without,
      // when it was asked for by name).
      if (driverLater && existing.roles.webhook && opts.storeDriver)
        throw new Error(
          `a local cluster is already running (${existing.apiServer}) without the store driver: ` +
            "`cluster down`, then `cluster up --store-driver`",
        );
      opts.progress(`a local cluster is already running (${existing.apiServer}); reusing it`);
      // One started with --bare gets the roles when they are asked for now.
      if (!opts.bare && !existing.roles.webhook) {
        if (driverLater && existing.nodes.some((n) => n.real))
          existing.storeDriver = await enableStoreDriver(dir, existing.nodes, opts.progress);
        existing.roles = {
          ...existing.roles,
          ...(await startRoles({
            state: existing,
            launch: launchRole(existing, dir),
            progress: opts.progress,
          })),
        };
        await writeState(existing);
      }
      return existing;
    }
    if ("processes" in existing) {
      opts.progress("cleaning up a previous local cluster that is no longer complete");
      await teardown(existing);
    }
    const started = Date.now();
    const bins = await ensureBinaries(opts.progress);
    // A fresh state folder, keeping the lock this `up` holds (removing it would let another in).
    for (const e of await readdir(dir).catch(() => [] as string[]))
      if (e !== ".lock")
        await rm(join(dir, e), { recursive: true, force: true, maxRetries: 3 }).catch(() => undefined);
    await mkdir(join(dir, "logs"), { recursive: true });

    const state: ClusterState = {
      running: false,
      kubeconfig: join(dir, "kubeconfig"),
      apiServer: "",
      versions: VERSIONS,
      startedAt: new Date().toISOString(),
      nodes: [],
      roles: {},
      processes: [],
      stateDir: dir,
      sharingScope: opts.sharingScope ?? "cluster",
    };
    // Persist every pid as soon as it exists, so `down` can clean up even if this process dies midway.
    const launchCommand = async (
      name: string,
      command: string,
      args: string[],
      env?: Record<string, string>,
    ): Promise<ProcessRecord> => {
      const rec = await startDetached(name, command, args, { log: join(dir, "logs", `${name}.log`), env });
      state.processes.push(rec);
      await writeState(state);
      return rec;
    };
    const launch = async (name: string, args: string[], env?: Record<string, string>): Promise<void> => {
      await launchCommand(name, bins[name]!, args, env);
    };
    try {
      opts.progress("generating certificates");
      const pki = await writePki(dir);
      const [etcdClient, etcdPeer, apiPort, kcmPort, schedPort] = await Promise.all(
        Array.from({ length: 5 }, freePort),
      );
      state.apiServer = `https://127.0.0.1:${apiPort}`;
      await writeFile(state.kubeconfig, kubeconfigYaml(state.apiServer, pki));

      opts.progress("starting etcd");
      await launch("etcd", [
        `--name=warmstart`,
        `--data-dir=${join(dir, "etcd")}`,
        `--listen-client-urls=http://127.0.0.1:${etcdClient}`,
        `--advertise-client-urls=http://127.0.0.1:${etcdClient}`,
        `--listen-peer-urls=http://127.0.0.1:${etcdPeer}`,
        `--initial-advertise-peer-urls=http://127.0.0.1:${etcdPeer}`,
        `--initial-cluster=warmstart=http://127.0.0.1:${etcdPeer}`,
        "--unsafe-no-fsync",
        "--quota-backend-bytes=4294967296",
        "--log-level=warn",
      ]);
      await waitHttp(`http://127.0.0.1:${etcdClient}/health`, "etcd", state, 30_000);

      opts.progress("starting kube-apiserver");
      await launch("kube-apiserver", [
        `--etcd-servers=http://127.0.0.1:${etcdClient}`,
        "--advertise-address=127.0.0.1",
        "--bind-address=127.0.0.1",
        `--secure-port=${apiPort}`,
        `--tls-cert-file=${pki.serverCert}`,
        `--tls-private-key-file=${pki.serverKey}`,
        `--client-ca-file=${pki.caCert}`,
        // The API server presents a client certificate to webhooks (the webhook checks it).
        `--admission-control-config-file=${pki.admissionConfig}`,
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        `--service-account-key-file=${pki.saPub}`,
        `--service-account-signing-key-file=${pki.saKey}`,
        "--service-cluster-ip-range=10.0.0.0/24",
        "--authorization-mode=RBAC",
        "--allow-privileged=true",
        // No kube-proxy: a webhook behind a Service (the chart's) is called at its endpoints.
        "--enable-aggregator-routing=true",
        "--enable-priority-and-fairness=false",
        "--profiling=false",
        "--event-ttl=2h",
        // Kubernetes' own gang scheduling (the Workload API, alpha in 1.35): SPEC 5 "Gangs".
        `--feature-gates=${GANG_FEATURE_GATES}`,
        "--runtime-config=scheduling.k8s.io/v1alpha1=true",
        "--v=0",
      ]);
      await waitHttp(`${state.apiServer}/readyz`, "kube-apiserver", state, 120_000, pki);

      opts.progress("starting kube-controller-manager, kube-scheduler and KWOK");
      const kc = state.kubeconfig;
      await launch("kube-controller-manager", [
        `--kubeconfig=${kc}`,
        `--authentication-kubeconfig=${kc}`,
        `--authorization-kubeconfig=${kc}`,
        "--leader-elect=false",
        "--controllers=*",
        `--service-account-private-key-file=${pki.saKey}`,
        `--root-ca-file=${pki.caCert}`,
        "--bind-address=127.0.0.1",
        `--secure-port=${kcmPort}`,
        "--use-service-account-credentials=false",
        // Pre-bound claims made just before their volume otherwise wait for the 15 s resync.
        "--pvclaimbinder-sync-period=2s",
        `--feature-gates=${GANG_FEATURE_GATES}`,
        "--v=0",
      ]);
      await launch("kube-scheduler", [
        `--kubeconfig=${kc}`,
        `--authentication-kubeconfig=${kc}`,
        `--authorization-kubeconfig=${kc}`,
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        `--secure-port=${schedPort}`,
        `--feature-gates=${GANG_FEATURE_GATES}`,
        "--v=0",
      ]);
      const kwokHome = join(dir, "kwok-home");
      await mkdir(kwokHome, { recursive: true });
      await writeFile(join(dir, "kwok.yaml"), await kwokConfig());
      await launch(
        "kwok",
        [
          `--kubeconfig=${kc}`,
          `--config=${join(dir, "kwok.yaml")}`,
          "--manage-all-nodes=false",
          "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
          "--cidr=10.64.0.0/12",
        ],
        { HOME: kwokHome },
      );

      const kubeConfig = new k8s.KubeConfig();
      kubeConfig.loadFromFile(kc);
      const core = kubeConfig.makeApiClient(k8s.CoreV1Api);
      await ensureNamespace(core, SYSTEM_NAMESPACE);
      opts.progress(
        `creating ${opts.nodes} simulated GPU node(s) with ${opts.gpusPerNode} nvidia.com/gpu each`,
      );
      for (let i = 0; i < opts.nodes; i++) {
        const name = `gpu-${i}`;
        const kubeletRoot = join(dir, "nodes", name, "kubelet");
        await mkdir(join(kubeletRoot, "pods"), { recursive: true });
        await ensureSimulatedNode(core, { name, gpus: opts.gpusPerNode, kubeletRoot });
        state.nodes.push({ name, gpus: opts.gpusPerNode, kubeletRoot });
      }
      await waitFor("simulated nodes Ready", 60_000, state, async () => {
        const nodes = await core.listNode();
        return state.nodes.every((n) =>
          nodes.items.some(
            (x) =>
              x.metadata?.name === n.name &&
              x.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True"),
          ),
        );
      });
      // Pods are refused until the default ServiceAccount exists: it also shows the controller manager works.
      await waitFor("the default ServiceAccount", 60_000, state, async () => {
        await core.readNamespacedServiceAccount({ name: "default", namespace: "default" });
        return true;
      });
      await applyCrds(kubeConfig);

      if (opts.realNodes > 0) {
        await startRealNodes(opts, state, pki, bins.kubelet!, core, launchCommand);
        if (opts.nodeLinkMbit) {
          const addresses = state.nodes.flatMap((n) => (n.address ? [n.address] : []));
          await shapeNodeLinks(addresses, opts.nodeLinkMbit);
          state.nodeLinkMbit = opts.nodeLinkMbit;
          await writeState(state);
          opts.progress(
            `real nodes send to their peers at ${opts.nodeLinkMbit} Mbit/s each (${addresses.join(", ")})`,
          );
        }
        const first = state.nodes.find((n) => n.real)!;
        if (opts.csi) {
          state.csi = await startCsi({
            stateDir: dir,
            kubeconfig: state.kubeconfig,
            kc: kubeConfig,
            node: first.name,
            kubeletRoot: first.kubeletRoot,
            launch: launchCommand,
            progress: opts.progress,
          });
          await writeState(state);
        }
        if (storeDriver) {
          state.storeDriver = await enableStoreDriver(dir, state.nodes, opts.progress);
          await writeState(state);
        }
      }

      if (!opts.bare) {
        state.roles = {
          ...state.roles,
          ...(await startRoles({ state, launch: launchRole(state, dir), progress: opts.progress })),
        };
      }
      state.running = true;
      await writeState(state);
      opts.progress(`local cluster ready in ${((Date.now() - started) / 1000).toFixed(1)}s`);
      return state;
    } catch (err) {
      opts.progress(`start failed; stopping what was started (logs in ${join(dir, "logs")})`);
      await teardown(state);
      throw err;
    }
  });
}

/**
 * Stops one of a running cluster's processes (a role, a kubelet...) and keeps its record, so
 * `startProcessAgain` brings it back as it was; for tests that kill a role at a chosen moment.
 */
export async function stopClusterProcess(name: string, dir = stateDir()): Promise<void> {
  const state = await readState(dir);
  const rec = state?.processes.find((p) => p.name === name);
  if (!rec) throw new Error(`no process ${name} in the local cluster`);
  await stopProcess(rec);
}

/**
 * Starts a stopped process of the cluster again (a no-op when it runs) and records its new pid.
 * `env` changes its environment from now on (a key set to undefined is removed): a benchmark runs
 * a role in another mode this way (`WARMSTART_FOLLOWER_MODE=wait` for the webhook).
 */
export async function startClusterProcessAgain(
  name: string,
  dir = stateDir(),
  env: Record<string, string | undefined> = {},
): Promise<ProcessRecord> {
  return withLock(dir, async () => {
    const state = await readState(dir);
    const i = state?.processes.findIndex((p) => p.name === name) ?? -1;
    if (!state || i < 0) throw new Error(`no process ${name} in the local cluster`);
    const merged = { ...state.processes[i]!.env, ...env };
    for (const [k, v] of Object.entries(merged)) if (v === undefined) delete merged[k];
    const rec = await startAgain({ ...state.processes[i]!, env: merged as Record<string, string> });
    state.processes[i] = rec;
    await writeState(state);
    return rec;
  });
}

/** Roles are the warmstart command itself, run as a detached process with its own log. */
function launchRole(state: ClusterState, dir: string) {
  return async (name: string, args: string[], env: Record<string, string> = {}): Promise<ProcessRecord> => {
    const rec = await startDetached(name, process.execPath, [join(PACKAGE_ROOT, "bin/warmstart"), ...args], {
      log: join(dir, "logs", `${name}.log`),
      env: { KUBECONFIG: state.kubeconfig, WARMSTART_LOG_FORMAT: "json", ...env },
    });
    state.processes.push(rec);
    await writeState(state);
    return rec;
  };
}

export async function down(progress: (line: string) => void): Promise<{ stopped: string[] }> {
  const dir = stateDir();
  return withLock(dir, async () => {
    const state = await readState(dir);
    if (!state) {
      progress("no local cluster is running");
      return { stopped: [] };
    }
    const stopped = await teardown(state);
    await rm(dir, { recursive: true, force: true, maxRetries: 3 }).catch(() => undefined);
    await mkdir(dir, { recursive: true });
    progress(stopped.length ? `stopped ${stopped.join(", ")}` : "nothing was running");
    return { stopped };
  });
}

/**
 * Stops everything a cluster started and leaves no process or mount behind: the kubelets first
 * (so nothing restarts containers), then every container through its node's containerd, then
 * the other processes in reverse start order, then stray shims and the mounts under the state.
 */
async function teardown(state: ClusterState): Promise<string[]> {
  const isKubelet = (p: ProcessRecord): boolean => p.name.startsWith("kubelet-");
  // A real node is listed once Ready; one whose start was cut short is known by its containerd.
  const realNames = new Set([
    ...(state.nodes ?? []).filter((n) => n.real).map((n) => n.name),
    ...state.processes.filter((p) => p.name.startsWith("containerd-")).map((p) => p.name.slice(11)),
  ]);
  const real = [...realNames].map((name) => realNodePaths(state.stateDir, name));
  const tasks = (await Promise.all(real.map(findTasks))).flat();
  const stopped = await stopAll(state.processes.filter(isKubelet));
  for (const p of real) await stopContainers(p);
  stopped.unshift(...(await stopAll(state.processes.filter((p) => !isKubelet(p)))));
  await killTasks(tasks);
  await unmountUnder(state.stateDir);
  // Also what a test that shaped the links for itself may have left when it was killed.
  await clearNodeLinks();
  return stopped;
}

/** Real nodes: host packages, images (cached by content), the model hub, then each node. */
async function startRealNodes(
  opts: ClusterOptions,
  state: ClusterState,
  pki: Pki,
  kubelet: string,
  core: k8s.CoreV1Api,
  launch: (name: string, command: string, args: string[]) => Promise<ProcessRecord>,
): Promise<void> {
  await ensureHostPackages(opts.progress);
  opts.progress("building the images for the real nodes (cached by content)");
  const images = await buildImages(opts.progress, { vllm: Boolean(opts.vllm) });
  const archive = join(state.stateDir, "images.tar");
  await writeImageArchive(images.refs, archive);
  state.images = {
    warmstart: images.warmstart,
    engine: images.engine,
    engineAsUser: images.engineAsUser,
    pause: images.pause,
    ...(images.vllm ? { vllm: images.vllm } : {}),
  };
  if (images.tinyModel) state.models = { tiny: TINY_MODEL };

  const hubPort = await freePort();
  const hubUrl = `http://127.0.0.1:${hubPort}`;
  opts.progress(
    `starting the local model hub at ${hubUrl} (synthetic/<name>, ${opts.hubModelMiB} MiB each, ${opts.hubMiBs} MiB/s shared)`,
  );
  await launch("model-hub", process.execPath, [
    join(PACKAGE_ROOT, "dist/tools/localcluster/hub/main.js"),
    `--port=${hubPort}`,
    `--model-mib=${opts.hubModelMiB}`,
    `--mib-s=${opts.hubMiBs}`,
    ...(images.tinyModel ? [`--repo=${TINY_MODEL}=${images.tinyModel}`] : []),
  ]);
  await waitHttp(`${hubUrl}/healthz`, "the model hub", state, 30_000);
  state.roles.modelHub = hubUrl;

  for (let i = 0; i < opts.realNodes; i++) {
    const name = `real-${i}`;
    const p = await startRealNode({
      name,
      gpus: opts.gpusPerNode,
      stateDir: state.stateDir,
      kubeconfig: state.kubeconfig,
      caCert: pki.caCert,
      kubelet,
      pauseImage: images.pause,
      imageArchive: archive,
      launch,
      core,
      progress: opts.progress,
    });
    state.nodes.push({
      name,
      gpus: opts.gpusPerNode,
      kubeletRoot: p.kubeletRoot,
      real: true,
      podLogsDir: p.podLogsDir,
      address: realNodeAddress(i),
    });
    await writeState(state);
  }
  await rm(archive, { force: true });
}

/** Stop in reverse start order (roles, then KWOK and the control plane, etcd last). */
async function stopAll(processes: ProcessRecord[]): Promise<string[]> {
  const stopped: string[] = [];
  for (const rec of [...processes].reverse()) {
    if (await isAlive(rec)) stopped.push(rec.name);
    await stopProcess(rec);
  }
  return stopped;
}

interface Pki {
  caCert: string;
  serverCert: string;
  serverKey: string;
  adminCert: string;
  adminKey: string;
  saKey: string;
  saPub: string;
  admissionConfig: string;
}

/** The name on the certificate the API server presents to webhooks (the webhook's --client-name). */
export const WEBHOOK_CLIENT_CN = "warmstart-apiserver-webhook-client";

async function writePki(dir: string): Promise<Pki> {
  const pkiDir = join(dir, "pki");
  await mkdir(pkiDir, { recursive: true, mode: 0o700 });
  const ca = await createCA("warmstart-local-ca");
  const server = await issueCert(ca, {
    commonName: "kube-apiserver",
    dns: ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"],
    ips: ["127.0.0.1", "10.0.0.1"],
    usage: "server",
  });
  const admin = await issueCert(ca, {
    commonName: "warmstart-admin",
    organization: "system:masters",
    usage: "client",
  });
  const webhookClient = await issueCert(ca, { commonName: WEBHOOK_CLIENT_CN, usage: "client" });
  const sa = await createSigningKeyPair();
  const p = (f: string): string => join(pkiDir, f);
  // Webhook client authentication: the user '*' matches every webhook the API server calls.
  const webhookKubeconfig = [
    "apiVersion: v1",
    "kind: Config",
    "users:",
    "- name: '*'",
    "  user:",
    `    client-certificate: ${p("webhook-client.crt")}`,
    `    client-key: ${p("webhook-client.key")}`,
    "",
  ].join("\n");
  const admissionConfig = ["ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"]
    .map((plugin) =>
      [
        `- name: ${plugin}`,
        "  configuration:",
        "    apiVersion: apiserver.config.k8s.io/v1",
        "    kind: WebhookAdmissionConfiguration",
        `    kubeConfigFile: ${p("webhook-client.kubeconfig")}`,
      ].join("\n"),
    )
    .join("\n");
  await Promise.all([
    writeFile(p("ca.crt"), ca.cert),
    writeFile(p("ca.key"), ca.key, { mode: 0o600 }),
    writeFile(p("apiserver.crt"), server.cert),
    writeFile(p("apiserver.key"), server.key, { mode: 0o600 }),
    writeFile(p("admin.crt"), admin.cert),
    writeFile(p("admin.key"), admin.key, { mode: 0o600 }),
    writeFile(p("sa.key"), sa.privateKey, { mode: 0o600 }),
    writeFile(p("sa.pub"), sa.publicKey),
    writeFile(p("webhook-client.crt"), webhookClient.cert),
    writeFile(p("webhook-client.key"), webhookClient.key, { mode: 0o600 }),
    writeFile(p("webhook-client.kubeconfig"), webhookKubeconfig, { mode: 0o600 }),
    writeFile(
      p("admission.yaml"),
      `apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n${admissionConfig}\n`,
    ),
  ]);
  return {
    caCert: p("ca.crt"),
    serverCert: p("apiserver.crt"),
    serverKey: p("apiserver.key"),
    adminCert: p("admin.crt"),
    adminKey: p("admin.key"),
    saKey: p("sa.key"),
    saPub: p("sa.pub"),
    admissionConfig: p("admission.yaml"),
  };
}

function kubeconfigYaml(server: string, pki: Pki): string {
  return `apiVersion: v1
kind: Config
clusters:
- name: warmstart-local
  cluster:
    server: ${server}
    certificate-authority: ${pki.caCert}
users:
- name: warmstart-admin
  user:
    client-certificate: ${pki.adminCert}
    client-key: ${pki.adminKey}
contexts:
- name: warmstart-local
  context: { cluster: warmstart-local, user: warmstart-admin }
current-context: warmstart-local
`;
}

async function kwokConfig(): Promise<string> {
  const stages = join(binDir(), "kwok-stages");
  const files = [
    join(stages, "node/fast/node-initialize.yaml"),
    join(stages, "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml"),
    join(PACKAGE_ROOT, "tools/localcluster/kwok/pod-stages.yaml"),
    join(stages, "pod/fast/pod-complete.yaml"),
    join(stages, "pod/fast/pod-delete.yaml"),
  ];
  const docs = [
    [
      "apiVersion: config.kwok.x-k8s.io/v1alpha1",
      "kind: KwokConfiguration",
      "options:",
      "  nodeLeaseDurationSeconds: 40",
      "  nodeLeaseParallelism: 4",
      "  podPlayStageParallelism: 8",
      "  nodePlayStageParallelism: 4",
      "  podsOnNodeSyncParallelism: 2",
      "",
    ].join("\n"),
    ...(await Promise.all(files.map((f) => readFile(f, "utf8")))),
  ];
  return docs.join("\n---\n");
}

async function applyCrds(kc: k8s.KubeConfig): Promise<void> {
  const dir = join(PACKAGE_ROOT, "deploy/crds");
  if (!existsSync(dir)) return;
  const { readdir } = await import("node:fs/promises");
  const client = k8s.KubernetesObjectApi.makeApiClient(kc);
  for (const f of (await readdir(dir)).filter((x) => x.endsWith(".yaml")).sort()) {
    // loadAllYaml gives typed objects: plain ones lose fields the serializer does not know,
    // such as x-kubernetes-preserve-unknown-fields.
    for (const obj of k8s.loadAllYaml(
      await readFile(join(dir, f), "utf8"),
    ) as (k8s.KubernetesObject | null)[]) {
      if (!obj?.kind) continue;
      // Applied, not only created: a cluster brought up again gets the checkout's schema.
      await client.patch(
        obj,
        undefined,
        undefined,
        "warmstart-local-cluster",
        true,
        k8s.PatchStrategy.ServerSideApply,
      );
    }
  }
  const ext = kc.makeApiClient(k8s.ApiextensionsV1Api);
  await waitFor("CRDs established", 30_000, undefined, async () => {
    const list = await ext.listCustomResourceDefinition();
    return list.items.every((crd) =>
      crd.status?.conditions?.some((c) => c.type === "Established" && c.status === "True"),
    );
  });
}

async function ensureNamespace(core: k8s.CoreV1Api, name: string): Promise<void> {
  try {
    await core.createNamespace({ body: { metadata: { name } } });
  } catch (err) {
    if (!isAlreadyExists(err)) throw err;
  }
}

async function waitFor(
  what: string,
  timeoutMs: number,
  state: ClusterState | undefined,
  check: () => Promise<boolean>,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  let delay = 50;
  while (Date.now() < deadline) {
    try {
      if (await check()) return;
    } catch (err) {
      last = err;
    }
    if (state) await assertProcessesAlive(state);
    await sleep(delay);
    delay = Math.min(delay * 2, 1000);
  }
  throw new Error(
    `timed out waiting for ${what}${last ? `: ${String((last as Error).message ?? last)}` : ""}`,
  );
}

async function assertProcessesAlive(state: ClusterState): Promise<void> {
  for (const rec of state.processes) {
    if (!(await isAlive(rec))) {
      const log = await readFile(rec.log, "utf8").catch(() => "");
      throw new Error(`${rec.name} exited; last log lines:\n${log.split("\n").slice(-15).join("\n")}`);
    }
  }
}

function waitHttp(
  url: string,
  what: string,
  state: ClusterState,
  timeoutMs: number,
  pki?: Pki,
): Promise<void> {
  return waitFor(`${what} at ${url}`, timeoutMs, state, () => httpOk(url, pki));
}

async function httpOk(url: string, pki?: Pki): Promise<boolean> {
  const tls = pki
    ? {
        ca: await readFile(pki.caCert),
        cert: await readFile(pki.adminCert),
        key: await readFile(pki.adminKey),
      }
    : {};
  return new Promise((resolve, reject) => {
    const req = (url.startsWith("https") ? httpsRequest : httpRequest)(
      url,
      { ...tls, timeout: 2000 },
      (res) => {
        res.resume();
        resolve(res.statusCode === 200);
      },
    );
    req.on("timeout", () => req.destroy(new Error("timeout")));
    req.on("error", reject);
    req.end();
  });
}
