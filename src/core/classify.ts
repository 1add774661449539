import type { V1Container, V1Pod } from "@kubernetes/client-node";
import { envSourceRef, expandKubeRefs, expandShellVars, listOf, literalEnv, textOf } from "./env.js";
import { isScriptOption, looksLikeShell, splitShell } from "./shell.js";

export const GPU_RESOURCE = "nvidia.com/gpu";

/** The admission view of a pod: does it download a model, and why (or why not). */
export interface Classification {
  downloader: boolean;
  /** Short, stable text; shown in logs, Events and `warmstart explain`. */
  reason: string;
  model?: string;
  /** Index in `spec.containers` of the main container (the first one that requests a GPU). */
  containerIndex?: number;
}

/** Reasons a pod is left alone. Model-found reasons are `model from ...`. */
export const REASON_NO_CONTAINERS = "pod has no containers";
export const REASON_NO_GPU = "no GPU requested";
export const REASON_NO_MODEL = "GPU container names no model";

/** The flags by which launchers name their model (vLLM, SGLang, Dynamo, TGI, KServe). */
const MODEL_FLAGS = new Set(["--model", "--model-path", "--model-id", "--model_id"]);
const MODEL_ENV = ["HF_MODEL_ID", "MODEL_ID", "NIM_MODEL_NAME"];
const NIM_IMAGE = /^nvcr\.io\/nim\/([^@]+?)(?::[^/:@]+)?(?:@[A-Za-z0-9]+:[0-9a-fA-F]+)?$/;

// Flags of `vllm serve` / `trtllm-serve` that take no value, so the word after them may be the model.
const BOOLEAN_FLAGS = new Set([
  "--trust-remote-code",
  "--enforce-eager",
  "--enable-prefix-caching",
  "--no-enable-prefix-caching",
  "--enable-chunked-prefill",
  "--disable-log-requests",
  "--disable-log-stats",
  "--enable-auto-tool-choice",
  "--enable-lora",
  "--headless",
  "--is-prefill-worker",
  "--is-decode-worker",
  "--disable-custom-all-reduce",
  "--enable-expert-parallel",
  "--help",
  "-h",
]);
// trtllm-serve subcommands that take no model positional.
const TRTLLM_NO_MODEL = new Set(["disaggregated", "disaggregated_mpi_worker"]);

/** The GPUs a container asks for, in requests or limits (the larger). */
export function gpuCount(container: V1Container): number {
  const r = container.resources;
  const q = (m: Record<string, unknown> | undefined): number => {
    const v = m?.[GPU_RESOURCE];
    const n = typeof v === "number" ? v : typeof v === "string" ? Number.parseFloat(v) : 0;
    return Number.isFinite(n) && n > 0 ? n : 0;
  };
  return Math.max(q(r?.requests), q(r?.limits));
}

/** The main container: the first that requests a GPU; undefined when none does. */
export function mainContainerIndex(pod: V1Pod): number | undefined {
  const i = (pod.spec?.containers ?? []).findIndex((c) => c && typeof c === "object" && gpuCount(c) > 0);
  return i === -1 ? undefined : i;
}

/** A word of the container's argv, after splitting any shell strings in it. */
export interface ArgvToken {
  text: string;
  op: boolean;
  /** Read out of a shell string, so `$VAR` there is the shell's. */
  shell: boolean;
}

/**
 * The container's command and args as one token stream. Items with whitespace (`"--model X"`, the
 * script of `sh -c`) are split as a shell would, recursively for scripts nested in scripts.
 */
export function argvTokens(container: V1Container): ArgvToken[] {
  const out: ArgvToken[] = [];
  const split = (text: string, depth: number): void => {
    let prev: string | undefined;
    for (const t of splitShell(text)) {
      if (t.op) out.push({ text: t.text, op: true, shell: true });
      // Only the script handed to a nested shell is split again; other quoted words are values.
      else if (isScriptOption(prev) && looksLikeShell(t.text) && depth < 3) split(t.text, depth + 1);
      else out.push({ text: t.text, op: false, shell: true });
      prev = t.op ? undefined : t.text;
    }
  };
  for (const item of [...listOf(container.command), ...listOf(container.args)]) {
    const text = textOf(item);
    if (looksLikeShell(text)) split(text, 0);
    else out.push({ text, op: false, shell: false });
  }
  return out;
}

export interface ModelHit {
  model: string;
  reason: string;
}

/** Finds the model a container names, in order: flags, launcher positional, env, NIM image. */
export function containerModel(container: V1Container): ModelHit | undefined {
  const env = literalEnv(container);
  const tokens = argvTokens(container);
  const resolve = (t: ArgvToken): string => {
    const k = expandKubeRefs(t.text, env);
    return t.shell ? expandShellVars(k, env) : k;
  };
  const word = (i: number): ArgvToken | undefined => {
    const t = tokens[i];
    return t && !t.op ? t : undefined;
  };

  for (let i = 0; i < tokens.length; i++) {
    const t = word(i);
    if (!t) continue;
    const eq = t.text.indexOf("=");
    const flag = eq === -1 ? t.text : t.text.slice(0, eq);
    if (!MODEL_FLAGS.has(flag)) continue;
    if (eq !== -1) {
      const v = resolve({ ...t, text: t.text.slice(eq + 1) });
      if (v) return { model: v, reason: `model from ${flag} flag` };
      continue;
    }
    const next = word(i + 1);
    if (next && next.text && !next.text.startsWith("-"))
      return { model: resolve(next), reason: `model from ${flag} flag` };
  }

  for (let i = 0; i < tokens.length; i++) {
    const t = word(i);
    if (!t) continue;
    const base = t.text.slice(t.text.lastIndexOf("/") + 1);
    let start: number | undefined;
    let launcher = "";
    if (base === "vllm" && word(i + 1)?.text === "serve") {
      start = i + 2;
      launcher = "vllm serve";
    } else if (base === "trtllm-serve") {
      start = word(i + 1)?.text === "serve" ? i + 2 : i + 1;
      if (TRTLLM_NO_MODEL.has(word(start)?.text ?? "")) continue;
      launcher = "trtllm-serve";
    }
    if (start === undefined) continue;
    const pos = positional(tokens, start);
    if (pos) return { model: resolve(pos), reason: `model from ${launcher} positional` };
  }

  for (const name of MODEL_ENV) {
    // The last definition of a name is the one the container sees.
    const e = [...listOf(container.env)].reverse().find((x) => x?.name === name);
    if (!e) continue;
    if (e.valueFrom)
      return { model: `valueFrom(${envSourceRef(e.valueFrom)})`, reason: `model from env ${name}` };
    const v = env.get(name);
    if (v) return { model: v, reason: `model from env ${name}` };
  }

  const nim = NIM_IMAGE.exec(typeof container.image === "string" ? container.image.trim() : "");
  if (nim?.[1]) return { model: nim[1], reason: "model from NIM image" };
  return undefined;
}

/** The first positional word from `start`, skipping flags (and the values of flags that take one). */
function positional(tokens: readonly ArgvToken[], start: number): ArgvToken | undefined {
  let j = start;
  while (j < tokens.length) {
    const t = tokens[j] as ArgvToken;
    if (t.op) return undefined;
    if (!t.text.startsWith("-")) return t.text ? t : undefined;
    j += t.text.includes("=") || BOOLEAN_FLAGS.has(t.text) ? 1 : 2;
  }
  return undefined;
}

/** Decides whether a pod is a model downloader: a GPU container that names a model. Never throws. */
export function classifyPod(pod: V1Pod): Classification {
  const containers = (pod as V1Pod | null | undefined)?.spec?.containers;
  if (!Array.isArray(containers) || containers.length === 0)
    return { downloader: false, reason: REASON_NO_CONTAINERS };
  const idx = mainContainerIndex(pod);
  if (idx === undefined) return { downloader: false, reason: REASON_NO_GPU };
  const hit = containerModel(containers[idx] as V1Container);
  if (!hit) return { downloader: false, reason: REASON_NO_MODEL, containerIndex: idx };
  return { downloader: true, reason: hit.reason, model: hit.model, containerIndex: idx };
}
