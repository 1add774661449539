/**
 * `warmstart demo`: the whole story on the local cluster, in real containers on its real node.
 * A chart of 3 engine replicas (the engine stand-in, vLLM's command line) is admitted: one is
 * elected to download from the local model hub while the others wait gated; its warmed cache is
 * captured and promoted; the waiting replicas start from it (init containers in the Warmstart
 * image); a scale-up restores directly. The summary is measured: bytes the hub served, and each
 * replica's time to Ready. `--vllm` tells it with real vLLM (its CPU build) serving the hub's tiny
 * model: one server pod per replica, each on its own port of the node's network, and each
 * replica's start as vLLM's own lines say (what the node agent recorded).
 */
import { randomBytes } from "node:crypto";
import { readFile, readdir } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import * as k8s from "@kubernetes/client-node";
import Table from "cli-table3";
import { isNotFound, makeApiClient } from "../../src/common/kube.js";
import { getModelCache } from "../../src/common/modelcache.js";
import { ANN_ROLE, LABEL_HASH, SCHEDULING_GATE } from "../../src/core/contract.js";
import { up, type ClusterState } from "../localcluster/cluster.js";
import {
  containerLogDir,
  engineDeployment,
  parseEngineReport,
  vllmServerPod,
} from "../localcluster/engine-chart.js";

const NS = "warmstart-demo";
const STAND_IN_MODEL = "synthetic/demo-7b";
const jsonPatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch);
const MiB = 2 ** 20;

const out = {
  step: (n: number, total: number, title: string): void =>
    void process.stdout.write(`\n[${n}/${total}] ${title}\n`),
  line: (text: string): void => void process.stdout.write(`      ${text}\n`),
};

async function until<T>(
  what: string,
  check: () => Promise<T | undefined | false>,
  timeoutMs = 240_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check().catch(() => undefined);
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`demo: timed out waiting for ${what}`);
    await sleep(250);
  }
}

const ms = (t: Date | string | undefined): number | undefined => (t ? new Date(t).getTime() : undefined);
const cond = (p: k8s.V1Pod, type: string): k8s.V1PodCondition | undefined =>
  p.status?.conditions?.find((c) => c.type === type);
const isReady = (p: k8s.V1Pod): boolean => cond(p, "Ready")?.status === "True";
const role = (p: k8s.V1Pod): string => p.metadata?.annotations?.[ANN_ROLE] ?? "-";

/**
 * Seconds from when the pod could start to Ready: from creation, or for a follower from its
 * release (when it was scheduled), so the time it waited gated is not counted as its own.
 */
function readySeconds(p: k8s.V1Pod): number | undefined {
  const ready = isReady(p) ? ms(cond(p, "Ready")?.lastTransitionTime) : undefined;
  const from =
    role(p) === "follower"
      ? ms(cond(p, "PodScheduled")?.lastTransitionTime)
      : ms(p.metadata?.creationTimestamp);
  return ready !== undefined && from !== undefined ? (ready - from) / 1000 : undefined;
}

/** The demo's replicas: the stand-in's Deployment, or one real vLLM server pod per replica. */
interface Replicas {
  model: string;
  what: string;
  scaleTo(n: number): Promise<void>;
  list(): Promise<k8s.V1Pod[]>;
  /** One line on how this replica started, once its engine has said so. */
  describe(p: k8s.V1Pod, leaderPod: k8s.V1Pod): Promise<string>;
}

export async function runDemo(o: { vllm?: boolean } = {}): Promise<void> {
  const total = 7;
  out.step(
    1,
    total,
    "a real local Kubernetes cluster: a kubelet node running containers, simulated GPU nodes, every role",
  );
  const state: ClusterState = await up({
    nodes: 2,
    gpusPerNode: 4,
    realNodes: 1,
    hubModelMiB: 256,
    hubMiBs: 64,
    csi: false,
    bare: false,
    vllm: Boolean(o.vllm),
    progress: (l) => out.line(l),
  });
  const node = state.nodes.find((n) => n.real);
  if (!node?.podLogsDir || !state.images || !state.roles.modelHub) {
    throw new Error(
      "demo: the local cluster has no real node (it was started with --real-nodes 0); run `bin/warmstart cluster down` first",
    );
  }
  const hub = state.roles.modelHub;
  out.line("simulated here: no GPU (nvidia.com/gpu is an extended resource on the node); the model");
  out.line(`hub is local (${hub}, 64 MiB/s shared by all clients, like one uplink).`);
  out.line(
    o.vllm
      ? "the engine is real vLLM (its CPU build) serving a small real model with random weights."
      : "the engine is a stand-in that downloads with the real huggingface_hub client and writes compile caches.",
  );

  const kc = new k8s.KubeConfig();
  kc.loadFromFile(state.kubeconfig);
  const core = makeApiClient(kc, k8s.CoreV1Api);
  const apps = makeApiClient(kc, k8s.AppsV1Api);
  const custom = makeApiClient(kc, k8s.CustomObjectsApi);
  await resetNamespace(core);

  // Each run is a cache of its own (the hash reads the env), so a second demo elects again.
  const env = [{ name: "DEMO_RUN", value: randomBytes(3).toString("hex") }];
  const replicas = o.vllm
    ? vllmReplicas(core, custom, state, node.name, env)
    : standInReplicas(apps, core, state, node.name, node.podLogsDir, env);
  const model = replicas.model;
  const hubBytes = async (): Promise<number> => {
    const s = (await (await fetch(`${hub}/_stats`)).json()) as { repos: Record<string, { bytes: number }> };
    return s.repos[model]?.bytes ?? 0;
  };
  const listing = await fetch(`${hub}/api/models/${model}/tree/main?recursive=true`);
  const files = (await listing.json()) as { size: number }[];
  const modelBytes = files.reduce((n, f) => n + f.size, 0);
  const servedBefore = await hubBytes();
  const size =
    modelBytes < 10 * MiB ? `${(modelBytes / MiB).toFixed(1)} MiB` : `${(modelBytes / MiB).toFixed(0)} MiB`;

  out.step(
    2,
    total,
    `a chart: 3 replicas of ${replicas.what} serving ${model} (${size}), nothing Warmstart-specific in it`,
  );
  await replicas.scaleTo(3);
  const workers = (): Promise<k8s.V1Pod[]> => replicas.list();
  let pods = await until("3 replicas", async () => ((await workers()).length === 3 ? workers() : undefined));
  const leader = pods.find((p) => role(p) === "leader");
  if (!leader) throw new Error("demo: no leader was elected (is the webhook running with election on?)");
  const short = leader.metadata!.labels![LABEL_HASH]!;
  out.line(
    `admission elected one leader for cache ${short}; the other 2 wait gated, holding no node and no GPU:`,
  );
  out.line(podTable(pods));

  out.step(3, total, "the leader downloads from the hub with huggingface_hub, compiles, and turns Ready");
  let shown = -1;
  await until("the leader Ready", async () => {
    const served = (await hubBytes()) - servedBefore;
    const pct = Math.floor((served / modelBytes) * 10);
    if (pct !== shown) {
      shown = pct;
      out.line(`hub served ${(served / MiB).toFixed(0)} of ${(modelBytes / MiB).toFixed(0)} MiB`);
    }
    const p = await core.readNamespacedPod({ name: leader.metadata!.name!, namespace: NS });
    return isReady(p) ? p : undefined;
  });
  out.line(
    await replicas.describe(
      await core.readNamespacedPod({ name: leader.metadata!.name!, namespace: NS }),
      leader,
    ),
  );

  out.step(4, total, "the node agent captures the warmed cache; promote makes it a read-only claim");
  let last = "";
  const cache = await until("the cache to be Ready", async () => {
    const mc = await getModelCache(custom, short);
    const phase = mc?.status?.phase ?? "Electing";
    if (phase !== last)
      out.line(`ModelCache ${short}: ${(last = phase)}${mc?.status?.reason ? ` (${mc.status.reason})` : ""}`);
    if (phase === "Failed")
      throw new Error(`demo: capture failed: ${mc?.status?.message ?? ""} (logs in ${state.stateDir}/logs)`);
    return phase === "Ready" ? mc : undefined;
  });
  const st = cache.status as { files?: number; sizeBytes?: number; captureSeconds?: number } | undefined;
  out.line(
    `${st?.files ?? "?"} files, ${((st?.sizeBytes ?? 0) / MiB).toFixed(0)} MiB captured in ${(st?.captureSeconds ?? 0).toFixed(1)}s`,
  );

  out.step(
    5,
    total,
    "the waiting replicas are released: wait-ready, seed and prewarm run in containers, then the engine",
  );
  pods = await until("3 replicas Ready", async () => {
    const ps = await workers();
    return ps.length === 3 && ps.every(isReady) ? ps : undefined;
  });
  out.line(podTable(pods));
  for (const p of pods.filter((x) => role(x) === "follower")) out.line(await replicas.describe(p, leader));

  out.step(6, total, "scale to 4: the new replica restores directly");
  await replicas.scaleTo(4);
  pods = await until("4 replicas Ready", async () => {
    const ps = await workers();
    return ps.length === 4 && ps.every(isReady) ? ps : undefined;
  });
  out.line(podTable(pods));
  const added = pods.find((p) => role(p) === "restore");
  if (added) out.line(await replicas.describe(added, leader));

  out.step(7, total, "what it saved (measured)");
  const served = (await hubBytes()) - servedBefore;
  const leaderSecs = readySeconds(pods.find((p) => role(p) === "leader")!) ?? 0;
  const restored = pods.filter((p) => role(p) !== "leader");
  const restoredSecs = restored.map(readySeconds).filter((x): x is number => x !== undefined);
  const mean = restoredSecs.reduce((a, b) => a + b, 0) / Math.max(restoredSecs.length, 1);
  const saved = restoredSecs.reduce((n, s) => n + Math.max(leaderSecs - s, 0), 0);
  const t = new Table({ style: { head: [], border: [] } });
  t.push(
    ["bytes the hub served", `${(served / MiB).toFixed(0)} MiB`],
    [
      `${pods.length} independent downloads would have fetched`,
      `${((pods.length * modelBytes) / MiB).toFixed(0)} MiB`,
    ],
    ["leader: creation to Ready", `${leaderSecs.toFixed(1)} s`],
    [`restored (${restoredSecs.length}): start to Ready, mean`, `${mean.toFixed(1)} s`],
    ["time saved across restored replicas", `${saved.toFixed(1)} s`],
  );
  out.line(t.toString().split("\n").join("\n      "));
  out.line("");
  out.line(`dashboard:  ${state.roles.server ?? "(server not running)"}`);
  out.line(`try:        bin/warmstart caches   (and: pods, elections)`);
  out.line("stop with:  bin/warmstart cluster down");
  if (served > modelBytes) {
    throw new Error(`demo: the hub served ${served} B, more than one model (${modelBytes} B)`);
  }
}

async function resetNamespace(core: k8s.CoreV1Api): Promise<void> {
  await core.deleteNamespace({ name: NS, gracePeriodSeconds: 0 }).catch((err: unknown) => {
    if (!isNotFound(err)) throw err;
  });
  await until("the previous demo namespace to go", async () =>
    core.readNamespace({ name: NS }).then(
      () => false,
      (e: unknown) => isNotFound(e),
    ),
  );
  await core.createNamespace({ body: { metadata: { name: NS } } });
  await until("the default ServiceAccount", () =>
    core.readNamespacedServiceAccount({ name: "default", namespace: NS }),
  );
}

function standInReplicas(
  apps: k8s.AppsV1Api,
  core: k8s.CoreV1Api,
  state: ClusterState,
  node: string,
  podLogsDir: string,
  env: k8s.V1EnvVar[],
): Replicas {
  const chart = {
    env,
    model: STAND_IN_MODEL,
    node,
    hub: state.roles.modelHub!,
    image: state.images!.engine,
    compileSeconds: 3,
  };
  let created = false;
  return {
    model: STAND_IN_MODEL,
    what: "the engine stand-in (vLLM's command line)",
    async scaleTo(n) {
      if (!created) {
        created = true;
        await apps.createNamespacedDeployment({
          namespace: NS,
          body: engineDeployment({ ...chart, replicas: n }),
        });
        return;
      }
      await apps.patchNamespacedDeploymentScale(
        { name: "engine", namespace: NS, body: [{ op: "replace", path: "/spec/replicas", value: n }] },
        jsonPatch,
      );
    },
    list: async () => running(core, "app=engine"),
    async describe(p) {
      const r = await until(
        `the engine report of ${p.metadata?.name}`,
        async () => {
          const dir = containerLogDir(podLogsDir, p, "engine");
          const files = (await readdir(dir)).filter((f) => f.endsWith(".log")).sort();
          return parseEngineReport(
            (await Promise.all(files.map((f) => readFile(join(dir, f), "utf8")))).join(""),
          );
        },
        30_000,
      );
      return role(p) === "leader"
        ? `leader Ready: fetched ${(r.fetchedBytes / MiB).toFixed(0)} MiB in ${r.fetchSeconds.toFixed(1)}s, compile cache ${r.compileCache} in ${r.compileSeconds.toFixed(1)}s`
        : `${p.metadata!.name}: fetched ${r.fetchedBytes} B from the hub, compile cache ${r.compileCache}, write into the read-only tree: ${r.modelStore.error ?? "allowed"}`;
    },
  };
}

/** Real vLLM: one server pod per replica, each on its own port of the node's network. */
function vllmReplicas(
  core: k8s.CoreV1Api,
  custom: k8s.CustomObjectsApi,
  state: ClusterState,
  node: string,
  env: k8s.V1EnvVar[],
): Replicas {
  if (!state.images?.vllm || !state.models?.tiny)
    throw new Error("demo: this cluster has no real vLLM; run `bin/warmstart cluster down` first");
  const [image, model] = [state.images.vllm, state.models.tiny];
  let made = 0;
  return {
    model,
    what: "real vLLM",
    async scaleTo(n) {
      for (; made < n; made++) {
        const body = vllmServerPod({
          name: `vllm-${made}`,
          node,
          image,
          model,
          hub: state.roles.modelHub!,
          port: 18600 + made,
          env,
        });
        await core.createNamespacedPod({ namespace: NS, body });
      }
    },
    list: async () => running(core, "app=vllm"),
    async describe(p, leaderPod) {
      // The node agent reads vLLM's own lines when the pod turns Ready and records them.
      const start = await until(
        `${p.metadata?.name}'s start on the record`,
        async () =>
          (await getModelCache(custom, leaderPod.metadata!.labels![LABEL_HASH]!))?.status?.startups?.find(
            (e) => e.uid === p.metadata?.uid,
          ),
        60_000,
      );
      const s = start.seconds;
      const parts = [
        // vLLM times no download of its own; the hub's counter above says what was fetched.
        ...(s.download !== undefined ? [`download ${s.download}s`] : []),
        `weights loaded in ${s.weightLoad ?? "?"}s`,
        `vLLM's warm-up compile ${s.compile ?? "?"}s`,
        `"init engine ... took" ${s.engineInit ?? "?"}s`,
      ];
      const verdict =
        role(p) === "leader"
          ? ""
          : `; compile cache ${start.compileCache}${start.cause ? ` (${start.cause})` : ""}`;
      return `${p.metadata!.name} (${role(p)}), from vLLM's log: ${parts.join(", ")}${verdict}`;
    },
  };
}

async function running(core: k8s.CoreV1Api, labelSelector: string): Promise<k8s.V1Pod[]> {
  return (await core.listNamespacedPod({ namespace: NS, labelSelector })).items
    .filter((p) => !p.metadata?.deletionTimestamp)
    .sort((a, b) => a.metadata!.name!.localeCompare(b.metadata!.name!));
}

function podTable(pods: k8s.V1Pod[]): string {
  const t = new Table({
    head: ["POD", "ROLE", "GATED", "NODE", "PHASE", "READY IN"],
    style: { head: [], border: [] },
  });
  for (const p of pods) {
    const gated = (p.spec?.schedulingGates ?? []).some((g) => g.name === SCHEDULING_GATE);
    const secs = readySeconds(p);
    t.push([
      p.metadata!.name!,
      role(p),
      gated ? "yes" : "no",
      p.spec?.nodeName ?? "-",
      p.status?.phase ?? "Pending",
      secs === undefined ? "-" : `${secs.toFixed(1)}s`,
    ]);
  }
  return t.toString().split("\n").join("\n      ");
}
