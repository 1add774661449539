import assert from "node:assert/strict";
import { test } from "node:test";
import type { StartupRecord } from "../api/modelcache.js";
import { readEngineLog } from "./engine-log.js";
import {
  STARTUPS_KEPT,
  compileFactors,
  describeStartup,
  judgedCompileCache,
  missCause,
  startupRecord,
  withStartup,
} from "./startup.js";

const entry = (o: Partial<StartupRecord> = {}): StartupRecord => ({
  namespace: "ns",
  name: "p",
  uid: "u",
  role: "restore",
  node: "n1",
  engine: "vllm",
  seconds: {},
  compileCache: "miss",
  gpuProduct: "NVIDIA-L40S",
  at: "2026-12-01T00:00:00.000Z",
  ...o,
});

test("compile factors: the engines' settings by digest, never device indexes, cache paths or credentials", () => {
  const f = compileFactors([
    { name: "VLLM_ATTENTION_BACKEND", value: "FLASHINFER" },
    { name: "TORCHINDUCTOR_MAX_AUTOTUNE", value: "1" },
    { name: "CUDA_VISIBLE_DEVICES", value: "3" },
    { name: "NVIDIA_VISIBLE_DEVICES", value: "GPU-1234" },
    { name: "VLLM_CACHE_ROOT", value: "/cache" },
    { name: "VLLM_API_KEY", valueFrom: { secretKeyRef: { name: "s", key: "k" } } },
    { name: "HF_TOKEN", value: "hf_secret" },
    { name: "PATH", value: "/bin" },
    { name: "NCCL_ALGO", valueFrom: { configMapKeyRef: { name: "c", key: "k" } } },
  ]);
  assert.deepEqual(Object.keys(f).sort(), [
    "NCCL_ALGO",
    "TORCHINDUCTOR_MAX_AUTOTUNE",
    "VLLM_ATTENTION_BACKEND",
  ]);
  assert.match(f.VLLM_ATTENTION_BACKEND!, /^[0-9a-f]{12}$/);
  assert.ok(!JSON.stringify(f).includes("FLASHINFER"), "values are kept as digests only");
  assert.notEqual(
    compileFactors([{ name: "VLLM_X", value: "a" }]).VLLM_X,
    compileFactors([{ name: "VLLM_X", value: "b" }]).VLLM_X,
  );
});

test("compile factors from a pod that declares thousands of variables are capped; absurd names are not factors", () => {
  const env = Array.from({ length: 5000 }, (_, i) => ({ name: `VLLM_X${i}`, value: "v" }));
  assert.equal(Object.keys(compileFactors(env)).length, 32);
  assert.deepEqual(compileFactors([{ name: `VLLM_${"X".repeat(1000)}`, value: "v" }]), {});
});

test("a miss is explained by the GPU product first, then the environment, then the engine", () => {
  const leader = entry({ role: "leader", node: "n0", factors: { VLLM_A: "111111111111" } });
  assert.equal(missCause(entry({ compileCache: "hit" }), leader), undefined, "a hit needs no cause");
  assert.equal(missCause(entry({ role: "leader" }), leader), undefined, "a leader compiles: nothing to hit");
  assert.match(missCause(entry(), undefined)!, /no record of the leader's start/);
  assert.equal(
    missCause(
      entry({ gpuProduct: "other" }),
      leader,
      "'function' object has no attribute 'finalize_loading'",
    ),
    "vllm says: 'function' object has no attribute 'finalize_loading'",
    "the engine's own reason first",
  );
  const gpu = missCause(entry({ gpuProduct: "NVIDIA-H100-80GB-HBM3" }), leader)!;
  assert.match(
    gpu,
    /GPU product differs from the leader's: NVIDIA-H100-80GB-HBM3 here, NVIDIA-L40S on the leader's node n0/,
  );
  assert.match(
    missCause(entry({ factors: { VLLM_A: "222222222222", VLLM_B: "333333333333" } }), leader)!,
    /environment differs from the leader's: VLLM_A, VLLM_B/,
  );
  assert.match(missCause(entry({ engine: "sglang", factors: leader.factors }), leader)!, /engine differs/);
  assert.match(missCause(entry({ factors: leader.factors }), leader)!, /outside the pod spec/);
});

test("the record keeps the newest leader's start and the latest others', at most STARTUPS_KEPT", () => {
  let list: StartupRecord[] = [
    entry({ uid: "old-leader", role: "leader" }),
    entry({ uid: "leader", role: "leader" }),
  ];
  for (let i = 0; i < 100; i++) list = withStartup(list, entry({ uid: `r${i}` }));
  assert.equal(list.length, STARTUPS_KEPT);
  assert.equal(
    list
      .filter((e) => e.role === "leader")
      .map((e) => e.uid)
      .join(),
    "leader",
  );
  assert.equal(list.at(-1)!.uid, "r99");
  assert.equal(list.filter((e) => e.uid === "r99").length, 1);
  assert.equal(
    withStartup(list, entry({ uid: "r99" })).filter((e) => e.uid === "r99").length,
    1,
    "one entry per pod",
  );
});

test("an entry from a vLLM log: phases rounded, engine and compile cache kept, described in one line", () => {
  const log = [
    "INFO 12-01 10:00:00 [default_loader.py:262] Loading weights took 12.345678 seconds",
    "INFO 12-01 10:00:01 [backends.py:215] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 2.501 s",
    "INFO 12-01 10:00:05 [monitor.py:34] torch.compile took 3.10 s in total",
  ].join("\n");
  const e = startupRecord({
    pod: { namespace: "ns", name: "p", uid: "u", role: "restore", node: "n1" },
    reading: readEngineLog(log),
    gpuProduct: "NVIDIA-L40S",
    factors: {},
    at: "2026-12-01T00:00:00.000Z",
  });
  assert.equal(e.engine, "vllm");
  assert.equal(e.compileCache, "hit");
  assert.equal(e.seconds.weightLoad, 12.35);
  assert.equal(e.seconds.compile, 3.1);
  assert.equal(e.factors, undefined, "no factors, no field");
  assert.match(describeStartup(e), /^vllm: weight load 12.35s, compile 3.1s.*\(compile cache hit\)$/);
});

test("a restore its engine says nothing about is judged by the leader's start: the config vLLM printed, then the compile time", () => {
  const config = { version: "0.32.0", dtype: "torch.bfloat16", max_seq_len: "256" };
  const leader = entry({ role: "leader", compileCache: "unknown", seconds: { compile: 18 }, config });
  const restore = (o: Partial<StartupRecord>): StartupRecord =>
    entry({ compileCache: "unknown", seconds: { compile: 3 }, config, ...o });

  assert.equal(judgedCompileCache(restore({}), leader), "hit", "a sixth of the leader's compile");
  assert.equal(judgedCompileCache(restore({ seconds: { compile: 12 } }), leader), "miss");
  const float32 = restore({ config: { ...config, dtype: "torch.float32" } });
  assert.equal(judgedCompileCache(float32, leader), "miss", "another dtype is a miss, however quick");
  assert.equal(
    missCause({ ...float32, compileCache: "miss" }, leader),
    "vllm's config differs from the leader's, and its compile cache is keyed on it: dtype torch.float32 here, torch.bfloat16 for the leader",
  );
  assert.match(
    missCause(restore({ compileCache: "miss", seconds: { compile: 12 } }), leader)!,
    /compiled for 12 s where the leader took 18 s: the restored compile cache was not used/,
  );
  // What the engine said stands; nothing is judged without a leader or a compile worth judging.
  assert.equal(judgedCompileCache(restore({ compileCache: "hit", seconds: { compile: 17 } }), leader), "hit");
  assert.equal(judgedCompileCache(restore({}), undefined), "unknown");
  assert.equal(judgedCompileCache(restore({}), { ...leader, seconds: { compile: 1 } }), "unknown");
  assert.equal(judgedCompileCache(restore({ seconds: {} }), leader), "unknown");
  assert.equal(judgedCompileCache({ ...leader }, leader), "unknown", "a leader is not judged");
});

test("what the restored engine wrote into its caches outweighs its compile time: a slow hit on a busy node, a quick miss", () => {
  const config = { version: "0.32.0", dtype: "torch.bfloat16" };
  const leader = entry({ role: "leader", compileCache: "unknown", seconds: { compile: 26 }, config });
  const restore = (compile: number): StartupRecord =>
    entry({ compileCache: "unknown", seconds: { compile }, config });

  // Two restores at once on two cores: 32 s of warm-up, and not one file compiled again.
  assert.equal(judgedCompileCache(restore(32.5), leader, { files: 0 }), "hit");
  assert.equal(judgedCompileCache(restore(32.5), leader), "miss", "without the files, time decides");
  const wrote = { files: 3, example: "cache/torchinductor/cd/cdz.main.so" };
  assert.equal(judgedCompileCache(restore(4), leader, wrote), "miss");
  assert.equal(
    missCause({ ...restore(4), compileCache: "miss" }, leader, undefined, wrote),
    "vllm wrote 3 files into its restored caches after it started (cache/torchinductor/cd/cdz.main.so): it compiled what the restored cache did not hold, with the same GPU product, environment and engine config as the leader",
  );
  // The config line still comes first; an engine that compiled nothing (eager) is not judged.
  const float32 = entry({
    compileCache: "unknown",
    seconds: { compile: 4 },
    config: { ...config, dtype: "torch.float32" },
  });
  assert.equal(judgedCompileCache(float32, leader, { files: 0 }), "miss");
  assert.equal(
    judgedCompileCache(entry({ compileCache: "unknown", seconds: {}, config }), leader, { files: 0 }),
    "unknown",
  );
});
