import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { createLogger } from "../common/log.js";
import type { ModelCacheObject, StartupRecord } from "../common/modelcache.js";
import { compileFactors } from "../core/startup.js";
import { createNodeAgentMetrics } from "./metrics.js";
import type { AgentParts } from "./parts.js";
import { StartupReadings } from "./startups.js";

const SHORT = "0123456789abcdef";
const NOW = Date.parse("2026-12-01T10:00:30Z");
const VLLM_HIT = [
  "2026-12-01T10:00:01.000000000Z stdout F INFO 12-01 10:00:01 [default_loader.py:262] Loading weights took 2.50 seconds",
  "2026-12-01T10:00:02.000000000Z stdout F INFO 12-01 10:00:02 [backends.py:215] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.501 s",
  "2026-12-01T10:00:03.000000000Z stdout F INFO 12-01 10:00:03 [monitor.py:34] torch.compile took 0.60 s in total",
].join("\n");
const VLLM_MISS = VLLM_HIT.replace(
  "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.501 s",
  "Compiling a graph for compile range (1, 8192) takes 9.10 s",
);

function pod(uid: string, role: string, readyAt = "2026-12-01T10:00:04Z"): k8s.V1Pod {
  return {
    metadata: {
      name: `engine-${uid}`,
      namespace: "ns",
      uid,
      labels: { "warmstart.dev/hash": SHORT },
      annotations: { "warmstart.dev/role": role, "warmstart.dev/hash": SHORT.repeat(4) },
    },
    spec: { nodeName: "gpu-1", containers: [{ name: "engine", env: [{ name: "VLLM_X", value: "1" }] }] },
    status: { conditions: [{ type: "Ready", status: "True", lastTransitionTime: new Date(readyAt) }] },
  };
}

async function harness(product: string, leader?: StartupRecord) {
  const dir = await mkdtemp(join(tmpdir(), "startups-"));
  const record: ModelCacheObject = {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: SHORT },
    spec: { hash: SHORT.repeat(4) },
    status: { phase: "Ready", leaderUid: "the-leader", ...(leader ? { startups: [leader] } : {}) },
  };
  const events: k8s.CoreV1Event[] = [];
  let writes = 0;
  let recordKnown = true;
  const parts = {
    cfg: { node: "gpu-1", podLogsDir: dir, kubeletRoot: join(dir, "kubelet") },
    log: createLogger("test", { level: "silent" }),
    metrics: createNodeAgentMetrics(),
    clock: { now: () => NOW },
    core: {
      listNode: () =>
        Promise.resolve({ items: [{ metadata: { labels: { "nvidia.com/gpu.product": product } } }] }),
      createNamespacedEvent: ({ body }: { body: k8s.CoreV1Event }) => (
        events.push(body),
        Promise.resolve(body)
      ),
    },
    records: {
      transition: (_: string, next: (c: ModelCacheObject) => Record<string, unknown> | undefined) => {
        const patch = next(record);
        if (!patch) return Promise.resolve({ cache: record, written: false });
        writes++;
        record.status = { ...record.status, ...patch };
        return Promise.resolve({ cache: record, written: true });
      },
    },
    record: () => (recordKnown ? record : undefined),
  } as unknown as AgentParts;
  const writeLog = async (p: k8s.V1Pod, text: string): Promise<void> => {
    const d = join(dir, `ns_${p.metadata!.name}_${p.metadata!.uid}`, "engine");
    await mkdir(d, { recursive: true });
    await writeFile(join(d, "0.log"), text);
  };
  /** A file in the pod's shadow (the kubelet's emptyDir folder), with its modification time. */
  const shadowFile = async (p: k8s.V1Pod, rel: string, at: Date): Promise<void> => {
    const f = join(
      dir,
      "kubelet",
      "pods",
      p.metadata!.uid!,
      "volumes",
      "kubernetes.io~empty-dir",
      "warmstart-shadow",
      rel,
    );
    await mkdir(join(f, ".."), { recursive: true });
    await writeFile(f, "x");
    await utimes(f, at, at);
  };
  return {
    readings: new StartupReadings(parts),
    shadowFile,
    /** A node agent restarted: same cluster, nothing remembered. */
    restarted: () => new StartupReadings(parts),
    /** Whether the informer holds the record yet. */
    knowRecord: (known: boolean) => void (recordKnown = known),
    record,
    events,
    writes: () => writes,
    writeLog,
    metrics: parts.metrics,
    done: () => rm(dir, { recursive: true, force: true }),
  };
}

const log = createLogger("test", { level: "silent" });

void test("a Ready restore's start is read from its log once: recorded, counted, and told in an Event", async () => {
  const h = await harness("NVIDIA-L40S");
  const p = pod("r1", "restore");
  await h.writeLog(p, VLLM_HIT);
  await h.readings.observe(p, log);
  await h.readings.observe(p, log);
  assert.equal(h.writes(), 1, "recorded once");
  const [e] = h.record.status!.startups!;
  assert.equal(e!.compileCache, "hit");
  assert.equal(e!.seconds.weightLoad, 2.5);
  assert.equal(e!.gpuProduct, "NVIDIA-L40S");
  assert.deepEqual(Object.keys(e!.factors ?? {}), ["VLLM_X"]);
  assert.deepEqual(
    h.events.map((x) => `${x.type} ${x.reason}`),
    ["Normal EngineStarted"],
  );
  assert.match(
    await h.metrics.registry.metrics(),
    /warmstart_compile_cache_total\{result="hit",role="restore"\} 1/,
  );
  await h.done();
});

void test("a restore that misses on another GPU product than the leader's gets a Warning with the cause", async () => {
  const leader: StartupRecord = {
    ...{ namespace: "ns", name: "engine-l", uid: "l", role: "leader", node: "gpu-0", engine: "vllm" },
    ...{ seconds: {}, compileCache: "miss", gpuProduct: "NVIDIA-L40S", factors: { VLLM_X: "x" } },
    at: "2026-12-01T09:00:00Z",
  };
  const h = await harness("NVIDIA-H100-80GB-HBM3", leader);
  const p = pod("r2", "follower");
  await h.writeLog(p, VLLM_MISS);
  await h.readings.observe(p, log);
  const e = h.record.status!.startups!.find((x) => x.uid === "r2")!;
  assert.equal(e.compileCache, "miss");
  assert.match(
    e.cause ?? "",
    /GPU product differs from the leader's: NVIDIA-H100-80GB-HBM3 here, NVIDIA-L40S/,
  );
  assert.equal(h.events[0]?.type, "Warning");
  assert.equal(h.events[0]?.reason, "CompileCacheMiss");
  assert.equal(h.record.status!.startups!.length, 2, "the leader's entry kept");
  await h.done();
});

void test("no engine lines yet: read again later, unless the pod has been Ready a while; not ours: never read", async () => {
  const h = await harness("NVIDIA-L40S");
  const fresh = pod("r3", "restore", "2026-12-01T10:00:29Z");
  await h.writeLog(fresh, "2026-12-01T10:00:01.000000000Z stdout F starting\n");
  await h.readings.observe(fresh, log);
  assert.equal(h.writes(), 0);
  await h.writeLog(fresh, VLLM_HIT);
  await h.readings.observe(fresh, log);
  assert.equal(h.writes(), 1, "the lines flushed after Ready are read");

  const old = pod("r4", "restore", "2026-12-01T09:00:00Z");
  await h.writeLog(old, "no engine here\n");
  await h.readings.observe(old, log);
  await h.writeLog(old, VLLM_HIT);
  await h.readings.observe(old, log);
  assert.equal(h.writes(), 1, "a pod Ready for a while without engine lines is not an engine: left alone");

  const cold = pod("c1", "cold");
  await h.writeLog(cold, VLLM_HIT);
  await h.readings.observe(cold, log);
  const notReady = pod("r5", "restore");
  notReady.status = { conditions: [] };
  await h.writeLog(notReady, VLLM_HIT);
  await h.readings.observe(notReady, log);
  assert.equal(h.writes(), 1, "a cold pod and a pod not Ready are not read");
  await h.done();
});

void test("forged stamps are not read: another cache's hash, or a leader the record does not name", async () => {
  const h = await harness("NVIDIA-L40S");
  const forged = pod("f1", "restore");
  forged.metadata!.annotations!["warmstart.dev/hash"] = "f".repeat(64);
  await h.writeLog(forged, VLLM_MISS);
  await h.readings.observe(forged, log);
  const fake = pod("f2", "leader");
  await h.writeLog(fake, VLLM_MISS);
  await h.readings.observe(fake, log);
  assert.equal(h.writes(), 0, "neither is recorded");
  const real = pod("the-leader", "leader");
  await h.writeLog(real, VLLM_MISS);
  await h.readings.observe(real, log);
  assert.deepEqual(
    h.record.status!.startups!.map((e) => `${e.role} ${e.uid} ${e.at}`),
    ["leader the-leader 2026-12-01T10:00:04.000Z"],
    "the named leader, at the time it turned Ready",
  );
  await h.done();
});

void test("a start seen before the informer holds its record is recorded once the record arrives", async () => {
  const h = await harness("NVIDIA-L40S");
  const p = pod("r3", "restore");
  await h.writeLog(p, VLLM_HIT);
  h.knowRecord(false);
  await h.readings.observe(p, log);
  assert.equal(h.writes(), 0, "nothing to write to yet");
  h.knowRecord(true);
  await h.readings.observe(p, log);
  assert.equal(h.writes(), 1, "recorded when the record is known");
  assert.deepEqual(
    h.events.map((x) => x.reason),
    ["EngineStarted"],
  );
  await h.done();
});

void test("a restarted node agent neither records a start twice nor tells it again", async () => {
  const h = await harness("NVIDIA-L40S");
  const p = pod("r4", "restore");
  await h.writeLog(p, VLLM_HIT);
  await h.readings.observe(p, log);
  await h.restarted().observe(p, log);
  assert.equal(h.writes(), 1);
  assert.equal(h.record.status!.startups!.length, 1);
  assert.equal(h.events.length, 1, "one Event for one start");
  await h.done();
});

/** vLLM's CPU build: no hit or miss line, only its warm-up ("the compilation") and init lines. */
function cpuBuildLog(warmup: number): string {
  const at = (s: number): string => new Date(Date.parse("2026-12-01T10:00:00Z") + s * 1000).toISOString();
  const line = (s: number, text: string): string =>
    `${at(s)} stdout F (Worker pid=9) INFO 12-01 10:00:${String(s).padStart(2, "0")} ${text}`;
  return [
    line(1, "[cpu_model_runner.py:87] Warming up model for the compilation..."),
    line(1 + warmup, "[cpu_model_runner.py:91] Warming up done."),
    line(
      1 + warmup,
      `[core.py:402] init engine (profile, create kv cache, warmup model) took ${warmup}.00 s`,
    ),
  ].join("\n");
}

void test("a restore on a busy node whose warm-up took longer than the leader's is a hit when its engine compiled nothing again; one that wrote compiled files is a miss that names one", async () => {
  const leader: StartupRecord = {
    ...{ namespace: "ns", name: "engine-l", uid: "l", role: "leader", node: "gpu-1", engine: "vllm" },
    ...{
      seconds: { compile: 26 },
      compileCache: "unknown",
      gpuProduct: "NVIDIA-L40S",
      factors: compileFactors([{ name: "VLLM_X", value: "1" }]),
    },
    at: "2026-12-01T09:00:00Z",
  };
  const h = await harness("NVIDIA-L40S", leader);
  const started = new Date("2026-12-01T10:00:00Z");
  const seeded = new Date("2026-12-01T09:00:00Z");
  const restored = (uid: string): k8s.V1Pod => {
    const p = pod(uid, "follower", "2026-12-01T10:00:29Z");
    p.status!.containerStatuses = [
      {
        name: "engine",
        ready: true,
        restartCount: 0,
        image: "",
        imageID: "",
        state: { running: { startedAt: started } },
      },
    ];
    return p;
  };
  const slow = restored("slow");
  await h.writeLog(slow, cpuBuildLog(28));
  await h.shadowFile(slow, "cache/torchinductor/ab/cab.so", seeded);
  await h.readings.observe(slow, log);
  const quick = restored("quick");
  await h.writeLog(quick, cpuBuildLog(5));
  await h.shadowFile(quick, "cache/torchinductor/ab/cab.so", seeded);
  await h.shadowFile(quick, "cache/torchinductor/cd/ccd.main.so", new Date("2026-12-01T10:00:03Z"));
  await h.readings.observe(quick, log);

  const byUid = new Map(h.record.status!.startups!.map((e) => [e.uid, e]));
  assert.equal(byUid.get("slow")?.seconds.compile, 28);
  assert.equal(byUid.get("slow")?.compileCache, "hit", "28 s of warm-up, nothing compiled again");
  assert.equal(byUid.get("quick")?.compileCache, "miss", "5 s, and a kernel compiled again");
  assert.match(
    byUid.get("quick")?.cause ?? "",
    /vllm wrote 1 file into its restored caches after it started \(cache\/torchinductor\/cd\/ccd\.main\.so\)/,
  );
  assert.deepEqual(
    h.events.map((e) => `${e.involvedObject.uid} ${e.reason}`),
    ["slow EngineStarted", "quick CompileCacheMiss"],
  );
  await h.done();
});
