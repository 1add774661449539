import { createHash } from "node:crypto";
import type { V1Container, V1Pod } from "@kubernetes/client-node";
import { gpuInputs, mainContainerIndex, type Classification } from "./classify.js";
import { CACHE_VOLUME, ENV_PREWARM, shortHash } from "./contract.js";
import { CLUSTER_SCOPE_KEY } from "./scope.js";
import {
  envFromRef,
  envSourceRef,
  isCredentialFlag,
  isCredentialName,
  redactUrlCredentials,
  stableJson,
  textOf,
} from "./env.js";
import { takesScript } from "./argv.js";
import { groupOf } from "./gangs.js";
import { gpuProductsOf } from "./gpu.js";
import { COMPILE_LOCATION_ENV, MODEL_LOCATION_ENV } from "./locations.js";
import { isScriptOption, joinShell, looksLikeShell, splitShell, type ShellToken } from "./shell.js";

/** One env entry as it enters the hash: a literal value, a `valueFrom` reference, or a credential's name. */
export interface EnvInput {
  name: string;
  value?: string;
  from?: string;
  credential?: true;
}

/** What one container contributes: the main container's fields, and those of every other that touches the cache. */
export interface ContainerInputs {
  image: string;
  /**
   * Command followed by args, as one list: the same argv split differently between the two is
   * the same process. (Records of recipe v1 kept `command` and `args` apart.)
   */
  argv: string[];
  /** Sorted by name; the last definition of a name wins, as in the kubelet. */
  env: EnvInput[];
  envFrom: string[];
}

/** Another container (init, sidecar or regular) that can write into the captured tree. */
export interface OtherContainerInputs extends ContainerInputs {
  kind: "init" | "container";
  /** Where it mounts the cache volume (`path` or `path:subPath`), if it does. */
  mounts: string[];
  /**
   * It shares the pod's process namespace while the engine runs, and so reaches the engine's
   * files through `/proc/<pid>/root` whatever it mounts. Absent otherwise (hashes stay as they were).
   */
  sharedProcesses?: true;
}

/**
 * What goes into the cache hash, secret-free. Its stable JSON is the hash preimage, so a
 * record that keeps these inputs can be re-hashed and compared later. Fields added since v1 are
 * left out when empty, so a pod without them keeps the hash it always had.
 */
export interface HashInputs extends ContainerInputs {
  /** Bumped whenever the recipe changes, so old and new hashes never collide. */
  v: 2;
  /** What is fetched: the hub id, or the storage URI a local model folder is filled from. */
  model: string | null;
  /** The main container's GPUs by kind (`nvidia.com/gpu`, a MIG slice, a DRA claim's template) and count. */
  gpus: Record<string, string>;
  /**
   * The pod's own folders that are captured, as `tree=path` (see locations.ts): the layout of the
   * captured tree, which a restore must find at the same paths.
   */
  locations?: string[];
  /** The sharing scope's key (scopeKey); absent for the cluster scope. */
  scope?: string;
  /** The other containers that mount the cache volume or set a cache location, in pod order. */
  containers?: OtherContainerInputs[];
  /**
   * The rank of a multi-node group (gangs.ts): each rank compiles its own part, so rank k of a
   * later group restores rank k's tree, and the ranks of one group never follow each other.
   */
  rank?: string;
  /**
   * The GPU products the pod selects (node selector or required affinity on
   * `nvidia.com/gpu.product`): NIM profiles, TensorRT-LLM engines and compile caches are built
   * per GPU. Absent when the pod selects none.
   */
  gpuProduct?: string[];
  /**
   * Set on inputs kept in a record, which is readable cluster-wide: every command word, arg and
   * env value is a digest.
   */
  sealed?: true;
}

export interface CacheHash {
  /** sha256 hex of the canonical inputs. */
  hash: string;
  /** The first 16 hex chars (labels, claim and Lease names). */
  short: string;
  inputs: HashInputs;
}

/** What replaces a credential value in the inputs. */
export const REDACTED = "<redacted>";

// Disaggregation role flags (a prefill and a decode worker of one model download the same tree)
// and serving-endpoint flags (where it listens and what it calls itself change neither download
// nor compiled result). Matched with underscores read as dashes, as the engines' parsers do.
const ROLE_BOOLEAN_FLAGS = new Set(["--is-prefill-worker", "--is-decode-worker"]);
// A multi-node group's rendezvous address and each node's rank are wiring too: every node of the
// group fetches the same checkpoint and builds the same kernels.
const ROLE_VALUE_FLAGS = new Set([
  "--kv-transfer-config",
  "--kv-events-config",
  "--host",
  "--port",
  "--dist-init-addr",
  "--node-rank",
]);
const isRoleValueFlag = (f: string): boolean => ROLE_VALUE_FLAGS.has(f) || f.startsWith("--disaggregation-");
// Takes one or more names (`--served-model-name a b`).
const MULTI_VALUE_FLAGS = new Set(["--served-model-name"]);

// Orchestration wiring: each replica, group or role gets its own (Dynamo, Grove, LeaderWorkerSet,
// AIBrix, etcd, NATS), and none of it changes what is downloaded or compiled. What the webhook
// injects never enters: the hash is composed from the pod as its author wrote it, before any
// decoration. WARMSTART_PREWARM only says whether a restore warms the page cache, so pods that
// differ only in it share one cache. Every other env the author set counts, WARMSTART_* too.
// Tracing settings (OTEL_*, e.g. each role's service name) say where spans go, nothing more.
// RoleBasedGroup's RBG_* is the same wiring as LWS_* (sgl-project/rbg pkg/discovery/env_builder.go).
const EXCLUDED_ENV_PREFIXES = ["DYN_", "DYNAMO_", "GROVE_", "LWS_", "RBG_", "OTEL_"];
// A group's size is its parallel layout.
const KEPT_ENV_NAMES = new Set(["LWS_GROUP_SIZE", "RBG_LWP_GROUP_SIZE"]);
const EXCLUDED_ENV_NAMES = new Set([
  "ETCD_ENDPOINTS",
  "NATS_SERVER",
  "NATS_URL",
  "STORM_SERVICE_NAME",
  "ROLESET_NAME",
  "ROLESET_INDEX",
  "ROLE_NAME",
  "ROLE_REPLICA_INDEX",
  "ROLE_TEMPLATE_HASH",
  ENV_PREWARM,
]);
// KServe names the service in the pod; once the model is known by its storage URI, the name says nothing more.
const SERVICE_NAME_ENV = "INFERENCE_SERVICE_NAME";

/** Env names that never enter the hash. */
export function isExcludedEnv(name: string): boolean {
  if (KEPT_ENV_NAMES.has(name)) return false;
  return EXCLUDED_ENV_NAMES.has(name) || EXCLUDED_ENV_PREFIXES.some((p) => name.startsWith(p));
}

/** Env whose value the engine reads as more command-line args (`VLLM_ADDITIONAL_ARGS`, `EXTRA_ARGS`). */
const isArgsEnv = (name: string): boolean => /(^|_)ARGS$/.test(name);

/**
 * Env that points an engine's caches somewhere: a container that sets one writes where the
 * engines read, so it counts in the hash. A fixed list, independent of the configured
 * cache-env template, so changing the template never changes a hash.
 */
const CACHE_LOCATION_ENV: ReadonlySet<string> = new Set([
  ...MODEL_LOCATION_ENV,
  ...COMPILE_LOCATION_ENV,
  "HOME",
]);

/**
 * Drops disaggregation role flags (with their values) and redacts credential values, over words of
 * either form: argv list items or the words of one shell string. A value flag with nothing after it
 * is simply dropped.
 */
function stripTokens<T extends ShellToken>(tokens: readonly T[]): T[] {
  const out: T[] = [];
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i] as T;
    if (t.op) {
      out.push(t);
      continue;
    }
    const eq = t.text.indexOf("=");
    // A list item with whitespace before any `=` is a script or a "--flag value" pair; it is split and
    // stripped itself. Whitespace after the `=` is the flag's value (`--kv-transfer-config={"a": 1}`).
    const name = eq === -1 ? t.text : t.text.slice(0, eq);
    const flag = t.text.startsWith("-") && !/\s/.test(name) ? name.replace(/_/g, "-") : "";
    const next = tokens[i + 1];
    const nextIsValue = (allowDash: boolean): boolean =>
      next !== undefined &&
      !next.op &&
      (allowDash ? !next.text.startsWith("--") : !next.text.startsWith("-"));

    if (flag && ROLE_BOOLEAN_FLAGS.has(flag)) continue;
    if (flag && isRoleValueFlag(flag)) {
      if (eq === -1 && nextIsValue(true)) i++;
      continue;
    }
    if (flag && MULTI_VALUE_FLAGS.has(flag)) {
      if (eq === -1) while (i + 1 < tokens.length && nextValueAt(tokens, i + 1)) i++;
      continue;
    }
    if (flag && isCredentialFlag(flag)) {
      if (eq !== -1) out.push({ ...t, text: `${flag}=${REDACTED}` });
      else {
        out.push(t);
        if (nextIsValue(false)) {
          out.push({ ...(next as T), text: REDACTED });
          i++;
        }
      }
      continue;
    }
    const assign = /^([A-Za-z_][A-Za-z0-9_]*)=/.exec(t.text);
    if (assign?.[1] && isCredentialName(assign[1])) {
      out.push({ ...t, text: `${assign[1]}=${REDACTED}` });
      continue;
    }
    out.push({ ...t, text: redactUrlCredentials(t.text) });
  }
  return out;
}

const nextValueAt = (tokens: readonly ShellToken[], j: number): boolean => {
  const t = tokens[j];
  return t !== undefined && !t.op && !t.text.startsWith("-");
};

/** A shell string in canonical form with role flags stripped; "" when nothing is left. */
function normalizeScript(text: string, depth: number): string {
  if (!looksLikeShell(text)) return text;
  const tokens = stripTokens(splitShell(text));
  // The script of a nested `sh -c` is stripped too; other quoted words are values and stay as they are.
  const nested = tokens.map((t, i) => {
    const prev = tokens[i - 1];
    return !t.op && prev && !prev.op && takesScript(prev.text) && depth < 3
      ? { ...t, text: normalizeScript(t.text, depth + 1) }
      : t;
  });
  return joinShell(nested);
}

/** Command and args with role flags stripped in every form; flags split across the two are handled. */
export function stripRoleArgs(
  command: readonly string[],
  args: readonly string[],
): { command: string[]; args: string[] } {
  const items = [
    ...command.map((text) => ({ text: textOf(text), op: false, args: false })),
    ...args.map((text) => ({ text: textOf(text), op: false, args: true })),
  ];
  const kept = stripTokens(items)
    .map((t) => ({ ...t, wasEmpty: t.text === "", text: normalizeScript(t.text, 0) }))
    // An item empty as written is an argument and stays; one emptied by stripping ("--is-prefill-worker
    // --disaggregation-mode x" as one item) goes.
    .filter((t) => t.text !== "" || t.wasEmpty);
  return {
    command: kept.filter((t) => !t.args).map((t) => t.text),
    args: kept.filter((t) => t.args).map((t) => t.text),
  };
}

function mainContainer(pod: V1Pod, classification?: Classification): V1Container {
  const containers = pod.spec?.containers ?? [];
  const idx = classification?.containerIndex ?? mainContainerIndex(pod) ?? 0;
  const c = containers[idx];
  if (!c || typeof c !== "object") throw new Error("pod has no containers to hash");
  return c;
}

/** One container's secret-free inputs. */
function containerInputs(
  c: V1Container,
  excluded: (name: string) => boolean = isExcludedEnv,
): ContainerInputs {
  const byName = new Map<string, EnvInput>();
  for (const e of Array.isArray(c.env) ? c.env : []) {
    if (!e || typeof e.name !== "string" || excluded(e.name)) continue;
    byName.delete(e.name); // the last definition wins
    if (isCredentialName(e.name)) byName.set(e.name, { name: e.name, credential: true });
    else if (e.valueFrom) byName.set(e.name, { name: e.name, from: envSourceRef(e.valueFrom) });
    else {
      const raw = textOf(e.value ?? "");
      const value = isArgsEnv(e.name) ? stripArgsValue(raw) : raw;
      byName.set(e.name, { name: e.name, value: redactUrlCredentials(value) });
    }
  }
  const { command, args } = stripRoleArgs(
    Array.isArray(c.command) ? c.command : [],
    Array.isArray(c.args) ? c.args : [],
  );
  return {
    image: textOf(c.image ?? "").trim(),
    argv: canonicalArgv([...command, ...args]),
    env: [...byName.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0)),
    envFrom: (Array.isArray(c.envFrom) ? c.envFrom : []).filter(Boolean).map(envFromRef),
  };
}

const SHELLS = new Set(["sh", "bash", "dash", "ash", "zsh"]);

/**
 * `sh -c "exec prog a b"` runs the same process as `prog a b`: a script that is one plain command
 * (no operator, no expansion, nothing after it) is read as its words, `exec` dropped, so an
 * operator that wraps a worker's argv in a shell does not split its cache.
 */
function canonicalArgv(argv: string[]): string[] {
  const [shell, opt, script, ...rest] = argv;
  if (shell === undefined || opt === undefined || script === undefined || rest.length > 0) return argv;
  if (!SHELLS.has(shell.slice(shell.lastIndexOf("/") + 1)) || !isScriptOption(opt)) return argv;
  const tokens = splitShell(script);
  if (tokens.length === 0 || tokens.some((t) => t.op || /[$`]/.test(t.text))) return argv;
  const words = tokens.map((t) => t.text);
  return words[0] === "exec" ? words.slice(1) : words;
}

/** Role and endpoint flags stripped from an env value the engine reads as args. */
function stripArgsValue(value: string): string {
  return joinShell(stripTokens(splitShell(value)));
}

/**
 * Where a container mounts a volume that is captured: Warmstart's own (CACHE_VOLUME), or the
 * pod's own scratch volumes at the locations its engine writes (locations.ts).
 */
function cacheMounts(c: V1Container, captured: ReadonlySet<string>): string[] {
  return (Array.isArray(c.volumeMounts) ? c.volumeMounts : [])
    .filter((m) => m?.name === CACHE_VOLUME || captured.has(textOf(m?.name)))
    .map(
      (m) =>
        `${textOf(m.mountPath)}${m.subPath ? `:${textOf(m.subPath)}` : ""}${m.subPathExpr ? `:$(${textOf(m.subPathExpr)})` : ""}`,
    );
}

const touchesCache = (c: V1Container, captured: ReadonlySet<string>): boolean =>
  cacheMounts(c, captured).length > 0 ||
  (Array.isArray(c.env) ? c.env : []).some(
    (e) => typeof e?.name === "string" && CACHE_LOCATION_ENV.has(e.name),
  );

/** The containers other than the main one that can write into the captured tree (they count in the hash). */
function otherCacheContainers(
  pod: V1Pod,
  mainIndex: number,
  captured: ReadonlySet<string>,
): OtherContainerInputs[] {
  const list = (v: unknown): V1Container[] =>
    Array.isArray(v)
      ? (v as unknown[]).filter((c): c is V1Container => typeof c === "object" && c !== null)
      : [];
  // With one process namespace, a container running beside the engine reaches its files.
  const shared = pod.spec?.shareProcessNamespace === true;
  const via = (
    c: V1Container,
    running: boolean,
  ): Pick<OtherContainerInputs, "mounts" | "sharedProcesses"> => ({
    mounts: cacheMounts(c, captured),
    ...(shared && running && !touchesCache(c, captured) ? { sharedProcesses: true as const } : {}),
  });
  const out: OtherContainerInputs[] = [];
  for (const c of list(pod.spec?.initContainers)) {
    // A sidecar (restartPolicy Always) keeps running beside the engine; a plain init container ends first.
    const sidecar = c.restartPolicy === "Always";
    if (touchesCache(c, captured) || (shared && sidecar))
      out.push({ kind: "init", ...containerInputs(c), ...via(c, sidecar) });
  }
  list(pod.spec?.containers).forEach((c, i) => {
    if (i !== mainIndex && (touchesCache(c, captured) || shared))
      out.push({ kind: "container", ...containerInputs(c), ...via(c, true) });
  });
  return out;
}

export interface HashOptions {
  /** The pod's sharing-scope key (scopeKey); the cluster scope when absent. */
  scope?: string;
}

/** The secret-free hash inputs of a pod: its main container, the containers that touch the cache, its scope. */
export function hashInputs(pod: V1Pod, classification?: Classification, opts: HashOptions = {}): HashInputs {
  const c = mainContainer(pod, classification);
  const mainIndex = (pod.spec?.containers ?? []).indexOf(c);
  const plan = classification?.locations;
  const captured = new Set((plan?.locations ?? []).flatMap((l) => (l.volume ? [l.volume] : [])));
  const others = otherCacheContainers(pod, mainIndex, captured);
  const fromStorage = classification?.source !== undefined;
  const excluded = (name: string): boolean =>
    isExcludedEnv(name) || (fromStorage && name === SERVICE_NAME_ENV);
  const locations = (plan?.locations ?? []).map((l) => `${l.tree}=${l.path}`);
  const rank = groupOf(pod, c)?.rank;
  const products = gpuProductsOf(pod);
  return {
    v: 2,
    ...containerInputs(c, excluded),
    model: classification?.model !== undefined ? redactUrlCredentials(classification.model) : null,
    gpus: classification?.gpus ?? gpuInputs(pod, c),
    ...(locations.length ? { locations } : {}),
    ...(opts.scope && opts.scope !== CLUSTER_SCOPE_KEY ? { scope: opts.scope } : {}),
    ...(others.length ? { containers: others } : {}),
    ...(rank !== undefined ? { rank } : {}),
    ...(products.length ? { gpuProduct: products } : {}),
  };
}

/** The hash of inputs: sha256 of their stable JSON. */
export function hashOfInputs(inputs: HashInputs): string {
  return createHash("sha256").update(stableJson(inputs)).digest("hex");
}

/** Composes the cache hash of a pod (see HashInputs). Throws only when the pod has no container at all. */
export function cacheHash(pod: V1Pod, classification: Classification, opts: HashOptions = {}): CacheHash {
  const inputs = hashInputs(pod, classification, opts);
  const hash = hashOfInputs(inputs);
  return { hash, short: shortHash(hash), inputs };
}

const SEAL = "sha256:";
const seal = (v: string): string =>
  v.startsWith(SEAL) ? v : `${SEAL}${createHash("sha256").update(v).digest("hex").slice(0, 16)}`;

/**
 * The inputs as a record may keep them: no arg or env value verbatim (a secret can hide in any of
 * them), each replaced by a short digest, so two records (or a record and a pod, sealed the same
 * way) can still be compared input by input. Image, model and names stay readable.
 */
export function sealInputs(inputs: HashInputs): HashInputs {
  if (inputs.sealed) return inputs;
  const sealContainer = <T extends ContainerInputs>(c: T): T => ({
    ...c,
    argv: c.argv.map(seal),
    env: c.env.map((e) => (e.value === undefined ? e : { ...e, value: seal(e.value) })),
  });
  return {
    ...sealContainer(inputs),
    ...(inputs.containers ? { containers: inputs.containers.map(sealContainer) } : {}),
    sealed: true,
  };
}

/** The scope a record's inputs were hashed in (records without inputs, or without a scope, are cluster-wide). */
export function scopeOfInputs(inputs: unknown): string {
  const s = (inputs as { scope?: unknown } | undefined)?.scope;
  return typeof s === "string" && s ? s : CLUSTER_SCOPE_KEY;
}
