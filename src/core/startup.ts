/**
 * One pod's start as its engine told it (engine-log.ts), made into the record's entry, and why a
 * restored pod's compile cache missed where the leader's inputs can say. Pure.
 *
 * Engines key their compile caches on the device and on compile-relevant settings (vLLM hashes
 * its VLLM_* environment, the torch and Triton versions and the GPU's name and capability into the
 * torch.compile cache key), so a restore that misses is explained by comparing what it ran on
 * with what the leader ran on: the node's GPU product (nvidia.com/gpu.product) and the engine
 * container's compile-relevant environment, kept as digests (values may be secrets), and the
 * settings the engine printed (vLLM's config line: dtype, quantization, ...).
 *
 * Where the engine prints no hit or miss line (vLLM's CPU build compiles through torch.compile
 * alone and says neither), the restore is judged against the leader's start: a config vLLM keys its
 * cache on that differs is a miss, by vLLM's own lines; otherwise, where the node could look, what
 * the restored engine wrote into its caches decides (files compiled again: a miss; none: a hit);
 * where it could not, a compile that took at least half the leader's is a miss, a shorter one a hit.
 */
import { createHash } from "node:crypto";
import type * as k8s from "@kubernetes/client-node";
import type { StartupRecord } from "../api/modelcache.js";
import type { EngineLogReading } from "./engine-log.js";

/** What a restored engine wrote into its caches after it started (datapath/engine-writes.ts). */
export interface EngineWrites {
  files: number;
  /** One of them, relative to the cache root. */
  example?: string;
}

/** Environment prefixes the engines' compile caches depend on. */
const FACTOR_PREFIXES = ["VLLM_", "SGLANG_", "SGL_", "TORCH", "TRITON_", "CUDA_", "NVIDIA_", "NCCL_"];
/** Where a cache lives, which device indexes a replica got, and credentials: not compile inputs. */
const NOT_FACTORS = /(_DIR|_ROOT|_PATH|_HOME|_HOST|_PORT|_VISIBLE_DEVICES|_KEY|_TOKEN|_SECRET)$/;
/** The most factors kept per entry (an attacker's pod could declare thousands). */
const MAX_FACTORS = 32;

/**
 * The engine container's compile-relevant environment: name → 12 hex digits of the value's
 * digest (a value from a Secret or ConfigMap digests its reference, not its content).
 */
export function compileFactors(env: k8s.V1EnvVar[] | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of env ?? []) {
    if (Object.keys(out).length >= MAX_FACTORS) break;
    if (e.name.length > 128 || !FACTOR_PREFIXES.some((p) => e.name.startsWith(p))) continue;
    if (NOT_FACTORS.test(e.name)) continue;
    const value = e.valueFrom ? `valueFrom:${JSON.stringify(e.valueFrom)}` : (e.value ?? "");
    out[e.name] = createHash("sha256").update(value).digest("hex").slice(0, 12);
  }
  return out;
}

export interface StartupInput {
  pod: { namespace: string; name: string; uid: string; role: string; node: string };
  reading: EngineLogReading;
  gpuProduct?: string;
  factors: Record<string, string>;
  at: string;
}

/** The record's entry for one pod's start. */
export function startupRecord(i: StartupInput): StartupRecord {
  const seconds: StartupRecord["seconds"] = {};
  for (const [phase, s] of Object.entries(i.reading.seconds))
    if (typeof s === "number" && Number.isFinite(s)) seconds[phase] = Math.round(s * 100) / 100;
  return {
    ...i.pod,
    engine: i.reading.engine,
    seconds,
    compileCache: i.reading.compileCache,
    ...(i.gpuProduct ? { gpuProduct: i.gpuProduct.slice(0, 128) } : {}),
    ...(Object.keys(i.factors).length ? { factors: i.factors } : {}),
    ...(i.reading.config && Object.keys(i.reading.config).length ? { config: i.reading.config } : {}),
    at: i.at,
  };
}

/** A leader's compile shorter than this says too little to judge a restore's by. */
const JUDGED_COMPILE_SECONDS = 2;

/**
 * A restore's compile cache where its engine said neither hit nor miss, judged against the leader's
 * start (see the file comment); the engine's own line, where there is one, stands.
 */
export function judgedCompileCache(
  entry: StartupRecord,
  leader: StartupRecord | undefined,
  /** What the restored engine wrote into its caches after it started, where the node could look. */
  writes?: EngineWrites,
): StartupRecord["compileCache"] {
  if (entry.compileCache !== "unknown" || entry.role === "leader" || !leader) return entry.compileCache;
  if (configDiffers(entry, leader).length) return "miss";
  // Files are evidence; time is not, on a busy node (a hit compiled slower than a leader alone).
  if (writes)
    return writes.files > 0 ? "miss" : typeof entry.seconds.compile === "number" ? "hit" : "unknown";
  const [mine, theirs] = [entry.seconds.compile, leader.seconds.compile];
  if (typeof mine !== "number" || typeof theirs !== "number" || theirs < JUDGED_COMPILE_SECONDS)
    return "unknown";
  return mine >= theirs / 2 ? "miss" : "hit";
}

/** The engine settings printed by both starts that differ, as `key value here, value for the leader`. */
function configDiffers(entry: StartupRecord, leader: StartupRecord): string[] {
  const [mine, theirs] = [entry.config ?? {}, leader.config ?? {}];
  return Object.keys(mine)
    .filter((k) => k in theirs && mine[k] !== theirs[k])
    .sort()
    .map((k) => `${k} ${mine[k]} here, ${theirs[k]} for the leader`);
}

/**
 * Why a restored pod's compile cache missed, by what differs from the leader's start; undefined
 * when it did not miss or is the leader (a leader compiles: nothing was there to hit).
 */
export function missCause(
  entry: StartupRecord,
  leader: StartupRecord | undefined,
  /** The engine's own reason, where its miss line gives one: it says more than any comparison. */
  engineReason?: string,
  writes?: EngineWrites,
): string | undefined {
  if (entry.compileCache !== "miss" || entry.role === "leader") return undefined;
  if (engineReason) return `${entry.engine} says: ${engineReason}`;
  if (!leader) return "no record of the leader's start to compare with";
  const config = configDiffers(entry, leader);
  if (config.length)
    return `${entry.engine}'s config differs from the leader's, and its compile cache is keyed on it: ${config.slice(0, 4).join("; ")}`;
  if ((entry.gpuProduct ?? "") !== (leader.gpuProduct ?? ""))
    return `GPU product differs from the leader's: ${entry.gpuProduct || "none"} here, ${leader.gpuProduct || "none"} on the leader's node ${leader.node}; compile caches are built per device`;
  const mine = entry.factors ?? {};
  const theirs = leader.factors ?? {};
  const differs = [...new Set([...Object.keys(mine), ...Object.keys(theirs)])]
    .filter((k) => mine[k] !== theirs[k])
    .sort();
  if (differs.length)
    return `compile-relevant environment differs from the leader's: ${differs.slice(0, 8).join(", ")}${differs.length > 8 ? ", ..." : ""}`;
  if (entry.engine !== leader.engine)
    return `engine differs from the leader's: ${entry.engine}, ${leader.engine}`;
  if (writes?.files)
    return `${entry.engine} wrote ${writes.files} file${writes.files === 1 ? "" : "s"} into its restored caches after it started (${writes.example ?? "?"}): it compiled what the restored cache did not hold, with the same GPU product, environment and engine config as the leader`;
  const [compiled, leaderCompiled] = [entry.seconds.compile, leader.seconds.compile];
  if (typeof compiled === "number" && typeof leaderCompiled === "number" && compiled >= leaderCompiled / 2)
    return `compiled for ${compiled} s where the leader took ${leaderCompiled} s: the restored compile cache was not used, with the same GPU product, environment and engine config as the leader`;
  return "same GPU product and environment as the leader: the engine's version or compile settings outside the pod spec differ";
}

/** How many entries the record keeps: the newest leader's, then the latest others'. */
export const STARTUPS_KEPT = 30;

/** The record's list with one more entry: the newest leader's kept, the oldest others dropped. */
export function withStartup(list: StartupRecord[], entry: StartupRecord): StartupRecord[] {
  const all = [...list.filter((x) => x.uid !== entry.uid), entry];
  const leader = all.filter((x) => x.role === "leader").at(-1);
  const others = all.filter((x) => x !== leader);
  const kept = others.slice(-(STARTUPS_KEPT - (leader ? 1 : 0)));
  return all.filter((x) => x === leader || kept.includes(x));
}

/** One line for an Event or a log: `vllm: download 0s, weight load 1.2s, compile 3.1s (cache hit)`. */
export function describeStartup(e: StartupRecord): string {
  const names: [keyof StartupRecord["seconds"], string][] = [
    ["download", "download"],
    ["weightLoad", "weight load"],
    ["modelLoad", "model load"],
    ["compile", "compile"],
    ["cudaGraph", "CUDA graphs"],
    ["engineInit", "engine init"],
    ["ready", "ready"],
  ];
  const parts = names
    .filter(([k]) => typeof e.seconds[k] === "number")
    .map(([k, label]) => `${label} ${e.seconds[k] as number}s`);
  return `${e.engine}: ${parts.join(", ") || "no phase lines"} (compile cache ${e.compileCache})`;
}
