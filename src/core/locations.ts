/**
 * Where the engine of a pod really writes. Charts set their own locations (`HF_HOME=/tmp`,
 * `HF_HOME=/model-cache` on an emptyDir, `NIM_CACHE_PATH=/model-store`, `--download-dir`, a storage
 * initializer filling `/mnt/models`); Warmstart keeps the pod's env and paths and captures what
 * the pod fills there. This module is the plan: which folders of the main container are captured,
 * and which folder of the captured tree each one becomes. Decoration follows the plan (the
 * leader's capture volume and a restore's shadow are mounted at those folders), so a restored pod
 * finds the tree at the very paths the leader wrote.
 *
 * In the tree, a model location lives under `model/` (used in place on restore) and a compile
 * cache under `cache/` (copied, engines rewrite it): `model/at/tmp` for `HF_HOME=/tmp`.
 */
import type { V1Container, V1Pod, V1Volume, V1VolumeMount } from "@kubernetes/client-node";
import { argvTokens, flagValue } from "./argv.js";
import type { Classification } from "./classify.js";
import { listOf, literalEnv, textOf } from "./env.js";
import { isRecord } from "./guards.js";

export type LocationKind = "model" | "cache";

export interface CacheLocation {
  /** The folder in the main container. */
  path: string;
  kind: LocationKind;
  /** What points there: `env HF_HOME`, `--download-dir`, `model path`. */
  from: string[];
  /** Its folder in the captured tree. */
  tree: string;
  /** The pod's own emptyDir at that folder, when it is one: every mount of it is taken over. */
  volume?: string;
}

export interface SkippedLocation {
  path: string;
  from: string;
  why: string;
}

export interface LocationPlan {
  /** What a leader's capture takes besides Warmstart's own root, in the order found. */
  locations: CacheLocation[];
  /** Locations the pod names that are not captured, and why. */
  skipped: SkippedLocation[];
  /** A model location on a volume the pod brings (a claim, a host path): the pod is admitted cold. */
  persistent?: { path: string; volume: string; from: string };
}

/** Env that names where the model hub's files land. */
export const MODEL_LOCATION_ENV = [
  "HF_HOME",
  "HF_HUB_CACHE",
  "HUGGINGFACE_HUB_CACHE",
  "TRANSFORMERS_CACHE",
  "NIM_CACHE_PATH",
  "MODELSCOPE_CACHE",
] as const;
/** Env that names where compile and JIT caches land. */
export const COMPILE_LOCATION_ENV = [
  "VLLM_CACHE_ROOT",
  "TORCHINDUCTOR_CACHE_DIR",
  "TRITON_CACHE_DIR",
  "CUDA_CACHE_PATH",
  "XDG_CACHE_HOME",
] as const;
/**
 * XDG_CACHE_HOME is every tool's cache (pip's, the hub client's token beside its hub cache, the
 * pod's own scratch when it is `/tmp`): only the folders engines keep below it are captured, each
 * unless the pod points that engine elsewhere.
 */
const XDG_ENGINE_FOLDERS: ReadonlyArray<{ sub: string; kind: LocationKind; unless: readonly string[] }> = [
  // huggingface_hub: HF_HOME defaults to $XDG_CACHE_HOME/huggingface; only its hub cache.
  {
    sub: "huggingface/hub",
    kind: "model",
    unless: ["HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"],
  },
  { sub: "vllm", kind: "cache", unless: ["VLLM_CACHE_ROOT"] },
  // torch.hub's checkpoints and torch's own kernel cache.
  { sub: "torch", kind: "cache", unless: ["TORCH_HOME"] },
  // Outlines' compiled grammars (vLLM's structured output).
  { sub: "outlines", kind: "cache", unless: ["OUTLINES_CACHE_DIR"] },
];
/** Flags that name a download folder: vLLM's `--download-dir`, TGI's `--huggingface-hub-cache`. */
const DOWNLOAD_FLAGS = new Set(["--download-dir", "--huggingface-hub-cache"]);

/**
 * Volume kinds that are scratch, made for this one pod and gone with it: the only ones a capture
 * may take over (an emptyDir, or a generic ephemeral volume).
 */
const isScratch = (v: V1Volume): boolean => isRecord(v.emptyDir) || isRecord(v.ephemeral);
/** Volume kinds that hold configuration, never a cache. */
const isConfig = (v: V1Volume): boolean =>
  isRecord(v.configMap) || isRecord(v.secret) || isRecord(v.downwardAPI) || isRecord(v.projected);

// Folders a mount must never hide (a location there is the pod's mistake or an attack): the
// image's system folders, the top of home and mount folders, and Warmstart's own.
const SYSTEM =
  /^\/(?:$|(?:bin|boot|dev|etc|lib|lib32|lib64|libx32|proc|run|sbin|sys|usr|var|warmstart)(?:\/|$))|^\/(?:home|opt|root|srv|mnt)$/;
/**
 * Folders that hold everything of a process or a user, not one cache: the pod's scratch volume
 * there is not taken over for a location below it (that would capture all of `/tmp`); the capture
 * volume is mounted at the location alone.
 */
const GENERIC = /^\/(?:tmp|var\/tmp|dev\/shm|root|home(?:\/[^/]+)?)?$/;

/** An absolute path, normalised (`..` resolved, no trailing slash); undefined for anything else. */
export function normalisePath(p: string): string | undefined {
  if (!p.startsWith("/") || p.includes("\0")) return undefined;
  const parts: string[] = [];
  for (const s of p.split("/")) {
    if (s === "" || s === ".") continue;
    if (s === "..") parts.pop();
    else parts.push(s);
  }
  return `/${parts.join("/")}`;
}

const within = (path: string, dir: string): boolean =>
  dir === "/" || path === dir || path.startsWith(`${dir}/`);

/** The container's mount that holds `path` (the deepest one), if any. */
export function mountCovering(c: V1Container, path: string): V1VolumeMount | undefined {
  let best: V1VolumeMount | undefined;
  let bestLen = -1;
  for (const m of listOf(c.volumeMounts)) {
    if (!isRecord(m) || typeof m.mountPath !== "string") continue;
    const mp = normalisePath(m.mountPath);
    if (mp !== undefined && within(path, mp) && mp.length > bestLen) {
      best = m;
      bestLen = mp.length;
    }
  }
  return best;
}

/** What kind of volume a pod brings, for the cold reason. */
function volumeKind(v: V1Volume): string {
  const k = Object.keys(v).find((x) => x !== "name" && (v as unknown as Record<string, unknown>)[x] != null);
  return k ?? "volume";
}

/**
 * The plan for a pod's main container: the locations its env and args name, resolved against its
 * mounts. Pure; never throws.
 */
export function locationPlan(pod: V1Pod, c: Classification): LocationPlan {
  const plan: LocationPlan = { locations: [], skipped: [] };
  const main = listOf(pod.spec?.containers)[c.containerIndex ?? -1];
  if (!isRecord(main)) return plan;
  const volumes = new Map(
    listOf(pod.spec?.volumes)
      .filter((v) => isRecord(v) && typeof v.name === "string")
      .map((v) => [v.name, v] as const),
  );
  const env = literalEnv(main);
  const named: Array<{ raw: string; kind: LocationKind; from: string }> = [];
  const setByValueFrom = (name: string): boolean =>
    listOf(main.env).some((e) => e?.name === name && e.valueFrom !== undefined && !env.has(name));
  for (const [names, kind] of [
    [MODEL_LOCATION_ENV, "model"],
    [COMPILE_LOCATION_ENV, "cache"],
  ] as const) {
    for (const name of names) {
      const v = env.get(name);
      if (v === undefined || v === "") {
        if (setByValueFrom(name))
          plan.skipped.push({
            path: "?",
            from: `env ${name}`,
            why: "set from valueFrom: its folder is not known at admission",
          });
        continue;
      }
      // HF_HOME holds the hub cache in `hub/` beside things that are not the model (a token, a
      // chunk cache) and often shares its folder with the pod's own scratch (`HF_HOME=/tmp`):
      // only the hub cache is the engine's download.
      if (name === "HF_HOME") named.push({ raw: `${v}/hub`, kind, from: `env ${name} (its hub cache)` });
      else if (name === "XDG_CACHE_HOME") {
        for (const f of XDG_ENGINE_FOLDERS)
          if (!f.unless.some((n) => env.has(n)))
            named.push({ raw: `${v}/${f.sub}`, kind: f.kind, from: `env ${name} (its ${f.sub} folder)` });
      } else named.push({ raw: v, kind, from: `env ${name}` });
    }
  }
  const tokens = argvTokens(main);
  const dl = flagValue(tokens, DOWNLOAD_FLAGS);
  if (dl) named.push({ raw: dl.text, kind: "model", from: "--download-dir" });
  if (c.modelPath) named.push({ raw: c.modelPath, kind: "model", from: "model path" });

  // The engines' defaults, when the pod names no hub location: a claim mounted there is a
  // pre-populated cache the user shares on purpose (Warmstart would otherwise point the engine away from it).
  if (!MODEL_LOCATION_ENV.some((n) => env.has(n))) {
    const home = normalisePath(env.get("HOME") ?? "/root") ?? "/root";
    for (const dflt of [
      `${home}/.cache/huggingface`,
      `${env.get("XDG_CACHE_HOME") ?? `${home}/.cache`}/huggingface`,
    ]) {
      const m = listOf(main.volumeMounts).find((x) => {
        const mp = isRecord(x) && typeof x.mountPath === "string" ? normalisePath(x.mountPath) : undefined;
        return mp !== undefined && (within(dflt, mp) || within(mp, dflt)) && mp !== "/";
      });
      const vol = m ? volumes.get(textOf(m.name)) : undefined;
      if (m && vol && !isScratch(vol) && !isConfig(vol))
        plan.persistent ??= {
          path: dflt,
          volume: `${volumeKind(vol)} ${vol.name}`,
          from: "the engine's default hub cache",
        };
    }
  }

  for (const n of named) {
    const path = normalisePath(n.raw.includes("$") ? "" : n.raw);
    if (path === undefined) {
      plan.skipped.push({ path: textOf(n.raw), from: n.from, why: "not an absolute folder" });
      continue;
    }
    const mount = mountCovering(main, path);
    const vol = mount ? volumes.get(textOf(mount.name)) : undefined;
    if (mount && vol && isScratch(vol)) {
      const mountPath = normalisePath(textOf(mount.mountPath)) as string;
      // Below a generic folder, on a volume no other mount shows: the location alone, and the
      // rest of the folder stays the pod's scratch.
      const alone = path !== mountPath && GENERIC.test(mountPath) && !shared(pod, vol.name);
      addLocation(
        plan,
        alone
          ? { path, kind: n.kind, from: [n.from] }
          : { path: mountPath, kind: n.kind, from: [n.from], volume: vol.name },
      );
    } else if (mount && vol && isConfig(vol)) {
      plan.skipped.push({ path, from: n.from, why: `on the ${volumeKind(vol)} volume ${vol.name}` });
    } else if (mount) {
      // Pre-populated or shared by design (a claim, a host path): the user's to manage.
      plan.persistent ??= {
        path,
        volume: `${vol ? volumeKind(vol) : "volume"} ${textOf(mount.name)}`,
        from: n.from,
      };
    } else if (n.from === "model path") {
      // A model baked into the image: nothing to download, nothing of it to capture.
      plan.skipped.push({ path, from: n.from, why: "in the image (the image is in the hash)" });
    } else if (SYSTEM.test(path)) {
      plan.skipped.push({ path, from: n.from, why: "a system folder of the image: never mounted over" });
    } else {
      addLocation(plan, { path, kind: n.kind, from: [n.from] });
    }
  }
  // A folder inside another captured folder is captured with it.
  plan.locations = plan.locations.filter(
    (l) => !plan.locations.some((o) => o !== l && o.path !== l.path && within(l.path, o.path)),
  );
  for (const l of plan.locations) l.tree = `${l.kind}/at${l.path}`;
  return plan;
}

/** Whether more than one mount, in any container, shows the volume `name`: then it is taken over
 * whole, so that every container keeps seeing the same files. */
function shared(pod: V1Pod, name: string): boolean {
  const containers = [...listOf(pod.spec?.initContainers), ...listOf(pod.spec?.containers)];
  const mounts = containers.flatMap((c) => (isRecord(c) ? listOf(c.volumeMounts) : []));
  return mounts.filter((m) => isRecord(m) && m.name === name).length > 1;
}

function addLocation(plan: LocationPlan, l: Omit<CacheLocation, "tree">): void {
  const same = plan.locations.find((o) =>
    l.volume ? o.volume === l.volume : !o.volume && o.path === l.path,
  );
  if (!same) {
    plan.locations.push({ ...l, tree: "" });
    return;
  }
  for (const f of l.from) if (!same.from.includes(f)) same.from.push(f);
  // Model files are used in place on restore; a folder that holds any is a model folder.
  if (l.kind === "model") same.kind = "model";
}
