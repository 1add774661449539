import type { V1Container, V1EnvFromSource, V1EnvVarSource } from "@kubernetes/client-node";

const CREDENTIAL_NAMES = new Set([
  "HF_TOKEN",
  "HUGGING_FACE_HUB_TOKEN",
  "NGC_API_KEY",
  "TOKEN",
  "PASSWORD",
  "SECRET",
]);
const CREDENTIAL_SUFFIXES = [
  "_TOKEN",
  "_API_KEY",
  "_SECRET",
  "_PASSWORD",
  "_SECRET_KEY",
  "_ACCESS_KEY",
  "_PRIVATE_KEY",
];

/**
 * A value as text, whatever JSON put there (a file or a direct post may hold any type where a string
 * belongs): String() for primitives, and never an object's own `toString`, which JSON can set.
 */
export function textOf(v: unknown): string {
  return typeof v === "object" && v !== null ? Object.prototype.toString.call(v) : String(v);
}

/** A list field as a list: anything else (a number, a string, an object where a list belongs) is empty. */
export function listOf<T>(v: readonly T[] | undefined): readonly T[] {
  return Array.isArray(v) ? (v as readonly T[]) : [];
}

/** Env names whose values are credentials: they count by name only and are never recorded. */
export function isCredentialName(name: string): boolean {
  const n = name.toUpperCase();
  return CREDENTIAL_NAMES.has(n) || CREDENTIAL_SUFFIXES.some((s) => n.endsWith(s));
}

/**
 * Command-line flags that carry a credential, a closed list: `--hf-token`, `--token`, `--api-key`,
 * and names ending in `-api-key`, `-secret` or `-password` (underscores read as dashes). Never a
 * bare `-token` suffix: engines have flags such as `--max-num-batched-token(s)` that change the
 * compiled result and must count.
 */
export function isCredentialFlag(flag: string): boolean {
  const n = flag.replace(/^-+/, "").toLowerCase().replace(/_/g, "-");
  return (
    n === "hf-token" ||
    n === "token" ||
    n === "api-key" ||
    n.endsWith("-api-key") ||
    n.endsWith("-secret") ||
    n.endsWith("-password")
  );
}

// Query parameters that carry a credential in signed or token-bearing URLs (S3, GCS, hubs).
const CREDENTIAL_QUERY =
  /([?&](?:token|access_token|auth|api_key|apikey|key|sig|signature|password|x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|x-goog-credential)=)[^&#\s]+/gi;

/**
 * Replaces the user info of URLs (`user:password@`, or a bare token as `token@`) and credential
 * query parameters, so a credential inside a URL never reaches the hash, a record, a log or an Event.
 */
export function redactUrlCredentials(value: string): string {
  // Up to the authority's last `@`: a user name may hold one itself (`me@corp:token@host`).
  return value.replace(/(\/\/)[^/\s]*@/g, "$1<redacted>@").replace(CREDENTIAL_QUERY, "$1<redacted>");
}

/** A stable, secret-free description of where a `valueFrom` env takes its value. */
export function envSourceRef(src: V1EnvVarSource): string {
  const t = textOf;
  if (src.secretKeyRef) return `secretKeyRef:${t(src.secretKeyRef.name ?? "")}/${t(src.secretKeyRef.key)}`;
  if (src.configMapKeyRef)
    return `configMapKeyRef:${t(src.configMapKeyRef.name ?? "")}/${t(src.configMapKeyRef.key)}`;
  if (src.fieldRef) return `fieldRef:${t(src.fieldRef.fieldPath)}`;
  if (src.resourceFieldRef) {
    const r = src.resourceFieldRef;
    return `resourceFieldRef:${t(r.containerName ?? "")}/${t(r.resource)}/${t(r.divisor ?? "")}`;
  }
  // Newer selectors (fileKeyRef, ...): describe them by their own stable JSON.
  const entry: [string, unknown] = Object.entries(src as Record<string, unknown>).find(
    ([, v]) => v !== undefined && v !== null,
  ) ?? ["unknown", {}];
  const [kind, sel] = entry;
  return `${kind}:${stableJson(sel)}`;
}

/** `configMapRef:name` / `secretRef:name`, with the prefix when there is one. */
export function envFromRef(src: V1EnvFromSource): string {
  const base = src.configMapRef
    ? `configMapRef:${textOf(src.configMapRef.name ?? "")}`
    : src.secretRef
      ? `secretRef:${textOf(src.secretRef.name ?? "")}`
      : `unknown:${stableJson(src)}`;
  return src.prefix ? `${base} prefix=${textOf(src.prefix)}` : base;
}

/**
 * Bytes that `$(VAR)`, `$VAR` and `${VAR}` references may add in one reading of a pod (the
 * classifier's, over its main and init containers; the location plan's; the group reading's).
 * Unbounded, a pod of a few kilobytes chains self-doubling entries, or repeats a reference to a
 * large value, into gigabytes: past the webhook's memory, or past Node's longest string (a
 * RangeError, and the pod admitted with no decision). Fixed rather than proportional to the pod:
 * admission reads a pod a fixed number of times, so a constant keeps it linear, and real pods
 * expand kilobytes. Past the budget a reference stays as written.
 */
export const EXPANSION_BUDGET_BYTES = 1 << 20;

/** What expansions may still add: one per reading of a pod, shared by every env it resolves. */
export interface ExpansionBudget {
  left: number;
}

export const expansionBudget = (): ExpansionBudget => ({ left: EXPANSION_BUDGET_BYTES });

/** The budget each resolved env draws from (its command, args and env values, shell words too). */
const budgets = new WeakMap<ReadonlyMap<string, string>, ExpansionBudget>();

// An env that literalEnv did not make gets a budget of its own.
const budgetOf = (env: ReadonlyMap<string, string>): ExpansionBudget => {
  let b = budgets.get(env);
  if (!b) budgets.set(env, (b = expansionBudget()));
  return b;
};

/**
 * The container's literal env as the kubelet would resolve it: later entries win, and `$(VAR)` in a
 * value refers to entries defined before it. Its expansions, and those of words later resolved
 * against it, draw from `budget`: pass one budget for every container of one reading of a pod.
 */
export function literalEnv(container: V1Container, budget = expansionBudget()): Map<string, string> {
  const env = new Map<string, string>();
  budgets.set(env, budget);
  for (const e of listOf(container.env)) {
    if (typeof e?.name !== "string") continue;
    if (e.valueFrom) env.delete(e.name);
    else env.set(e.name, expandKubeRefs(textOf(e.value ?? ""), env));
  }
  return env;
}

/** Replaces each reference by its value while the env's budget lasts; past it, as written. */
function expandWithin(
  value: string,
  env: ReadonlyMap<string, string>,
  ref: RegExp,
  valueOf: (m: string) => string | undefined,
): string {
  const b = budgetOf(env);
  return value.replace(ref, (m: string) => {
    const v = valueOf(m);
    if (v === undefined) return m;
    const added = v.length - m.length;
    if (added > b.left) return m;
    if (added > 0) b.left -= added;
    return v;
  });
}

/**
 * Kubernetes' own `$(VAR)` expansion in command, args and env values (`$$` escapes), within the
 * expansion budget of the env it reads from.
 */
export function expandKubeRefs(value: string, env: ReadonlyMap<string, string>): string {
  return expandWithin(value, env, /\$\$|\$\([A-Za-z_][A-Za-z0-9_.-]*\)/g, (m) =>
    m === "$$" ? "$" : env.get(m.slice(2, -1)),
  );
}

/**
 * A shell's `$VAR` / `${VAR}` expansion, for words read out of a shell script, within the same
 * budget as `$(VAR)`.
 */
export function expandShellVars(value: string, env: ReadonlyMap<string, string>): string {
  return expandWithin(value, env, /\$\{[A-Za-z_][A-Za-z0-9_]*\}|\$[A-Za-z_][A-Za-z0-9_]*/g, (m) =>
    env.get(m[1] === "{" ? m.slice(2, -1) : m.slice(1)),
  );
}

/** JSON with object keys sorted at every level: equal values always give equal text. */
export function stableJson(value: unknown): string {
  return JSON.stringify(sortKeys(value));
}

function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v && typeof v === "object" && !(v instanceof Date)) {
    const o = v as Record<string, unknown>;
    return Object.fromEntries(
      Object.keys(o)
        .filter((k) => o[k] !== undefined)
        .sort()
        .map((k) => [k, sortKeys(o[k])]),
    );
  }
  return v;
}
