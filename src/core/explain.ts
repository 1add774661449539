/**
 * `warmstart explain`, the pure part: find the pod in a manifest, show the admission view, and
 * compare two pods (or a pod and a cache record) input by input, so a user can see why a cache misses.
 */
import type { V1Pod, V1PodTemplateSpec } from "@kubernetes/client-node";
import { parseAllDocuments } from "yaml";
import { classifyPod, type Classification } from "./classify.js";
import { DEFAULT_CACHE_ENV_TEMPLATE, DEFAULT_CACHE_ROOT } from "./decorate.js";
import type { CacheLocation, SkippedLocation } from "./locations.js";
import { LABEL_SHARE_GROUP, shortHash, type SharingScope } from "./contract.js";
import { isRecord } from "./guards.js";
import { scopeKey } from "./scope.js";
import {
  hashInputs,
  hashOfInputs,
  scopeOfInputs,
  sealInputs,
  type ContainerInputs,
  type HashInputs,
} from "./hash.js";
import { looksLikeShell, quoteShellWord, shellWords } from "./shell.js";

/** An input that looks like it changes from run to run, or pod to pod. */
export interface PerRunFlag {
  input: string;
  value: string;
  why: string;
}

/** Where the engine's files land in a leader: the pod's own folders captured, and Warmstart's root for the rest. */
export interface LocationsView {
  /** The pod's own folders that are captured (and where a restore presents them again). */
  captured: Array<Pick<CacheLocation, "path" | "kind" | "from" | "tree">>;
  /** Cache env the pod does not set, pointed into Warmstart's root (defaults of the webhook's template). */
  injected: Array<{ name: string; value: string }>;
  /** Locations the pod names that are not captured, and why. */
  skipped: SkippedLocation[];
}

export interface Explanation {
  /** What was explained: `Deployment vllm`, `LeaderWorkerSet x (worker)`, `Pod p`. */
  name: string;
  downloader: boolean;
  reason: string;
  model: string | null;
  /**
   * The sharing scope the hash is computed in: `cluster`, `namespace:<ns>` or `group:<name>`, as the
   * webhook's `--sharing-scope` makes it (a cache record's own, for a record).
   */
  scope: string;
  /** The cache hash the webhook would stamp, in that scope; null when the pod is left alone. */
  hash: string | null;
  short: string | null;
  container: string | null;
  /** Set when the pod downloads but is admitted cold anyway (its model is on its own volume). */
  cold?: string;
  locations?: LocationsView;
  warnings: PerRunFlag[];
}

export interface Difference {
  input: string;
  a: string | null;
  b: string | null;
}

export interface Comparison {
  a: Explanation;
  b: Explanation;
  /** Whether the two would hash equal (computed from the inputs even for pods left alone). */
  equal: boolean;
  differences: Difference[];
  perRun: Array<PerRunFlag & { pod: "a" | "b" | "both" }>;
}

/**
 * What explain looks at: a pod (from a Pod or a workload's template, with the manifest's
 * namespace when it names one), or a cache record's inputs.
 */
export type Subject =
  | { kind: "pod"; source: string; name: string; pod: V1Pod; namespace?: string }
  | { kind: "cache"; source: string; name: string; inputs: HashInputs; recordedHash?: string };

/**
 * The webhook's settings a pod's hash depends on: its sharing scope (`--sharing-scope`, cluster by
 * default), the namespace the pod is created in (the manifest's, else `default`) and, under the
 * group scope, that namespace's `warmstart.dev/share-group` label.
 */
export interface ExplainOptions {
  sharingScope?: SharingScope;
  namespace?: string;
  shareGroup?: string;
}

const TEMPLATE_KINDS = new Set([
  "Deployment",
  "StatefulSet",
  "ReplicaSet",
  "DaemonSet",
  "Job",
  "ReplicationController",
]);

/** Parses YAML (one or more documents) or JSON. Errors are one line and name the source. */
export function parseManifests(text: string, source: string): unknown[] {
  const trimmed = text.trim();
  if (trimmed === "") throw new Error(`${source}: empty input`);
  if (trimmed.startsWith("{") || trimmed.startsWith("[")) {
    try {
      return [JSON.parse(trimmed) as unknown];
    } catch {
      // Not strict JSON; YAML's flow syntax may still read it, with a better message if not.
    }
  }
  const docs = parseAllDocuments(text);
  if (!Array.isArray(docs)) throw new Error(`${source}: not a YAML or JSON document`);
  const out: unknown[] = [];
  for (const d of docs) {
    const err = d.errors[0];
    if (err) throw new Error(`${source}: invalid YAML or JSON: ${firstLine(err.message)}`);
    out.push(d.toJS() as unknown);
  }
  return out;
}

/** Every Pod, workload (each of its pod templates) and cache record among the documents, in order (a `List` is looked into). */
export function findSubjects(docs: readonly unknown[], source: string): Subject[] {
  const kinds: string[] = [];
  const out: Subject[] = [];
  const visit = (doc: unknown): void => {
    if (!isRecord(doc)) return;
    const kind = typeof doc.kind === "string" ? doc.kind : "";
    if (kind === "List" && Array.isArray(doc.items)) {
      for (const item of doc.items as unknown[]) visit(item);
      return;
    }
    const s = subjectsOf(doc, kind, source);
    if (s.length === 0) kinds.push(kind || "(no kind)");
    out.push(...s);
  };
  for (const doc of docs) visit(doc);
  if (out.length) return out;
  const seen = kinds.length ? ` (found ${[...new Set(kinds)].join(", ")})` : "";
  throw new Error(`${source}: no Pod, workload or ModelCache found${seen}`);
}

/** The first subject among the documents. */
export function findSubject(docs: readonly unknown[], source: string): Subject {
  return findSubjects(docs, source)[0] as Subject;
}

function subjectsOf(doc: Record<string, unknown>, kind: string, source: string): Subject[] {
  const spec = isRecord(doc.spec) ? doc.spec : undefined;
  const metaName = isRecord(doc.metadata) && typeof doc.metadata.name === "string" ? doc.metadata.name : "";
  const label = `${kind || "object"}${metaName ? ` ${metaName}` : ""}`;
  const what = `${source}: ${label}`;
  // A workload's pods are created in the workload's namespace.
  const ns = isRecord(doc.metadata) ? doc.metadata.namespace : undefined;
  const namespace = typeof ns === "string" && ns ? { namespace: ns } : {};
  const fromTemplate = (template: unknown, name: string, where: string): Subject => {
    if (!isRecord(template)) throw new Error(`${where} has no pod template`);
    const t = template as V1PodTemplateSpec;
    const pod = { apiVersion: "v1", kind: "Pod", metadata: t.metadata ?? {}, spec: t.spec } as V1Pod;
    return { kind: "pod", source, name, pod: checkPod(pod, where), ...namespace };
  };
  if (kind === "Pod") return [{ kind: "pod", source, name: label, pod: checkPod(doc, what), ...namespace }];
  if (kind === "ModelCache") {
    const status = isRecord(doc.status) ? doc.status : undefined;
    const inputs = spec?.inputs ?? status?.inputs;
    if (!isHashInputs(inputs)) throw new Error(`${what} records no hash inputs`);
    const recorded = spec?.hash ?? status?.hash;
    return [
      {
        kind: "cache",
        source,
        name: label,
        inputs: upgradeInputs(inputs),
        ...(typeof recorded === "string" ? { recordedHash: recorded } : {}),
      },
    ];
  }
  if (kind === "LeaderWorkerSet") {
    // The leader runs the leader template, or the worker template when there is none.
    const lwt = isRecord(spec?.leaderWorkerTemplate) ? spec.leaderWorkerTemplate : undefined;
    if (!lwt) throw new Error(`${what} has no leaderWorkerTemplate`);
    const leader = lwt.leaderTemplate ?? lwt.workerTemplate;
    return [
      fromTemplate(leader, `${label} (leader)`, `${what} (leader)`),
      fromTemplate(lwt.workerTemplate, `${label} (worker)`, `${what} (worker)`),
    ];
  }
  let template: unknown;
  if (TEMPLATE_KINDS.has(kind)) template = spec?.template;
  else if (kind === "CronJob") {
    const jt = isRecord(spec?.jobTemplate) ? spec.jobTemplate : undefined;
    template = isRecord(jt?.spec) ? jt.spec.template : undefined;
  } else if (kind === "PodTemplate") template = doc.template;
  else if (kind && isRecord(spec?.template) && isRecord(spec.template.spec))
    template = spec.template; // other workload kinds
  else return [];
  return [fromTemplate(template, label, what)];
}

function checkPod(pod: V1Pod, what: string): V1Pod {
  const containers = pod.spec?.containers as unknown;
  if (!Array.isArray(containers) || containers.length === 0 || !containers.every(isRecord)) {
    throw new Error(`${what} has no containers`);
  }
  return pod;
}

/** Parses a manifest's text and picks what to explain: its first subject. */
export function subjectFromText(text: string, source: string): Subject {
  return findSubject(parseManifests(text, source), source);
}

/** Parses a manifest's text: every subject in it. */
export function subjectsFromText(text: string, source: string): Subject[] {
  return findSubjects(parseManifests(text, source), source);
}

/** A record written by recipe v1 kept command and args apart: read as one argv. */
function upgradeInputs(inputs: HashInputs): HashInputs {
  const old = inputs as HashInputs & { command?: string[]; args?: string[] };
  if (Array.isArray(old.argv)) return inputs;
  const argv = [...(old.command ?? []), ...(old.args ?? [])];
  const containers = inputs.containers?.map(
    (c) => upgradeInputs(c as unknown as HashInputs) as unknown as typeof c,
  );
  return { ...inputs, argv, ...(containers ? { containers } : {}) };
}

interface Viewed {
  view: Explanation;
  inputs: HashInputs;
}

function view(s: Subject, o: ExplainOptions): Viewed {
  if (s.kind === "cache") {
    // Sealed inputs cannot be re-hashed: the record's own hash stands for them.
    const hash = s.inputs.sealed && s.recordedHash ? s.recordedHash : hashOfInputs(s.inputs);
    const warnings = perRunInputs(s.inputs);
    if (!s.inputs.sealed && s.recordedHash !== undefined && s.recordedHash !== hash) {
      warnings.push({
        input: "hash",
        value: s.recordedHash,
        why: "the record's hash does not match its inputs",
      });
    }
    return {
      inputs: s.inputs,
      view: {
        name: s.name,
        downloader: true,
        reason: "cache record",
        model: s.inputs.model,
        scope: scopeOfInputs(s.inputs),
        hash,
        short: shortHash(hash),
        container: null,
        warnings,
      },
    };
  }
  const c: Classification = classifyPod(s.pod);
  const scope = scopeKey(
    o.sharingScope ?? "cluster",
    o.namespace ?? s.namespace ?? "default",
    o.shareGroup ? { [LABEL_SHARE_GROUP]: o.shareGroup } : undefined,
  );
  const inputs = hashInputs(s.pod, c, { scope });
  const hash = c.downloader ? hashOfInputs(inputs) : null;
  const main = c.containerIndex !== undefined ? s.pod.spec?.containers[c.containerIndex] : undefined;
  const plan = c.locations;
  const podSets = new Set((main?.env ?? []).map((e) => e?.name));
  const locations: LocationsView | undefined = plan && {
    captured: plan.locations.map(({ path, kind, from, tree }) => ({ path, kind, from, tree })),
    injected: DEFAULT_CACHE_ENV_TEMPLATE.filter((e) => !podSets.has(e.name)).map((e) => ({
      name: e.name,
      value: e.value.split("{root}").join(DEFAULT_CACHE_ROOT),
    })),
    skipped: plan.skipped,
  };
  return {
    inputs,
    view: {
      name: s.name,
      downloader: c.downloader,
      reason: c.reason,
      model: c.model ?? null,
      scope,
      hash,
      short: hash ? shortHash(hash) : null,
      container: main?.name ?? null,
      ...(c.cold ? { cold: c.cold } : {}),
      ...(c.downloader && locations ? { locations } : {}),
      warnings: c.downloader ? perRunInputs(inputs) : [],
    },
  };
}

/** The admission view of one pod or record. */
export function explain(subject: Subject, o: ExplainOptions = {}): Explanation {
  return view(subject, o).view;
}

/** The admission view of two subjects, which hash inputs differ and which look per-run. */
export function compare(a: Subject, b: Subject, o: ExplainOptions = {}): Comparison {
  const va = view(a, o);
  const vb = view(b, o);
  // A sealed record is compared with the other side sealed the same way.
  if (va.inputs.sealed || vb.inputs.sealed) {
    va.inputs = sealInputs(va.inputs);
    vb.inputs = sealInputs(vb.inputs);
  }
  const fa = perRunInputs(va.inputs);
  const fb = perRunInputs(vb.inputs);
  const key = (f: PerRunFlag): string => `${f.input}\u0000${f.value}`;
  const inB = new Set(fb.map(key));
  const inA = new Set(fa.map(key));
  const perRun = [
    ...fa.map((f) => ({ ...f, pod: inB.has(key(f)) ? ("both" as const) : ("a" as const) })),
    ...fb.filter((f) => !inA.has(key(f))).map((f) => ({ ...f, pod: "b" as const })),
  ];
  return {
    a: va.view,
    b: vb.view,
    equal:
      va.view.hash !== null && vb.view.hash !== null
        ? va.view.hash === vb.view.hash
        : hashOfInputs(va.inputs) === hashOfInputs(vb.inputs),
    differences: diffInputs(va.inputs, vb.inputs),
    perRun,
  };
}

/** The inputs that differ, named (`image`, `model`, `args[3]`, `env.HF_HOME`, ...), in input order. */
export function diffInputs(a: HashInputs, b: HashInputs): Difference[] {
  const out: Difference[] = [];
  const scalar = (input: string, x: string | null, y: string | null): void => {
    if (x !== y) out.push({ input, a: x, b: y });
  };
  scalar("v", String(a.v), String(b.v));
  scalar("scope", scopeOfInputs(a), scopeOfInputs(b));
  scalar("model", a.model, b.model);
  const gpus = (g: Record<string, string> | undefined): string | null =>
    g && Object.keys(g).length
      ? Object.keys(g)
          .sort()
          .map((k) => `${k}=${g[k]}`)
          .join(", ")
      : null;
  scalar("gpus", gpus(a.gpus), gpus(b.gpus));
  scalar("locations", a.locations?.join(", ") ?? null, b.locations?.join(", ") ?? null);
  out.push(...diffContainer("", a, b));
  const ca = a.containers ?? [];
  const cb = b.containers ?? [];
  for (let k = 0; k < Math.max(ca.length, cb.length); k++) {
    const x = ca[k];
    const y = cb[k];
    const prefix = `containers[${k}].`;
    if (!x || !y) {
      scalar(`containers[${k}]`, x ? `${x.kind} ${x.image}` : null, y ? `${y.kind} ${y.image}` : null);
      continue;
    }
    scalar(`${prefix}kind`, x.kind, y.kind);
    out.push(...diffContainer(prefix, x, y));
    scalar(`${prefix}mounts`, x.mounts.join(", ") || null, y.mounts.join(", ") || null);
  }
  return out;

  function diffContainer(prefix: string, x: ContainerInputs, y: ContainerInputs): Difference[] {
    const d: Difference[] = [];
    const sc = (input: string, p: string | null, q: string | null): void => {
      if (p !== q) d.push({ input: `${prefix}${input}`, a: p, b: q });
    };
    sc("image", x.image, y.image);
    d.push(...diffLists(`${prefix}argv`, x.argv, y.argv));
    const ea = new Map(x.env.map((e) => [e.name, envDisplay(e)]));
    const eb = new Map(y.env.map((e) => [e.name, envDisplay(e)]));
    for (const n of [...new Set([...ea.keys(), ...eb.keys()])].sort())
      sc(`env.${n}`, ea.get(n) ?? null, eb.get(n) ?? null);
    sc("envFrom", x.envFrom.join(", ") || null, y.envFrom.join(", ") || null);
    return d;
  }
}

/**
 * Lists are compared item by item when their lengths match (so one changed flag value shows as
 * `args[5]`), and as a whole otherwise.
 */
export function diffLists(name: string, a: readonly string[], b: readonly string[]): Difference[] {
  if (a.length !== b.length) return [{ input: name, a: joinList(a), b: joinList(b) }];
  const out: Difference[] = [];
  a.forEach((x, k) => {
    if (x !== b[k]) out.push({ input: `${name}[${k}]`, a: x, b: b[k] ?? null });
  });
  return out;
}

const joinList = (l: readonly string[]): string => l.map(quoteShellWord).join(" ");

function envDisplay(e: HashInputs["env"][number]): string {
  if (e.credential) return "<credential, counted by name>";
  if (e.from !== undefined) return `valueFrom ${e.from}`;
  return e.value ?? "";
}

// --- per-run detection ----------------------------------------------------------------------

const UUID = /[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}/i;
const TIMESTAMP =
  /\d{4}-[01]\d-[0-3]\d[T _][0-2]\d:?[0-5]\d|(^|\D)20\d{2}[01]\d[0-3]\d[T_-]?[0-2]\d[0-5]\d([0-5]\d)?(\D|$)/;
const EPOCH = /(^|\D)1[5-9]\d{8}(\d{3})?(\D|$)/;
const HEX_ID = /(^|[^0-9a-z])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{12,}([^0-9a-z]|$)/i;
// A pod's place in its workload: `POD_INDEX`, `JOB_COMPLETION_INDEX`, `WORKER_INDEX`, `RANK`,
// `NODE_RANK`, `REPLICA_ID`. A settings name that merely ends in INDEX (`NCCL_IB_GID_INDEX`,
// a device or port index) is configuration, the same in every pod.
const INDEX_ENV =
  /^(?:(?:[A-Z0-9]+_)*(?:POD|REPLICA|WORKER|GROUP|COMPLETION|MEMBER|INSTANCE|NODE|SHARD)_(?:INDEX|ORDINAL|ID)|(?:[A-Z0-9]+_)*(?:NODE_|LOCAL_|GLOBAL_|WORLD_)?RANK|ORDINAL|REPLICA_ID|INDEX)$/;
const IDENTITY_ENV = new Set(["POD_NAME", "HOSTNAME", "POD_IP", "POD_UID", "NODE_NAME"]);
const FLOATING_TAGS = new Set([
  "latest",
  "main",
  "master",
  "nightly",
  "dev",
  "develop",
  "edge",
  "head",
  "stable",
  "canary",
  "rolling",
  "unstable",
]);
// Pinned revisions are hex on purpose: not a random id.
const PINNING_FLAGS = new Set(["--revision", "--code-revision", "--tokenizer-revision"]);

/** Why a value looks like it changes per run; undefined when it does not. */
export function perRunValue(value: string): string | undefined {
  if (UUID.test(value)) return "looks like a random id (UUID)";
  if (TIMESTAMP.test(value)) return "looks like a timestamp";
  if (EPOCH.test(value)) return "looks like a Unix timestamp";
  if (HEX_ID.test(value)) return "looks like a random hex id (fine if it pins a version)";
  return undefined;
}

/** Why an image reference floats; undefined when it is pinned by a fixed tag or a digest. */
export function floatingImage(image: string): string | undefined {
  if (!image || image.includes("@")) return undefined;
  const last = image.slice(image.lastIndexOf("/") + 1);
  const colon = last.lastIndexOf(":");
  if (colon === -1) return "no tag, so latest: the hash stays the same while the image behind it changes";
  const tag = last.slice(colon + 1);
  if (FLOATING_TAGS.has(tag.toLowerCase())) {
    return `floating tag "${tag}": the hash stays the same while the image behind it changes`;
  }
  return undefined;
}

/** The hash inputs that look like they change every run or every pod. */
export function perRunInputs(i: HashInputs): PerRunFlag[] {
  const out: PerRunFlag[] = [];
  const img = floatingImage(i.image);
  if (img) out.push({ input: "image", value: i.image, why: img });
  if (i.model !== null) {
    const why = perRunValue(i.model);
    if (why) out.push({ input: "model", value: i.model, why });
  }
  const scanList = (name: "argv", list: readonly string[]): void => {
    list.forEach((item, k) => {
      const words = looksLikeShell(item) ? shellWords(item) : [item];
      words.forEach((w, j) => {
        const prev = j > 0 ? words[j - 1] : k > 0 ? list[k - 1] : undefined;
        const eq = w.indexOf("=");
        const flag = w.startsWith("-") && eq !== -1 ? w.slice(0, eq) : undefined;
        if ((prev && PINNING_FLAGS.has(prev)) || (flag && PINNING_FLAGS.has(flag))) return;
        const why = perRunValue(flag ? w.slice(eq + 1) : w);
        if (why) out.push({ input: `${name}[${k}]`, value: w, why });
      });
    });
  };
  scanList("argv", i.argv);
  for (const e of i.env) {
    if (e.value === undefined) continue; // references and credentials are the same in every pod
    if (INDEX_ENV.test(e.name))
      out.push({ input: `env.${e.name}`, value: e.value, why: "looks like a pod index" });
    else if (IDENTITY_ENV.has(e.name)) {
      out.push({ input: `env.${e.name}`, value: e.value, why: "looks like a per-pod identity" });
    } else if (!e.name.endsWith("REVISION")) {
      const why = perRunValue(e.value);
      if (why) out.push({ input: `env.${e.name}`, value: e.value, why });
    }
  }
  return out;
}

// --- helpers --------------------------------------------------------------------------------

function isHashInputs(v: unknown): v is HashInputs {
  return (
    isRecord(v) &&
    typeof v.image === "string" &&
    (Array.isArray(v.argv) || (Array.isArray(v.command) && Array.isArray(v.args))) &&
    Array.isArray(v.env) &&
    Array.isArray(v.envFrom) &&
    (v.model === null || typeof v.model === "string")
  );
}

const firstLine = (s: string): string => (s.split("\n")[0] ?? s).trim().replace(/:$/, "");
