import type {
  V1Container,
  V1EnvVar,
  V1Pod,
  V1ResourceRequirements,
  V1SecurityContext,
  V1Volume,
  V1VolumeMount,
} from "@kubernetes/client-node";
import jsonpatch, { type Operation } from "fast-json-patch";
import { mainContainerIndex } from "./classify.js";
import { normalisePath, type CacheLocation } from "./locations.js";
import {
  ANN_ELECTION_ID,
  ANN_CAPTURE_SIZE_LIMIT,
  ANN_HASH,
  ANN_REASON,
  ANN_ROLE,
  ANN_TREE,
  CACHE_VOLUME,
  ENV_TREE,
  ENV_PREWARM,
  INIT_PREWARM,
  INIT_SEED,
  LEGACY_INIT_WAIT_READY,
  LABEL_CAPTURE,
  LABEL_GATED,
  LABEL_HASH,
  LABEL_WAITING,
  ANN_WAIT_UNTIL,
  COLD_MARKER,
  FILL_TREE,
  FILL_VOLUME,
  RO_VOLUME,
  SCHEDULING_GATE,
  SHADOW_VOLUME,
  claimName as roxClaimName,
  shortHash,
  type Role,
} from "./contract.js";

/** Where the engines' caches live inside a decorated pod. */
export const DEFAULT_CACHE_ROOT = "/warmstart/cache-root";
/** Where a restore mounts the read-only cache tree. */
export const DEFAULT_RO_PATH = "/warmstart/ro";
/** How long the seed init container waits for the marker before failing (the kubelet then retries). */
const DEFAULT_WAIT_TIMEOUT_SECONDS = 600;
export const DEFAULT_PREWARM_PARALLELISM = 6;

/** Cache env to point into the cache root; `{root}` in a value is replaced by the root. */
export type CacheEnvTemplate = ReadonlyArray<{ name: string; value: string }>;

/** Model hub caches under `<root>/model` (mounted read-only on restore), compile caches under `<root>/cache`. */
export const DEFAULT_CACHE_ENV_TEMPLATE: CacheEnvTemplate = [
  { name: "HF_HOME", value: "{root}/model/huggingface" },
  { name: "NIM_CACHE_PATH", value: "{root}/model/nim" },
  { name: "TORCHINDUCTOR_CACHE_DIR", value: "{root}/cache/torchinductor" },
  { name: "TRITON_CACHE_DIR", value: "{root}/cache/triton" },
  { name: "VLLM_CACHE_ROOT", value: "{root}/cache/vllm" },
  { name: "CUDA_CACHE_PATH", value: "{root}/cache/nv" },
  { name: "HOME", value: "{root}/cache/home" },
];

// Offline mode makes the hub skip revision checks the compile path relies on; it slows restores.
const NEVER_INJECT = new Set(["HF_HUB_OFFLINE"]);

export interface DecorationOptions {
  /** Full sha256 hex, stamped on the pod. */
  hash: string;
  cacheRoot?: string;
  cacheEnvTemplate?: CacheEnvTemplate;
  /** The main container; defaults to the first GPU container. */
  containerIndex?: number;
  /** Stamped as `warmstart.dev/reason` when given. */
  reason?: string;
  /**
   * The pod's own folders its engine writes (locations.ts): the leader's capture volume is mounted
   * there, and a restore's writable shadow, so the tree is found at the paths it was written.
   */
  locations?: readonly CacheLocation[];
}

export interface LeaderOptions extends DecorationOptions {
  electionId: string;
  /** emptyDir size limit of the capture volume (a quantity, e.g. "200Gi"). */
  sizeLimit: string;
}

export interface RestoreOptions extends DecorationOptions {
  /** The read-only claim; defaults to `rox-<short>` of `hash`. */
  claimName?: string;
  /** The full hash of the cache restored from (`restore-from` names another); defaults to `hash`. */
  sourceHash?: string;
  /** The record's manifest digest, when known at admission: seed refuses any other tree. */
  manifestDigest?: string;
  /** The storage profile's prewarm policy; pod env WARMSTART_PREWARM overrides it. */
  prewarm: boolean;
  prewarmParallelism: number;
  /** The warmstart image, for the init containers. */
  image: string;
  /** How the image runs warmstart (default `["warmstart"]`). */
  warmstartCommand?: string[];
  roPath?: string;
  waitTimeoutSeconds?: number;
  imagePullPolicy?: string;
  /** Resources for the init containers (namespaces with quotas may require them). */
  initResources?: V1ResourceRequirements;
  /** emptyDir size limit of the writable shadow. */
  shadowSizeLimit?: string;
  /**
   * The captured tree's folder inside the read-only volume, when known at admission (a restore
   * of a Ready cache). Followers get it from the release controller, which writes it when it
   * lifts the gate; until then the annotation is absent.
   */
  treePath?: string;
}

export type FollowerOptions = Omit<RestoreOptions, "claimName">;

export interface ColdOptions {
  hash: string;
  reason: string;
}

/** Renders a cache env template for a root. HF_HUB_OFFLINE is never produced, whatever the template says. */
function renderCacheEnv(template: CacheEnvTemplate, root: string): V1EnvVar[] {
  return template
    .filter((e) => !NEVER_INJECT.has(e.name))
    .map((e) => ({ name: e.name, value: e.value.split("{root}").join(root) }));
}

/** The JSON patch that turns `original` into `decorated`; empty when they are equal. */
export function jsonPatch(original: V1Pod, decorated: V1Pod): Operation[] {
  return jsonpatch.compare(original as object, decorated as object);
}

/** Stamps hash, role and reason only: the `cold` decision. */
export function decorateCold(pod: V1Pod, opts: ColdOptions): V1Pod {
  const p = structuredClone(pod);
  stamp(p, opts.hash, "cold", opts.reason);
  return p;
}

/** Leader: the cache root on a size-limited emptyDir the node agent captures, cache env into it. */
export function decorateLeader(pod: V1Pod, opts: LeaderOptions): V1Pod {
  const p = structuredClone(pod);
  const root = opts.cacheRoot ?? DEFAULT_CACHE_ROOT;
  const c = mainOf(p, opts.containerIndex);
  const { labels, annotations } = stamp(p, opts.hash, "leader", opts.reason);
  labels[LABEL_CAPTURE] = "true";
  annotations[ANN_ELECTION_ID] = opts.electionId;
  // The limit the capture volume got, for whoever explains an eviction for size.
  annotations[ANN_CAPTURE_SIZE_LIMIT] = opts.sizeLimit;
  upsertVolume(p, { name: CACHE_VOLUME, emptyDir: { sizeLimit: opts.sizeLimit } });
  upsertMount(c, { name: CACHE_VOLUME, mountPath: root });
  mountLocations(p, c, opts.locations ?? [], CACHE_VOLUME);
  injectCacheEnv(c, renderCacheEnv(opts.cacheEnvTemplate ?? DEFAULT_CACHE_ENV_TEMPLATE, root));
  return p;
}

/**
 * Restore: the read-only tree, a writable shadow at the cache root, and init containers
 * that wait for the ready marker, seed the shadow and (maybe) prewarm. The pod's command and args
 * are left exactly as written.
 */
export function decorateRestore(pod: V1Pod, opts: RestoreOptions): V1Pod {
  const p = structuredClone(pod);
  const { annotations } = stamp(p, opts.hash, "restore", opts.reason);
  if (opts.treePath !== undefined) annotations[ANN_TREE] = opts.treePath || ".";
  const ro = opts.roPath ?? DEFAULT_RO_PATH;
  // Every backend shows the tree itself at the mount point: a volume that holds it in a folder
  // is mounted at that folder, named by the annotation (read when each container starts).
  const treeEnv: V1EnvVar = {
    name: ENV_TREE,
    valueFrom: { fieldRef: { fieldPath: `metadata.annotations['${ANN_TREE}']` } },
  };
  const timeout = opts.waitTimeoutSeconds ?? DEFAULT_WAIT_TIMEOUT_SECONDS;
  return restoreFrom(p, opts, {
    volume: {
      name: RO_VOLUME,
      persistentVolumeClaim: { claimName: opts.claimName ?? roxClaimName(opts.hash), readOnly: true },
    },
    mount: { name: RO_VOLUME, mountPath: ro, readOnly: true, subPathExpr: `$(${ENV_TREE})` },
    env: treeEnv,
    tree: ro,
    // The first init container waits for the tree's ready marker, then checks the tree's manifest
    // names the cache this pod was admitted against (one container start, not two).
    wait: ["--wait", String(timeout)],
  });
}

/** How a restore reaches its tree: the volume, its mount, the env its mount reads, the seed's wait. */
interface TreeSource {
  volume: V1Volume;
  mount: V1VolumeMount;
  env?: V1EnvVar;
  /** The tree's folder in every container that mounts it. */
  tree: string;
  wait: string[];
}

function restoreFrom(p: V1Pod, opts: RestoreOptions, source: TreeSource): V1Pod {
  const root = opts.cacheRoot ?? DEFAULT_CACHE_ROOT;
  const c = mainOf(p, opts.containerIndex);
  upsertVolume(p, source.volume);
  upsertVolume(p, {
    name: SHADOW_VOLUME,
    emptyDir: opts.shadowSizeLimit ? { sizeLimit: opts.shadowSizeLimit } : {},
  });
  upsertMount(c, source.mount);
  upsertMount(c, { name: SHADOW_VOLUME, mountPath: root });
  // The pod's own containers that now see the shadow (a storage initializer filling the model
  // folder) follow its links into the read-only tree too.
  const sharers = mountLocations(p, c, opts.locations ?? [], SHADOW_VOLUME);
  for (const other of sharers) {
    if (other === c) continue;
    upsertMount(other, structuredClone(source.mount));
    if (source.env) upsertEnv(other, structuredClone(source.env));
  }
  if (source.env) upsertEnv(c, source.env);
  injectCacheEnv(c, renderCacheEnv(opts.cacheEnvTemplate ?? DEFAULT_CACHE_ENV_TEMPLATE, root));

  const cmd = opts.warmstartCommand ?? ["warmstart"];
  const identity = runAsOf(p, c);
  // The shadow is made writable by any UID when the workload's UID is not known here (it comes
  // from its image), or when another container that sees it (a storage initializer filling the
  // model folder) runs as another UID: only this pod's containers ever see the shadow.
  const anyUid =
    identity.runAsUser === undefined ||
    [...sharers].some((other) => runAsOf(p, other).runAsUser !== identity.runAsUser);
  const base = (name: string, mounts: V1VolumeMount[]): V1Container => ({
    name,
    image: opts.image,
    imagePullPolicy: opts.imagePullPolicy ?? "IfNotPresent",
    volumeMounts: mounts,
    env: source.env ? [structuredClone(source.env)] : [],
    securityContext: initSecurityContext(identity),
    terminationMessagePolicy: "FallbackToLogsOnError",
    ...(opts.initResources ? { resources: structuredClone(opts.initResources) } : {}),
  });

  const inits: V1Container[] = [
    {
      ...base(INIT_SEED, [structuredClone(source.mount), { name: SHADOW_VOLUME, mountPath: root }]),
      command: [...cmd],
      args: [
        "seed",
        "--from",
        source.tree,
        "--to",
        root,
        "--hash",
        opts.sourceHash ?? opts.hash,
        ...(opts.manifestDigest ? ["--manifest-digest", opts.manifestDigest] : []),
        ...source.wait,
        ...(anyUid ? ["--any-uid"] : []),
      ],
    },
  ];
  const decision = prewarmDecision(c, opts.prewarm);
  if (decision.run) {
    const n = opts.prewarmParallelism;
    const parallel = Number.isFinite(n) && n >= 1 ? Math.floor(n) : DEFAULT_PREWARM_PARALLELISM;
    // `warmstart prewarm` is best effort by contract: it exits 0 whatever it could not read.
    const init: V1Container = {
      ...base(INIT_PREWARM, [structuredClone(source.mount)]),
      command: [...cmd],
      // After seed, which has read every file it copied: only what it left in place is looked at.
      args: ["prewarm", source.tree, "--seeded", "--parallel", String(parallel)],
    };
    if (decision.runtimeEnv) {
      // Only known at run time: the init container reads the same reference and decides there.
      init.args?.push("--respect-env", ENV_PREWARM, "--default", opts.prewarm ? "on" : "off");
      init.env?.push(structuredClone(decision.runtimeEnv));
    }
    inits.push(init);
  }
  const spec = p.spec as NonNullable<V1Pod["spec"]>;
  // The former separate wait container is ours too: a spec copied from a pod decorated before.
  const ours = new Set([LEGACY_INIT_WAIT_READY, INIT_SEED, INIT_PREWARM]);
  spec.initContainers = [...inits, ...(spec.initContainers ?? []).filter((x) => !ours.has(x.name))];
  return p;
}

/** The UID and GID the workload runs as, when the pod says (its main container wins over the pod). */
function runAsOf(pod: V1Pod, main: V1Container): { runAsUser?: number; runAsGroup?: number } {
  const c = main.securityContext;
  const s = pod.spec?.securityContext;
  const runAsUser = c?.runAsUser ?? s?.runAsUser;
  const runAsGroup = c?.runAsGroup ?? s?.runAsGroup;
  return {
    ...(typeof runAsUser === "number" ? { runAsUser } : {}),
    ...(typeof runAsGroup === "number" ? { runAsGroup } : {}),
  };
}

/**
 * Init containers run as the workload's own UID (so the files they seed are its own) and with
 * nothing more than they need; without a known UID they run as the image's non-root user.
 */
function initSecurityContext(id: { runAsUser?: number; runAsGroup?: number }): V1SecurityContext {
  return {
    ...id,
    ...(id.runAsUser === 0 ? {} : { runAsNonRoot: true }),
    allowPrivilegeEscalation: false,
    readOnlyRootFilesystem: true,
    capabilities: { drop: ["ALL"] },
    seccompProfile: { type: "RuntimeDefault" },
  };
}

/** Follower: a restore against `rox-<short>`, held by the scheduling gate until the cache is Ready. */
export function decorateFollower(pod: V1Pod, opts: FollowerOptions): V1Pod {
  const p = decorateRestore(pod, { ...opts, claimName: roxClaimName(opts.hash) });
  const { labels } = stamp(p, opts.hash, "follower", opts.reason);
  labels[LABEL_GATED] = "true";
  const spec = p.spec as NonNullable<V1Pod["spec"]>;
  const gates = spec.schedulingGates ?? [];
  if (!gates.some((g) => g.name === SCHEDULING_GATE)) gates.push({ name: SCHEDULING_GATE });
  spec.schedulingGates = gates;
  return p;
}

export interface WaitingFollowerOptions extends FollowerOptions {
  /** When it stops waiting and starts cold (ISO 8601): admission time plus `election.waitDeadline`. */
  waitUntil: string;
  /** emptyDir size limit of the fill volume: the largest capture volume a leader may get (the tree is no larger). */
  fillSizeLimit: string;
  fillPath?: string;
}

/** Where a waiting follower mounts the volume its node's agent fills. */
export const DEFAULT_FILL_PATH = "/warmstart/fill";

/**
 * A follower that something waits for (a gang, the other ranks of its group): never gated, and
 * nothing it mounts can keep it Pending. Its tree comes in an emptyDir that its node's agent fills
 * once the cache is Ready (ADR 0012); its seed waits for that, or for the agent's cold marker, or
 * until `waitUntil`, and starts cold then. Every container mounts the volume read-only: only the
 * agent writes it.
 */
export function decorateWaitingFollower(pod: V1Pod, opts: WaitingFollowerOptions): V1Pod {
  const p = structuredClone(pod);
  const fill = opts.fillPath ?? DEFAULT_FILL_PATH;
  const { labels, annotations } = stamp(p, opts.hash, "follower", opts.reason);
  labels[LABEL_WAITING] = "true";
  annotations[ANN_WAIT_UNTIL] = opts.waitUntil;
  restoreFrom(p, opts, {
    volume: { name: FILL_VOLUME, emptyDir: { sizeLimit: opts.fillSizeLimit } },
    mount: { name: FILL_VOLUME, mountPath: fill, readOnly: true },
    tree: `${fill}/${FILL_TREE}`,
    wait: [
      "--fill-until",
      opts.waitUntil,
      "--cold-marker",
      `${fill}/${COLD_MARKER}`,
      "--outcome-file",
      "/dev/termination-log",
    ],
  });
  // A container of the author's that names the volume gets it read-only too: the agent writes
  // into this folder as root, so nothing of the pod may change it under the agent.
  const spec = p.spec as NonNullable<V1Pod["spec"]>;
  for (const c of [...(spec.initContainers ?? []), ...spec.containers])
    c.volumeMounts = c.volumeMounts?.map((m) => (m.name === FILL_VOLUME ? { ...m, readOnly: true } : m));
  return p;
}

/** Whether the prewarm init container is added, and the valueFrom env it must resolve when that decides. */
function prewarmDecision(
  main: V1Container,
  profile: boolean,
): { run: boolean; runtimeEnv?: V1EnvVar; source: "profile" | "env" | "runtime" } {
  const e = [...(main.env ?? [])].reverse().find((x) => x?.name === ENV_PREWARM);
  if (!e) return { run: profile, source: "profile" };
  if (e.valueFrom)
    return { run: true, runtimeEnv: { name: ENV_PREWARM, valueFrom: e.valueFrom }, source: "runtime" };
  const v = String(e.value ?? "")
    .trim()
    .toLowerCase();
  if (["0", "false", "no", "off"].includes(v)) return { run: false, source: "env" };
  if (["1", "true", "yes", "on"].includes(v)) return { run: true, source: "env" };
  return { run: profile, source: "profile" };
}

function stamp(
  p: V1Pod,
  hash: string,
  role: Role,
  reason: string | undefined,
): { labels: Record<string, string>; annotations: Record<string, string> } {
  const meta = (p.metadata ??= {});
  const labels = (meta.labels ??= {});
  const annotations = (meta.annotations ??= {});
  annotations[ANN_HASH] = hash;
  labels[LABEL_HASH] = shortHash(hash);
  annotations[ANN_ROLE] = role;
  if (reason !== undefined) annotations[ANN_REASON] = reason;
  return { labels, annotations };
}

function mainOf(p: V1Pod, index: number | undefined): V1Container {
  const c = p.spec?.containers?.[index ?? mainContainerIndex(p) ?? 0];
  if (!c) throw new Error("pod has no containers to decorate");
  return c;
}

function upsertVolume(p: V1Pod, v: V1Volume): void {
  const spec = p.spec as NonNullable<V1Pod["spec"]>;
  const vols = (spec.volumes ??= []);
  const i = vols.findIndex((x) => x.name === v.name);
  if (i === -1) vols.push(v);
  else vols[i] = v;
}

function upsertEnv(c: V1Container, e: V1EnvVar): void {
  const env = (c.env ??= []);
  const i = env.findIndex((x) => x.name === e.name);
  if (i === -1) env.push(e);
  else env[i] = e;
}

function upsertMount(c: V1Container, m: V1VolumeMount): void {
  const mounts = (c.volumeMounts ??= []);
  const i = mounts.findIndex((x) => x.name === m.name);
  if (i === -1) mounts.push(m);
  else mounts[i] = m;
}

/**
 * Puts `volume` (the capture volume, or a restore's shadow) at each of the pod's own locations, as
 * the location's folder of the tree: a folder of the image gets a new mount in the main container;
 * the pod's own scratch volume is replaced in every container that mounts it (a storage initializer
 * writing it, the engine reading it), keeping each mount's path, sub-path and read-only flag.
 * Returns the containers whose mounts it changed.
 */
function mountLocations(
  p: V1Pod,
  main: V1Container,
  locations: readonly CacheLocation[],
  volume: string,
): Set<V1Container> {
  const spec = p.spec as NonNullable<V1Pod["spec"]>;
  const containers = [...(spec.initContainers ?? []), ...spec.containers];
  const touched = new Set<V1Container>();
  for (const l of locations) {
    if (l.volume !== undefined) {
      for (const c of containers) {
        if (!c.volumeMounts?.some((m) => m.name === l.volume)) continue;
        c.volumeMounts = c.volumeMounts.map((m) => (m.name === l.volume ? redirected(m, l.tree, volume) : m));
        touched.add(c);
      }
      continue;
    }
    const mounts = (main.volumeMounts ??= []);
    if (!mounts.some((m) => normalisePath(m.mountPath) === l.path))
      mounts.push({ name: volume, mountPath: l.path, subPath: l.tree });
    touched.add(main);
  }
  return touched;
}

function redirected(m: V1VolumeMount, tree: string, volume: string): V1VolumeMount {
  const { subPath, subPathExpr, ...rest } = m;
  return {
    ...rest,
    name: volume,
    ...(subPathExpr
      ? { subPathExpr: `${tree}/${subPathExpr}` }
      : { subPath: subPath ? `${tree}/${subPath}` : tree }),
  };
}

/**
 * Adds the cache env the container does not set itself: a name the pod sets, in any form, is the
 * pod's and wins. What was injected is known from the template alone; nothing on the
 * pod says which names are ours, so nothing the author writes can make us remove their env.
 */
function injectCacheEnv(c: V1Container, wanted: V1EnvVar[]): void {
  const env = [...(c.env ?? [])];
  for (const w of wanted) if (!env.some((e) => e?.name === w.name)) env.push(w);
  if (env.length > 0 || c.env) c.env = env;
}
