/**
 * What `warmstart explain` reads: Pods, workloads (each of their pod templates) and cache records
 * found in YAML or JSON manifests, each turned into a subject to explain.
 */
import type { V1Pod, V1PodTemplateSpec } from "@kubernetes/client-node";
import { parseAllDocuments } from "yaml";
import { isRecord } from "./guards.js";
import type { HashInputs } from "./hash.js";

/**
 * What explain looks at: a pod (from a Pod or a workload's template, with the manifest's
 * namespace when it names one), or a cache record's inputs.
 */
export type Subject =
  | { kind: "pod"; source: string; name: string; pod: V1Pod; namespace?: string }
  | { kind: "cache"; source: string; name: string; inputs: HashInputs; recordedHash?: string };

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
  const fromTemplate = (template: unknown, name: string, where: string, added?: Added): Subject => {
    if (!isRecord(template)) throw new Error(`${where} has no pod template`);
    const t = template as V1PodTemplateSpec;
    const m = t.metadata ?? {};
    const metadata = added
      ? {
          ...m,
          labels: { ...m.labels, ...added.labels },
          annotations: { ...m.annotations, ...added.annotations },
        }
      : m;
    const pod = { apiVersion: "v1", kind: "Pod", metadata, spec: t.spec } as V1Pod;
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
    const lws = lwsPodKeys(metaName || "lws", lwt.size);
    return [
      fromTemplate(leader, `${label} (leader)`, `${what} (leader)`, lws.leader),
      fromTemplate(lwt.workerTemplate, `${label} (worker)`, `${what} (worker)`, lws.worker),
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

interface Added {
  labels: Record<string, string>;
  annotations: Record<string, string>;
}

/**
 * What the LeaderWorkerSet controller puts on the first group's pods (kubernetes-sigs/lws
 * pkg/controllers/leaderworkerset_controller.go, pod_controller.go), so that they are seen as the
 * ranks they will be: the leader is rank 0, the first worker rank 1 (its StatefulSet counts from 1).
 */
function lwsPodKeys(name: string, size: unknown): { leader: Added; worker: Added } {
  const n = typeof size === "number" && Number.isInteger(size) && size > 0 ? size : 1;
  const p = "leaderworkerset.sigs.k8s.io/";
  const common = { [`${p}name`]: name };
  const annotations = { [`${p}size`]: String(n) };
  return {
    leader: {
      labels: { ...common, [`${p}worker-index`]: "0", "apps.kubernetes.io/pod-index": "0" },
      annotations,
    },
    worker: {
      labels: { ...common, [`${p}group-index`]: "0", "apps.kubernetes.io/pod-index": "1" },
      annotations: { ...annotations, [`${p}leader-name`]: `${name}-0` },
    },
  };
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
