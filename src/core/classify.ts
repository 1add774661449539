import type { V1Container, V1Pod } from "@kubernetes/client-node";
import { argvTokens, type ArgvToken } from "./argv.js";
import { envSourceRef, expandKubeRefs, expandShellVars, listOf, literalEnv, textOf } from "./env.js";
import { isRecord } from "./guards.js";
import { locationPlan, mountCovering, normalisePath, type LocationPlan } from "./locations.js";

export const GPU_RESOURCE = "nvidia.com/gpu";
/** A MIG slice is a GPU too: `nvidia.com/mig-1g.10gb`, `nvidia.com/mig-3g.40gb`, ... */
const MIG_RESOURCE = /^nvidia\.com\/mig-[0-9a-z.+-]+$/i;
/** DRA device classes of NVIDIA's GPU driver (whole GPUs and MIG devices). */
const GPU_DEVICE_CLASS = /(^|\.)(gpu|mig)\.nvidia\.com$/;
/** KServe's pod mutator writes the storage URI it will fetch here before injecting its initializer. */
export const KSERVE_SOURCE_URI_ANNOTATION = "internal.serving.kserve.io/storage-initializer-sourceuri";
/** Where KServe's storage initializer puts the model, in every runtime. */
const KSERVE_MODEL_DIR = "/mnt/models";
export const REASON_PERSISTENT_MODEL = "model on a persistent volume";

/** The admission view of a pod: does it download a model, and why (or why not). */
export interface Classification {
  downloader: boolean;
  /** Short, stable text; shown in logs, Events and `warmstart explain`. */
  reason: string;
  model?: string;
  /** Index in `spec.containers` of the main container (the first one that requests a GPU). */
  containerIndex?: number;
  /** The GPUs the main container asks for: kind (resource name, or `claim:<ref>`) to count. */
  gpus?: Record<string, string>;
  /** The local path the engine is given, when the model is a folder in the container. */
  modelPath?: string;
  /** Where the model comes from when it is not what the engine is given (a storage initializer's URI). */
  source?: string;
  /** Set when the pod downloads but must be admitted cold: the reason. */
  cold?: string;
  /** Where the engine writes in this pod: what a leader's capture takes. */
  locations?: LocationPlan;
}

/**
 * The device classes a DRA claim of the pod asks for, looked up in the cluster (the claim's
 * template lives there, not in the pod). Undefined when it cannot be known.
 */
export type DeviceClassLookup = (ref: ClaimRef) => readonly string[] | undefined;

/** A container's DRA claim, as the pod names it. */
export interface ClaimRef {
  /** The name in `spec.resourceClaims` (and `resources.claims`). */
  name: string;
  template?: string;
  claim?: string;
}

export interface ClassifyOptions {
  deviceClasses?: DeviceClassLookup;
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

const quantity = (v: unknown): number => {
  const n = typeof v === "number" ? v : typeof v === "string" ? Number.parseFloat(v) : 0;
  return Number.isFinite(n) && n > 0 ? n : 0;
};

/** Whole GPUs and MIG slices a container asks for in requests or limits (the larger), by resource name. */
function gpuResources(container: V1Container): Record<string, number> {
  const r = isRecord(container.resources) ? container.resources : {};
  const out: Record<string, number> = {};
  for (const m of [r.requests, r.limits]) {
    if (!isRecord(m)) continue;
    for (const [name, v] of Object.entries(m)) {
      if (name !== GPU_RESOURCE && !MIG_RESOURCE.test(name)) continue;
      const n = quantity(v);
      if (n > (out[name] ?? 0)) out[name] = n;
    }
  }
  return out;
}

/** The GPUs a container asks for: whole GPUs and MIG slices together. */
export function gpuCount(container: V1Container): number {
  return Object.values(gpuResources(container)).reduce((a, b) => a + b, 0);
}

/** The DRA claims a container uses, resolved against the pod's `spec.resourceClaims`. */
function containerClaims(pod: V1Pod, container: V1Container): ClaimRef[] {
  const r = isRecord(container.resources) ? container.resources : {};
  const used = listOf(r.claims as Array<{ name?: unknown }> | undefined)
    .map((c) => (isRecord(c) && typeof c.name === "string" ? c.name : ""))
    .filter(Boolean);
  const declared = listOf(pod.spec?.resourceClaims);
  return used.map((name) => {
    const d = declared.find((x) => isRecord(x) && x.name === name);
    return {
      name,
      ...(typeof d?.resourceClaimTemplateName === "string" ? { template: d.resourceClaimTemplateName } : {}),
      ...(typeof d?.resourceClaimName === "string" ? { claim: d.resourceClaimName } : {}),
    };
  });
}

/**
 * Whether a claim is for an NVIDIA GPU: by its device classes when the cluster says, else (offline,
 * or the lookup failed) by its names, which for GPU claims say so in practice.
 */
function isGpuClaim(ref: ClaimRef, lookup: DeviceClassLookup | undefined): boolean {
  const classes = lookup?.(ref);
  if (classes) return classes.some((c) => GPU_DEVICE_CLASS.test(c));
  return [ref.name, ref.template, ref.claim].some((n) => n !== undefined && /gpu|mig|nvidia/i.test(n));
}

/** What a container's GPUs enter the hash as: `nvidia.com/gpu: "2"`, `claim:<template>: "1"`. */
export function gpuInputs(
  pod: V1Pod,
  container: V1Container,
  lookup?: DeviceClassLookup,
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, n] of Object.entries(gpuResources(container))) out[k] = String(n);
  for (const ref of containerClaims(pod, container)) {
    if (!isGpuClaim(ref, lookup)) continue;
    // The template (or the shared claim) says what devices and how many; the pod's own name for it does not.
    const key = ref.template
      ? `claim:template/${ref.template}`
      : ref.claim
        ? `claim:${ref.claim}`
        : `claim:${ref.name}`;
    out[key] = String(Number(out[key] ?? 0) + 1);
  }
  return out;
}

/** The main container: the first that requests a GPU; undefined when none does. */
export function mainContainerIndex(pod: V1Pod, lookup?: DeviceClassLookup): number | undefined {
  const i = listOf(pod.spec?.containers).findIndex(
    (c) => isRecord(c) && Object.keys(gpuInputs(pod, c, lookup)).length > 0,
  );
  return i === -1 ? undefined : i;
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

const URI = /^[a-z][a-z0-9+.-]*:\/\/\S+$/i;

/** The first storage URI an init container names, its `$(VAR)` and shell `$VAR` resolved from its own env. */
function initSourceUri(init: V1Container): string | undefined {
  const env = literalEnv(init);
  for (const t of argvTokens(init)) {
    if (t.op) continue;
    const k = expandKubeRefs(t.text, env);
    const v = t.shell ? expandShellVars(k, env) : k;
    if (URI.test(v)) return v;
  }
  return undefined;
}

/**
 * Where a model the engine reads from a local folder really comes from: an init container that
 * writes the volume holding that folder and names a storage URI (KServe's storage initializer,
 * `hf://org/name`, `s3://...`, a `gcloud storage cp gs://...`), or the URI KServe's pod mutator
 * announces before it injects its initializer.
 */
function storageSource(
  pod: V1Pod,
  main: V1Container,
  path: string,
): { uri: string; from: string } | undefined {
  const mount = mountCovering(main, path);
  if (!mount) return undefined;
  for (const init of listOf(pod.spec?.initContainers)) {
    if (!isRecord(init)) continue;
    const writes = listOf(init.volumeMounts).some((m) => m?.name === mount.name && m.readOnly !== true);
    if (!writes) continue;
    const uri = initSourceUri(init);
    if (uri) return { uri, from: `init container ${textOf(init.name)}` };
  }
  // Before KServe injects its initializer, it has announced the URI it will fetch into its fixed folder.
  const announced = pod.metadata?.annotations?.[KSERVE_SOURCE_URI_ANNOTATION];
  const inKServeFolder = path === KSERVE_MODEL_DIR || path.startsWith(`${KSERVE_MODEL_DIR}/`);
  if (inKServeFolder && typeof announced === "string" && URI.test(announced.trim()))
    return { uri: announced.trim(), from: `annotation ${KSERVE_SOURCE_URI_ANNOTATION}` };
  return undefined;
}

/**
 * A server that names no model but loads one from a folder a storage initializer fills (KServe's
 * Hugging Face server reads `/mnt/models` by default): the folder of the first mount so filled.
 */
function filledFolder(pod: V1Pod, main: V1Container): ModelHit | undefined {
  for (const m of listOf(main.volumeMounts)) {
    if (!isRecord(m) || typeof m.mountPath !== "string") continue;
    const path = normalisePath(m.mountPath);
    if (path && storageSource(pod, main, path)) return { model: path, reason: "model from a mounted folder" };
  }
  return undefined;
}
/** Decides whether a pod is a model downloader: a GPU container that names a model. Never throws. */
export function classifyPod(pod: V1Pod, opts: ClassifyOptions = {}): Classification {
  const containers = (pod as V1Pod | null | undefined)?.spec?.containers;
  if (!Array.isArray(containers) || containers.length === 0)
    return { downloader: false, reason: REASON_NO_CONTAINERS };
  const idx = mainContainerIndex(pod, opts.deviceClasses);
  if (idx === undefined) return { downloader: false, reason: REASON_NO_GPU };
  const main = containers[idx] as V1Container;
  const gpus = gpuInputs(pod, main, opts.deviceClasses);
  const hit = containerModel(main) ?? filledFolder(pod, main);
  if (!hit) return { downloader: false, reason: REASON_NO_MODEL, containerIndex: idx, gpus };
  const c: Classification = {
    downloader: true,
    reason: hit.reason,
    model: hit.model,
    containerIndex: idx,
    gpus,
  };
  const path = normalisePath(hit.model);
  if (path !== undefined) {
    c.modelPath = path;
    // The model's identity is what was fetched, never the folder every pod of a kind reads it from.
    const src = storageSource(pod, main, path);
    if (src) {
      c.model = src.uri;
      c.source = src.uri;
      c.reason = `model from ${src.from} (${hit.reason.replace(/^model from /, "")} ${path})`;
      if (/^pvc:\/\//i.test(src.uri)) c.cold = REASON_PERSISTENT_MODEL;
    }
  }
  c.locations = locationPlan(pod, c);
  if (c.locations.persistent && !c.cold) c.cold = REASON_PERSISTENT_MODEL;
  return c;
}
