import { createHash } from "node:crypto";
import type { V1Container, V1Pod } from "@kubernetes/client-node";
import { mainContainerIndex, type Classification } from "./classify.js";
import { ANN_INJECTED_ENV, shortHash } from "./contract.js";
import {
  envFromRef,
  envSourceRef,
  isCredentialFlag,
  isCredentialName,
  redactUrlCredentials,
  stableJson,
} from "./env.js";
import { isScriptOption, joinShell, looksLikeShell, splitShell, type ShellToken } from "./shell.js";

/** One env entry as it enters the hash: a literal value, a `valueFrom` reference, or a credential's name. */
export interface EnvInput {
  name: string;
  value?: string;
  from?: string;
  credential?: true;
}

/**
 * What goes into the cache hash (SPEC 1.2), secret-free. Its stable JSON is the hash preimage, so a
 * record that keeps these inputs can be re-hashed and compared later.
 */
export interface HashInputs {
  /** Bumped whenever the recipe changes, so old and new hashes never collide. */
  v: 1;
  image: string;
  command: string[];
  args: string[];
  /** Sorted by name; the last definition of a name wins, as in the kubelet. */
  env: EnvInput[];
  envFrom: string[];
  model: string | null;
  /** Set on inputs kept in a record: every command word, arg and env value is a digest (SPEC 1.4). */
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

// Disaggregation role flags: a prefill and a decode worker of one model download the same tree.
const ROLE_BOOLEAN_FLAGS = new Set(["--is-prefill-worker", "--is-decode-worker"]);
const ROLE_VALUE_FLAGS = new Set(["--kv-transfer-config", "--kv-events-config"]);
const isRoleValueFlag = (f: string): boolean => ROLE_VALUE_FLAGS.has(f) || f.startsWith("--disaggregation-");

// Orchestration wiring (Dynamo, Grove, etcd, NATS) and what the webhook itself adds.
const EXCLUDED_ENV_PREFIXES = ["DYN_", "DYNAMO_", "GROVE_", "WARMSTART_"];
const EXCLUDED_ENV_NAMES = new Set(["ETCD_ENDPOINTS", "NATS_SERVER", "NATS_URL"]);

/** Env names that never enter the hash; `injected` are the names a decoration added to this pod. */
export function isExcludedEnv(name: string, injected: ReadonlySet<string> = new Set()): boolean {
  return (
    EXCLUDED_ENV_NAMES.has(name) ||
    EXCLUDED_ENV_PREFIXES.some((p) => name.startsWith(p)) ||
    injected.has(name)
  );
}

/** The env names a decoration recorded as its own on this pod. */
export function injectedEnvNames(pod: V1Pod): Set<string> {
  const raw = pod.metadata?.annotations?.[ANN_INJECTED_ENV];
  return new Set(
    typeof raw === "string"
      ? raw
          .split(",")
          .map((s) => s.trim())
          .filter(Boolean)
      : [],
  );
}

/**
 * Drops disaggregation role flags (with their values) and redacts credential values, over words of
 * either form: argv list items or the words of one shell string. A value flag with nothing after it
 * is simply dropped.
 */
export function stripTokens<T extends ShellToken>(tokens: readonly T[]): T[] {
  const out: T[] = [];
  for (let i = 0; i < tokens.length; i++) {
    const t = tokens[i] as T;
    if (t.op) {
      out.push(t);
      continue;
    }
    const eq = t.text.indexOf("=");
    // A list item with whitespace is a script or a "--flag value" pair; it is split and stripped itself.
    const flag =
      t.text.startsWith("-") && !/\s/.test(t.text) ? (eq === -1 ? t.text : t.text.slice(0, eq)) : "";
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

/** A shell string in canonical form with role flags stripped; "" when nothing is left. */
function normalizeScript(text: string, depth: number): string {
  if (!looksLikeShell(text)) return text;
  const tokens = stripTokens(splitShell(text));
  // The script of a nested `sh -c` is stripped too; other quoted words are values and stay as they are.
  const nested = tokens.map((t, i) => {
    const prev = tokens[i - 1];
    return !t.op && prev && !prev.op && isScriptOption(prev.text) && depth < 3
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
    ...command.map((text) => ({ text: String(text), op: false, args: false })),
    ...args.map((text) => ({ text: String(text), op: false, args: true })),
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

/** The secret-free hash inputs of a pod's main container. */
export function hashInputs(pod: V1Pod, classification?: Classification): HashInputs {
  const c = mainContainer(pod, classification);
  const injected = injectedEnvNames(pod);
  const byName = new Map<string, EnvInput>();
  for (const e of c.env ?? []) {
    if (!e || typeof e.name !== "string" || isExcludedEnv(e.name, injected)) continue;
    byName.delete(e.name); // the last definition wins
    if (isCredentialName(e.name)) byName.set(e.name, { name: e.name, credential: true });
    else if (e.valueFrom) byName.set(e.name, { name: e.name, from: envSourceRef(e.valueFrom) });
    else byName.set(e.name, { name: e.name, value: redactUrlCredentials(String(e.value ?? "")) });
  }
  const { command, args } = stripRoleArgs(c.command ?? [], c.args ?? []);
  return {
    v: 1,
    image: String(c.image ?? "").trim(),
    command,
    args,
    env: [...byName.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0)),
    envFrom: (c.envFrom ?? []).filter(Boolean).map(envFromRef),
    model: classification?.model !== undefined ? redactUrlCredentials(classification.model) : null,
  };
}

/** The hash of inputs: sha256 of their stable JSON. */
export function hashOfInputs(inputs: HashInputs): string {
  return createHash("sha256").update(stableJson(inputs)).digest("hex");
}

/** Composes the cache hash of a pod (SPEC 1.2). Throws only when the pod has no container at all. */
export function cacheHash(pod: V1Pod, classification: Classification): CacheHash {
  const inputs = hashInputs(pod, classification);
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
  return {
    ...inputs,
    command: inputs.command.map(seal),
    args: inputs.args.map(seal),
    env: inputs.env.map((e) => (e.value === undefined ? e : { ...e, value: seal(e.value) })),
    sealed: true,
  };
}
