/**
 * `npm run bench:e2e [-- --replicas 2,4,8,16] [--engine stand-in|vllm] [--out DIR]`: N replicas of one model in real
 * containers on the local cluster's real node, fetching from the local model hub (one throttled
 * link shared by all), with Warmstart's election off (the namespace opts out: every replica
 * downloads) and on, side by side in one run. It reports bytes the hub served, time to first and
 * to all Ready, each restore's read time against the disk's own read bandwidth measured in the
 * same run, each restore's time to Ready against its floor (the same replica restarted on its node
 * with the tree hot: its pod deleted and its replacement timed the same way) and against the
 * engine's own (its engine container restarted in place: no pod, no Warmstart step), and the CPU
 * and memory of each Warmstart role; a table on stdout, JSON and a PNG plot in the output
 * folder. N=1 is one restore alone: the leader first, then one replica more once its cache is
 * Ready, so no other replica contends with it. Election on runs `--repeat` times per N (a fresh
 * model each time): one restore and one floor are single samples on a shared machine, so the goal
 * is judged on the median of the runs' ratios, shown with their range. `--follower-mode gate,wait`
 * runs election on once per follower mode (the webhook restarted with it): gated followers hold
 * no node and no GPU while they wait; waiting followers run at once and hold theirs, and the
 * table shows those GPU-seconds beside what each mode costs in time.
 *
 * `--engine vllm` runs real vLLM (its CPU build, `cluster up --vllm`) serving the hub's tiny model,
 * one pod per replica (each on its own port of the node's network); each run is its own cache (an
 * env entry only the hash reads). A second table says where each restored replica's start went,
 * from the engine's own lines as the node agent recorded them (download, load, compile, init).
 */
import { execFile } from "node:child_process";
import { request as httpsRequest } from "node:https";
import { randomBytes } from "node:crypto";
import { mkdir, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { cpus, loadavg } from "node:os";
import { join } from "node:path";
import { parseArgs, promisify } from "node:util";
import * as k8s from "@kubernetes/client-node";
import Table from "cli-table3";
import { getModelCache } from "../src/common/modelcache.js";
import { ANN_ROLE, INIT_PREWARM, SKIP } from "../src/core/contract.js";
import { seedOutcome } from "../src/core/waiting.js";
import { readEngineLog, type EnginePhase } from "../src/core/engine-log.js";
import {
  startClusterProcessAgain,
  stopClusterProcess,
  up,
  type ClusterState,
} from "../tools/localcluster/cluster.js";
import {
  containerLogDir,
  engineDeployment,
  parseEngineReport,
  vllmServerPod,
} from "../tools/localcluster/engine-chart.js";
import { setNodeGpus } from "../tools/localcluster/nodes.js";
import { processStartTime } from "../tools/localcluster/processes.js";
import { plotByN } from "./plot.js";

const run = promisify(execFile);
const MiB = 2 ** 20;
const TIMEOUT_MS = 30 * 60_000;

const { values } = parseArgs({
  options: {
    replicas: { type: "string", default: "1,2,4,8,16" },
    out: { type: "string", default: ".bench/e2e" },
    "compile-seconds": { type: "string", default: "2" },
    repeat: { type: "string", default: "3" },
    "follower-mode": { type: "string", default: "gate" },
    engine: { type: "string", default: "stand-in" },
  },
});
const engine = values.engine;
if (engine !== "stand-in" && engine !== "vllm")
  throw new Error(`--engine: expected stand-in or vllm, got "${engine}"`);
const followerModes = values["follower-mode"].split(",").map((x) => x.trim());
for (const m of followerModes)
  if (m !== "gate" && m !== "wait")
    throw new Error(`--follower-mode: expected gate, wait or both, got "${m}"`);
const repeat = Number(values.repeat);
if (!Number.isInteger(repeat) || repeat < 1)
  throw new Error(`--repeat: expected 1 or more, got "${values.repeat}"`);
const counts = values.replicas
  .split(",")
  .map((x) => Number(x.trim()))
  .filter((n) => Number.isInteger(n) && n > 0);
if (counts.length === 0) throw new Error(`--replicas: expected a list like 2,4,8, got "${values.replicas}"`);

type Mode = "off" | "on";
type FollowerMode = "gate" | "wait";

interface RoleUsage {
  cpuSeconds: number;
  peakRssMiB: number;
}

interface RunResult {
  replicas: number;
  election: Mode;
  /** Which of the `--repeat` runs of this N with election on (0 with election off). */
  run: number;
  /** With election on: how its followers waited. */
  followerMode?: FollowerMode;
  /** GPU-seconds followers held while they waited for the cache (0 when gated: no GPU held). */
  waitGpuSeconds: number;
  modelBytes: number;
  hubBytes: number;
  firstReadySeconds: number;
  allReadySeconds: number;
  leaderFetchSeconds?: number;
  /** Per restored replica: from its release (scheduled) to Ready. */
  restoreSeconds: number[];
  /** Per restored replica: the prewarm init container's read of the whole tree. */
  prewarmSeconds: number[];
  /** The floor: one restored replica's pod replaced on its node with the tree hot, to Ready. */
  floorSeconds?: number;
  /** The engine's own: that replica's engine container restarted in place, to Ready again. */
  engineRestartSeconds?: number;
  treeBytes?: number;
  /** The first restored replica's start by phase, as its engine logged it (the record's entry). */
  restorePhases?: Partial<Record<EnginePhase, number>>;
  restoreCompileCache?: string;
  roles: Record<string, RoleUsage>;
}

const log = (line: string): void => void process.stderr.write(`[bench:e2e] ${line}\n`);

const state = await up({
  nodes: 2,
  gpusPerNode: 4,
  realNodes: 1,
  hubModelMiB: 256,
  hubMiBs: 64,
  csi: false,
  bare: false,
  vllm: engine === "vllm",
  progress: log,
});
const node = state.nodes.find((n) => n.real);
if (!node?.podLogsDir || !state.images || !state.roles.modelHub)
  throw new Error(
    "bench:e2e needs a local cluster with a real node (bin/warmstart cluster down, then run again)",
  );
if (engine === "vllm" && (!state.images.vllm || !state.models?.tiny))
  throw new Error("bench:e2e --engine vllm needs real vLLM (bin/warmstart cluster down, then run again)");
const kc = new k8s.KubeConfig();
kc.loadFromFile(state.kubeconfig);
const core = kc.makeApiClient(k8s.CoreV1Api);
const apps = kc.makeApiClient(k8s.AppsV1Api);
const custom = kc.makeApiClient(k8s.CustomObjectsApi);
const hub = state.roles.modelHub;
const store = join(node.kubeletRoot, "..", "store");

const loadBefore = loadavg();
const diskMBs = await diskReadMBs(store);
log(`disk read bandwidth under ${store}: ${diskMBs.toFixed(0)} MB/s (O_DIRECT)`);

const results: RunResult[] = [];
const started = Date.now();
for (const n of counts) {
  await setNodeGpus(core, node.name, Math.max(n, 4));
  log(`${n} replicas, election off`);
  results.push(await runOnce(n, "off", 0));
  for (const fm of followerModes as FollowerMode[]) {
    await webhookFollowerMode(fm);
    for (let r = 0; r < repeat; r++) {
      log(`${n} replicas, election on, followers ${fm}${repeat > 1 ? ` (run ${r + 1} of ${repeat})` : ""}`);
      results.push(await runOnce(n, "on", r, fm));
    }
  }
}
await webhookFollowerMode(undefined);
await setNodeGpus(core, node.name, 4);
const loadAfter = loadavg();

await mkdir(values.out, { recursive: true });
const machine = {
  cpus: cpus().length,
  loadBefore: loadBefore.map((x) => Number(x.toFixed(2))),
  loadAfter: loadAfter.map((x) => Number(x.toFixed(2))),
  diskReadMBs: Number(diskMBs.toFixed(0)),
  hubMiBs: 64,
  minutes: Number(((Date.now() - started) / 60_000).toFixed(1)),
};
await writeFile(join(values.out, "e2e.json"), JSON.stringify({ machine, results }, null, 2));
await writeFile(join(values.out, "e2e.png"), await plot(results));
printTable(results);
process.stdout.write(
  `\nmachine: ${machine.cpus} CPUs, load ${machine.loadBefore.join(" ")} before, ${machine.loadAfter.join(" ")} after; ` +
    `disk ${machine.diskReadMBs} MB/s; hub ${machine.hubMiBs} MiB/s shared; ${machine.minutes} min\n` +
    `written: ${join(values.out, "e2e.json")}, ${join(values.out, "e2e.png")}\n`,
);
process.exit(0);

/** The cluster's webhook restarted with this follower mode (undefined: its own default). */
async function webhookFollowerMode(fm: FollowerMode | undefined): Promise<void> {
  await stopClusterProcess("webhook");
  await startClusterProcessAgain("webhook", undefined, { WARMSTART_FOLLOWER_MODE: fm });
  await until("the webhook healthy", () => healthz(state.roles.webhook!));
}

function healthz(url: string): Promise<true | undefined> {
  return new Promise((resolve) => {
    // Our own child on loopback: the API server checks its certificate, not this probe.
    const req = httpsRequest(`${url}/healthz`, { rejectUnauthorized: false, timeout: 2000 }, (res) => {
      res.resume();
      resolve(res.statusCode === 200 || undefined);
    });
    req.on("error", () => resolve(undefined));
    req.on("timeout", () => req.destroy());
    req.end();
  });
}

/** How a run's replicas are made. */
interface Replicas {
  model: string;
  create(n: number): Promise<void>;
  /** One replica more (N=1: the restore, once its leader's cache is Ready). */
  grow(): Promise<void>;
  /** A deleted replica's replacement, where no controller makes one. */
  replace?(pod: k8s.V1Pod): Promise<void>;
}

/** The stand-in's Deployment, of a model of its own. */
function standInReplicas(ns: string, model: string): Replicas {
  return {
    model,
    async create(n) {
      await apps.createNamespacedDeployment({
        namespace: ns,
        body: engineDeployment({
          replicas: n,
          model,
          node: node!.name,
          hub,
          image: state.images!.engine,
          compileSeconds: Number(values["compile-seconds"]),
        }),
      });
    },
    async grow() {
      await apps.patchNamespacedDeploymentScale(
        { name: "engine", namespace: ns, body: [{ op: "replace", path: "/spec/replicas", value: 2 }] },
        k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch),
      );
    },
  };
}

/**
 * Real vLLM servers, one pod each on its own port; the run's tag in an env entry vLLM never reads
 * makes the run's cache its own (the model is the hub's one real model).
 */
function vllmReplicas(ns: string, tag: string): Replicas {
  const server = (i: number): k8s.V1Pod =>
    vllmServerPod({
      name: `engine-${i}`,
      node: node!.name,
      image: state.images!.vllm!,
      model: state.models!.tiny,
      hub,
      port: 18300 + i,
      env: [{ name: "BENCH_RUN", value: tag }],
    });
  let made = 0;
  const make = async (): Promise<void> => {
    await core.createNamespacedPod({ namespace: ns, body: server(made++) });
  };
  return {
    model: state.models!.tiny,
    async create(n) {
      for (let i = 0; i < n; i++) await make();
    },
    grow: make,
    async replace(pod) {
      const name = pod.metadata!.name!;
      await until(`${ns}/${name} gone`, async () =>
        (await core.readNamespacedPod({ name, namespace: ns }).then(
          () => false,
          () => true,
        ))
          ? true
          : undefined,
      );
      await core.createNamespacedPod({ namespace: ns, body: server(Number(name.split("-")[1])) });
    },
  };
}

async function runOnce(n: number, mode: Mode, run: number, followerMode?: FollowerMode): Promise<RunResult> {
  const tag = randomBytes(3).toString("hex");
  const ns = `bench-${mode}-${n}-${tag}`;
  const replicas =
    engine === "vllm" ? vllmReplicas(ns, tag) : standInReplicas(ns, `synthetic/bench-${n}-${mode}-${tag}`);
  const model = replicas.model;
  await core.createNamespace({
    body: { metadata: { name: ns, labels: mode === "off" ? { [SKIP]: "true" } : {} } },
  });
  await until("the default ServiceAccount", () =>
    core.readNamespacedServiceAccount({ name: "default", namespace: ns }),
  );
  const files = (await (await fetch(`${hub}/api/models/${model}/tree/main?recursive=true`)).json()) as {
    size: number;
  }[];
  const modelBytes = files.reduce((a, f) => a + f.size, 0);
  const hubBefore = (await hubServed())[model]?.bytes ?? 0;
  const sampler = sampleRoles(state, ["webhook", "server", `node-agent-${node!.name}`]);

  // N=1: one restore alone, after its leader (the Deployment grows to 2 once the cache is Ready).
  const alone = n === 1 && mode === "on";
  const target = alone ? 2 : n;
  let grown = false;
  const t0 = Date.now();
  await replicas.create(n);
  // Observed times (ms), polled: condition timestamps only have whole seconds.
  const seen = new Map<string, { pod: k8s.V1Pod; scheduled?: number; ready?: number }>();
  const deadline = Date.now() + TIMEOUT_MS;
  for (;;) {
    const now = Date.now();
    for (const p of (await core.listNamespacedPod({ namespace: ns })).items) {
      if (p.metadata?.deletionTimestamp) continue;
      const e = seen.get(p.metadata!.name!) ?? { pod: p };
      e.pod = p;
      if (p.spec?.nodeName && e.scheduled === undefined) e.scheduled = now;
      if (
        p.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") &&
        e.ready === undefined
      )
        e.ready = now;
      seen.set(p.metadata!.name!, e);
    }
    const ready = [...seen.values()].filter((e) => e.ready !== undefined);
    if (ready.length >= target) break;
    if (alone && !grown && ready.length === 1) {
      const short = ready[0]!.pod.metadata?.labels?.["warmstart.dev/hash"];
      if (short && (await getModelCache(custom, short))?.status?.phase === "Ready") {
        await replicas.grow();
        grown = true;
      }
    }
    if (now > deadline)
      throw new Error(`${ns}: only ${ready.length} of ${n} Ready after ${TIMEOUT_MS / 60_000} min`);
    await sleep(200);
  }
  const roles = await sampler.stop();
  const served = await hubServed();
  const entries = [...seen.values()].filter((e) => e.ready !== undefined);
  const readyAt = entries.map((e) => e.ready! - t0).sort((a, b) => a - b);

  const leader = entries.find((e) => e.pod.metadata?.annotations?.[ANN_ROLE] === "leader");
  const restored = entries.filter((e) =>
    ["follower", "restore"].includes(e.pod.metadata?.annotations?.[ANN_ROLE] ?? ""),
  );
  const result: RunResult = {
    replicas: n,
    election: mode,
    run,
    ...(followerMode ? { followerMode } : {}),
    // One GPU each: a waiting follower holds its GPU from its start until its seed stops waiting.
    waitGpuSeconds: restored.reduce((a, e) => a + (seedOutcome(e.pod)?.waitedMs ?? 0) / 1000, 0),
    modelBytes,
    hubBytes: (served[model]?.bytes ?? 0) - hubBefore,
    firstReadySeconds: readyAt[0]! / 1000,
    allReadySeconds: readyAt[readyAt.length - 1]! / 1000,
    restoreSeconds: restored.map((e) => (e.ready! - e.scheduled!) / 1000),
    prewarmSeconds: [],
    roles,
  };
  if (leader) {
    const report = await engineReportOf(leader.pod);
    result.leaderFetchSeconds =
      report?.fetchSeconds ?? readEngineLog(await logOf(leader.pod, "engine")).seconds.download;
    const short = leader.pod.metadata?.labels?.["warmstart.dev/hash"];
    const cache = short ? await getModelCache(custom, short) : undefined;
    result.treeBytes = (cache?.status as { sizeBytes?: number } | undefined)?.sizeBytes;
    const first = restored[0]?.pod.metadata?.uid;
    // The node agent records a start shortly after Ready.
    const entry = first
      ? await until(
          "the restored replica's start on the record",
          async () =>
            (short ? await getModelCache(custom, short) : undefined)?.status?.startups?.find(
              (x) => x.uid === first,
            ),
          60_000,
        ).catch(() => undefined)
      : undefined;
    if (entry) [result.restorePhases, result.restoreCompileCache] = [entry.seconds, entry.compileCache];
  }
  for (const e of restored) {
    const secs = await prewarmSeconds(e.pod);
    if (secs !== undefined) result.prewarmSeconds.push(secs);
  }
  if (restored[0]) {
    result.engineRestartSeconds = await engineRestartSeconds(restored[0].pod);
    result.floorSeconds = await hotRestartSeconds(restored[0].pod, replicas);
  }
  await core.deleteNamespace({ name: ns, gracePeriodSeconds: 0 });
  await until(
    `${ns}'s pods gone`,
    async () => (await core.listNamespacedPod({ namespace: ns })).items.length === 0 || undefined,
    300_000,
  );
  return result;
}

/**
 * The engine's own restart: its container killed and started again by the kubelet in the same pod
 * (no init container runs again), timed from the kill to the container Ready again.
 */
async function engineRestartSeconds(pod: k8s.V1Pod): Promise<number> {
  const { name, namespace } = pod.metadata as { name: string; namespace: string };
  const engine = async (): Promise<k8s.V1ContainerStatus> => {
    const p = await core.readNamespacedPod({ name, namespace });
    return p.status!.containerStatuses!.find((c) => c.name === "engine")!;
  };
  const before = await engine();
  const id = before.containerID!.replace(/^containerd:\/\//, "");
  const socket = join(node!.kubeletRoot, "..", "containerd.sock");
  const killed = Date.now();
  await run("ctr", ["--address", socket, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", id]);
  const deadline = killed + 300_000;
  for (;;) {
    const s = await engine();
    if (s.ready && s.restartCount > before.restartCount) return (Date.now() - killed) / 1000;
    if (Date.now() > deadline) throw new Error(`${namespace}/${name}: the engine did not restart Ready`);
    await sleep(100);
  }
}

/** The replica restarted on its node with the tree hot: its pod deleted, the replacement timed. */
async function hotRestartSeconds(pod: k8s.V1Pod, replicas: Replicas): Promise<number> {
  const { name, namespace } = pod.metadata as { name: string; namespace: string };
  const others = new Set((await core.listNamespacedPod({ namespace })).items.map((p) => p.metadata!.uid));
  await core.deleteNamespacedPod({ name, namespace, gracePeriodSeconds: 0 });
  await replicas.replace?.(pod);
  let scheduled: number | undefined;
  const deadline = Date.now() + 300_000;
  for (;;) {
    const now = Date.now();
    const fresh = (await core.listNamespacedPod({ namespace })).items.find(
      (p) => !others.has(p.metadata!.uid) && !p.metadata?.deletionTimestamp,
    );
    if (fresh?.spec?.nodeName && scheduled === undefined) scheduled = now;
    if (
      scheduled !== undefined &&
      fresh?.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True")
    )
      return (now - scheduled) / 1000;
    if (now > deadline) throw new Error(`${namespace}: the replacement of ${name} did not turn Ready`);
    await sleep(200);
  }
}

async function hubServed(): Promise<Record<string, { bytes: number }>> {
  return ((await (await fetch(`${hub}/_stats`)).json()) as { repos: Record<string, { bytes: number }> })
    .repos;
}

async function engineReportOf(pod: k8s.V1Pod): Promise<ReturnType<typeof parseEngineReport>> {
  return parseEngineReport(await logOf(pod, "engine"));
}

async function prewarmSeconds(pod: k8s.V1Pod): Promise<number | undefined> {
  const m = / in ([\d.]+) s /.exec(await logOf(pod, INIT_PREWARM));
  return m ? Number(m[1]) : undefined;
}

async function logOf(pod: k8s.V1Pod, container: string): Promise<string> {
  const dir = containerLogDir(node!.podLogsDir!, pod, container);
  const files = (await readdir(dir).catch(() => [] as string[])).filter((f) => f.endsWith(".log"));
  return (await Promise.all(files.map((f) => readFile(join(dir, f), "utf8")))).join("");
}

/** CPU seconds used and peak RSS of some of the cluster's processes while a run lasts. */
function sampleRoles(st: ClusterState, names: string[]): { stop(): Promise<Record<string, RoleUsage>> } {
  const procs = st.processes.filter((p) => names.includes(p.name));
  const start = new Map<string, number>();
  const peak = new Map<string, number>();
  const sample = async (): Promise<void> => {
    for (const p of procs) {
      const rss = await rssMiB(p.pid);
      if (rss !== undefined) peak.set(p.name, Math.max(peak.get(p.name) ?? 0, rss));
    }
  };
  const ready = Promise.all(procs.map(async (p) => start.set(p.name, (await cpuSeconds(p.pid)) ?? 0)));
  const timer = setInterval(() => void sample(), 500);
  return {
    async stop() {
      clearInterval(timer);
      await ready;
      await sample();
      const out: Record<string, RoleUsage> = {};
      for (const p of procs) {
        if (!(await processStartTime(p.pid))) continue;
        out[p.name] = {
          cpuSeconds: Number((((await cpuSeconds(p.pid)) ?? 0) - (start.get(p.name) ?? 0)).toFixed(2)),
          peakRssMiB: Number((peak.get(p.name) ?? 0).toFixed(0)),
        };
      }
      return out;
    },
  };
}

async function cpuSeconds(pid: number): Promise<number | undefined> {
  const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => "");
  if (!stat) return undefined;
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return (Number(f[11]) + Number(f[12])) / 100; // utime + stime, in clock ticks (USER_HZ = 100)
}

async function rssMiB(pid: number): Promise<number | undefined> {
  const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
  const m = /^VmRSS:\s+(\d+) kB/m.exec(status);
  return m ? Number(m[1]) / 1024 : undefined;
}

/** Read bandwidth of the disk under `dir`, bypassing the page cache (what a cold restore reads at). */
async function diskReadMBs(dir: string): Promise<number> {
  await mkdir(dir, { recursive: true });
  const file = join(dir, `.bench-read-${randomBytes(3).toString("hex")}`);
  try {
    await run("dd", ["if=/dev/urandom", `of=${file}`, "bs=4M", "count=128", "conv=fsync"]);
    const { stderr } = await run("dd", [`if=${file}`, "of=/dev/null", "bs=4M", "iflag=direct"]);
    const m = /([\d.]+) s, /.exec(stderr);
    return m ? (128 * 4 * MiB) / 1e6 / Number(m[1]) : NaN;
  } finally {
    await rm(file, { force: true });
  }
}

function mean(xs: number[]): number | undefined {
  return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : undefined;
}

function fmt(x: number | undefined, d = 1): string {
  return x === undefined || Number.isNaN(x) ? "-" : x.toFixed(d);
}

function storageLimitSeconds(r: RunResult): number | undefined {
  return r.treeBytes ? r.treeBytes / 1e6 / diskMBs : undefined;
}

/** Mean restore over the engine's floor. */
function floorRatio(r: RunResult): number | undefined {
  const restore = mean(r.restoreSeconds);
  return restore !== undefined && r.floorSeconds ? restore / r.floorSeconds : undefined;
}

function ratio(x: number | undefined): string {
  return x === undefined ? "-" : `${x.toFixed(2)}x`;
}

function median(xs: number[]): number | undefined {
  if (xs.length === 0) return undefined;
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? s[m] : (s[m - 1]! + s[m]!) / 2;
}

/** off, or on with its follower mode (`on` alone when the run set only one). */
function label(r: RunResult): string {
  return r.election === "off" ? "off" : followerModes.length > 1 ? `on, ${r.followerMode}` : "on";
}

function printTable(rs: RunResult[]): void {
  const t = new Table({
    head: [
      "N",
      "election",
      "hub MiB",
      "first Ready s",
      "all Ready s",
      "GPU-s waiting",
      "restore s (mean)",
      "floor s (engine's own restart s)",
      "restore / floor",
      "prewarm s / limit s",
      "webhook CPU s / MiB",
      "server CPU s / MiB",
      "node agent CPU s / MiB",
    ],
    style: { head: [], border: [] },
  });
  for (const r of rs) {
    const role = (prefix: string): string => {
      const e = Object.entries(r.roles).find(([k]) => k.startsWith(prefix))?.[1];
      return e ? `${e.cpuSeconds.toFixed(1)} / ${e.peakRssMiB}` : "-";
    };
    const limit = storageLimitSeconds(r);
    t.push([
      r.replicas,
      label(r) + (r.election === "on" && repeat > 1 ? ` (run ${r.run + 1})` : ""),
      fmt(r.hubBytes / MiB, 0),
      fmt(r.firstReadySeconds),
      fmt(r.allReadySeconds),
      r.election === "on" ? fmt(r.waitGpuSeconds) : "-",
      fmt(mean(r.restoreSeconds)),
      `${fmt(r.floorSeconds)} (${fmt(r.engineRestartSeconds)})`,
      ratio(floorRatio(r)),
      r.election === "on" ? `${fmt(mean(r.prewarmSeconds), 2)} / ${fmt(limit, 2)}` : "-",
      role("webhook"),
      role("server"),
      role("node-agent"),
    ]);
  }
  process.stdout.write(`${t.toString()}\n\n`);
  printPhases(rs);
  process.stdout.write(`\ngoals (election on):\n`);
  for (const n of new Set(rs.map((r) => r.replicas))) {
    const runs = rs.filter((x) => x.election === "on" && x.replicas === n);
    const ratios = runs.map(floorRatio).filter((x): x is number => x !== undefined);
    const hub = Math.max(...runs.map((r) => r.hubBytes));
    const oneModel = runs.every((r) => r.hubBytes <= r.modelBytes);
    const over = runs.map((r) => r.allReadySeconds - r.firstReadySeconds - Math.max(...r.restoreSeconds, 0));
    const reads = runs.flatMap((r) => {
      const prewarm = mean(r.prewarmSeconds);
      const limit = storageLimitSeconds(r);
      return prewarm && limit ? [prewarm / limit] : [];
    });
    process.stdout.write(
      `  N=${n}: hub bytes ${oneModel ? "=" : ">"} one model (at most ${fmt(hub / MiB, 0)} of ${fmt(runs[0]!.modelBytes / MiB, 0)} MiB); ` +
        `all Ready within ${fmt(median(over))} s (median) of leader Ready + one restore; ` +
        `restore read ${ratio(median(reads))} the storage limit; ` +
        `restore ${ratio(median(ratios))} the hot restart's, median of ${ratios.length} ` +
        `(${ratios.length ? `${ratio(Math.min(...ratios))} to ${ratio(Math.max(...ratios))}; ` : ""}goal: within 1.10x at N=1 and N=2)\n`,
    );
  }
}

/** Where the first restored replica's start went, by its engine's own lines. */
function printPhases(rs: RunResult[]): void {
  const phases: [EnginePhase, string][] = [
    ["download", "download s"],
    ["weightLoad", "weight load s"],
    ["modelLoad", "model load s"],
    ["compile", "compile s"],
    ["cudaGraph", "CUDA graphs s"],
    ["engineInit", "engine init s"],
    ["ready", "log start to ready s"],
  ];
  const t = new Table({
    head: ["N", "election", "restore s", ...phases.map(([, h]) => h), "compile cache"],
    style: { head: [], border: [] },
  });
  for (const r of rs.filter((x) => x.restorePhases))
    t.push([
      r.replicas,
      label(r) + (repeat > 1 ? ` (run ${r.run + 1})` : ""),
      fmt(r.restoreSeconds[0]),
      ...phases.map(([p]) => fmt(r.restorePhases![p], 2)),
      r.restoreCompileCache ?? "-",
    ]);
  process.stdout.write(
    `where the first restored replica's start went (${engine}'s own lines):\n${t.toString()}\n`,
  );
}

async function plot(rs: RunResult[]): Promise<Buffer> {
  return plotByN({
    title: "N replicas of one model: Warmstart's election off vs on",
    xTitle: "replicas",
    series: "election",
    // One point per N and mode: the median of its runs.
    rows: [...new Set(rs.map((r) => `${r.replicas} ${label(r)}`))].flatMap((key) => {
      const runs = rs.filter((r) => `${r.replicas} ${label(r)}` === key);
      const N = runs[0]!.replicas;
      const election = label(runs[0]!);
      const at = (f: (r: RunResult) => number): number => median(runs.map(f))!;
      return [
        { N, election, metric: "hub MiB served", value: at((r) => r.hubBytes / MiB) },
        { N, election, metric: "all Ready (s)", value: at((r) => r.allReadySeconds) },
        { N, election, metric: "first Ready (s)", value: at((r) => r.firstReadySeconds) },
      ];
    }),
  });
}

async function until<T>(what: string, check: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check().catch(() => undefined);
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`bench:e2e: timed out waiting for ${what}`);
    await sleep(250);
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
