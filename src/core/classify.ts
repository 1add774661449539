import type { V1Container, V1Pod, V1PodResourceClaim, V1VolumeMount } from "@kubernetes/client-node";
import { argvTokens, type ArgvToken } from "./argv.js";
import {
  envSourceRef,
  expandKubeRefs,
  expansionBudget,
  expandShellVars,
  listOf,
  literalEnv,
  textOf,
  type ExpansionBudget,
} from "./env.js";
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

type DeclaredClaims = ReadonlyMap<unknown, V1PodResourceClaim>;

/** The pod's `spec.resourceClaims` by name (the first of a name), read once for all its containers. */
function declaredClaims(pod: V1Pod): DeclaredClaims {
  const out = new Map<unknown, V1PodResourceClaim>();
  for (const x of listOf(pod.spec?.resourceClaims)) if (isRecord(x) && !out.has(x.name)) out.set(x.name, x);
  return out;
}

/** The DRA claims a container uses, resolved against the pod's `spec.resourceClaims`. */
function containerClaims(container: V1Container, declared: DeclaredClaims): ClaimRef[] {
  const r = isRecord(container.resources) ? container.resources : {};
  const used = listOf(r.claims as Array<{ name?: unknown }> | undefined)
    .map((c) => (isRecord(c) && typeof c.name === "string" ? c.name : ""))
    .filter(Boolean);
  return used.map((name) => {
    const d = declared.get(name);
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
  declared: DeclaredClaims = declaredClaims(pod),
): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, n] of Object.entries(gpuResources(container))) out[k] = String(n);
  for (const ref of containerClaims(container, declared)) {
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
  const declared = declaredClaims(pod);
  const i = listOf(pod.spec?.containers).findIndex(
    (c) => isRecord(c) && Object.keys(gpuInputs(pod, c, lookup, declared)).length > 0,
  );
  return i === -1 ? undefined : i;
}

export interface ModelHit {
  model: string;
  reason: string;
}

/**
 * Finds the model a container names, in order: flags, launcher positional, env, NIM image. Its
 * expansions draw from `budget` (see EXPANSION_BUDGET_BYTES).
 */
export function containerModel(container: V1Container, budget = expansionBudget()): ModelHit | undefined {
  const env = literalEnv(container, budget);
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

  const dead = new Set<number>();
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
    const pos = positional(tokens, start, dead);
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

/**
 * The first positional word from `start`, skipping flags (and the values of flags that take one).
 * `dead` keeps the indexes whose walk found none, so that many launcher words followed by flags
 * cost one walk, not one each (time linear in the argv).
 */
function positional(tokens: readonly ArgvToken[], start: number, dead: Set<number>): ArgvToken | undefined {
  const walked: number[] = [];
  for (let j = start; j < tokens.length && !dead.has(j);) {
    walked.push(j);
    const t = tokens[j] as ArgvToken;
    if (t.op) break;
    if (!t.text.startsWith("-")) {
      if (t.text) return t;
      break;
    }
    j += t.text.includes("=") || BOOLEAN_FLAGS.has(t.text) ? 1 : 2;
  }
  for (const j of walked) dead.add(j);
  return undefined;
}

const URI = /^[a-z][a-z0-9+.-]*:\/\/\S+$/i;

/** The first storage URI an init container names, its `$(VAR)` and shell `$VAR` resolved from its own env. */
function initSourceUri(init: V1Container, budget: ExpansionBudget): string | undefined {
  const env = literalEnv(init, budget);
  for (const t of argvTokens(init)) {
    if (t.op) continue;
    const k = expandKubeRefs(t.text, env);
    const v = t.shell ? expandShellVars(k, env) : k;
    if (URI.test(v)) return v;
  }
  return undefined;
}

/** Where a folder of the main container is filled from (see storageSources). */
type SourceOf = (path: string, mount?: V1VolumeMount) => { uri: string; from: string } | undefined;

/**
 * Where a model the engine reads from a local folder really comes from: an init container that
 * writes the volume holding that folder and names a storage URI (KServe's storage initializer,
 * `hf://org/name`, `s3://...`, a `gcloud storage cp gs://...`), or the URI KServe's pod mutator
 * announces before it injects its initializer. Each init container is read once and each volume
 * looked up once, whatever the number of folders asked about: time linear in the pod.
 */
function storageSources(pod: V1Pod, main: V1Container, budget: ExpansionBudget): SourceOf {
  // The init containers that write each volume, in pod order.
  const writers = new Map<unknown, V1Container[]>();
  for (const init of listOf(pod.spec?.initContainers)) {
    if (!isRecord(init)) continue;
    for (const m of listOf(init.volumeMounts)) {
      if (!isRecord(m) || m.readOnly === true) continue;
      const list = writers.get(m.name) ?? [];
      if (list[list.length - 1] !== init) list.push(init);
      writers.set(m.name, list);
    }
  }
  const uris = new Map<V1Container, string | undefined>();
  const byVolume = new Map<unknown, { uri: string; from: string } | undefined>();
  const volumeSource = (name: unknown): { uri: string; from: string } | undefined => {
    if (byVolume.has(name)) return byVolume.get(name);
    let found: { uri: string; from: string } | undefined;
    for (const init of writers.get(name) ?? []) {
      if (!uris.has(init)) uris.set(init, initSourceUri(init, budget));
      const uri = uris.get(init);
      if (uri) {
        found = { uri, from: `init container ${textOf(init.name)}` };
        break;
      }
    }
    byVolume.set(name, found);
    return found;
  };
  return (path, mount = mountCovering(main, path)) => {
    if (!mount) return undefined;
    const src = volumeSource(mount.name);
    if (src) return src;
    // Before KServe injects its initializer, it has announced the URI it will fetch into its fixed folder.
    const announced = pod.metadata?.annotations?.[KSERVE_SOURCE_URI_ANNOTATION];
    const inKServeFolder = path === KSERVE_MODEL_DIR || path.startsWith(`${KSERVE_MODEL_DIR}/`);
    if (inKServeFolder && typeof announced === "string" && URI.test(announced.trim()))
      return { uri: announced.trim(), from: `annotation ${KSERVE_SOURCE_URI_ANNOTATION}` };
    return undefined;
  };
}

/**
 * A server that names no model but loads one from a folder a storage initializer fills (KServe's
 * Hugging Face server reads `/mnt/models` by default): the folder of the first mount so filled.
 */
function filledFolder(main: V1Container, sourceOf: SourceOf): ModelHit | undefined {
  // The mount covering a mount's own folder is the first at that folder (mountCovering's choice),
  // found without a scan of every mount for each.
  const first = new Map<string, V1VolumeMount>();
  for (const m of listOf(main.volumeMounts)) {
    if (!isRecord(m) || typeof m.mountPath !== "string") continue;
    const path = normalisePath(m.mountPath);
    if (path === undefined || first.has(path)) continue;
    first.set(path, m);
    if (sourceOf(path, m)) return { model: path, reason: "model from a mounted folder" };
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
  // One expansion budget for this reading of the pod: its main container's and init containers' words.
  const budget = expansionBudget();
  const sourceOf = storageSources(pod, main, budget);
  const hit = containerModel(main, budget) ?? filledFolder(main, sourceOf);
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
    const src = sourceOf(path);
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
