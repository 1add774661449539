/**
 * Ownership of the stamps: only Warmstart writes `warmstart.dev/*` on pods. On every pod
 * CREATE the webhook sees, whatever it decides, whatever its author wrote in that domain is removed,
 * except the user annotations (`restore-from`, `skip`, `cache-size-limit`). A forged
 * `capture=true`, hash, election id, role or tree must never reach the node agent or a restore.
 */
import type { V1Pod, V1PodSchedulingGate, V1PodSpec } from "@kubernetes/client-node";
import { GROUP, SCHEDULING_GATE, USER_ANNOTATIONS } from "./contract.js";
import { isRecord } from "./guards.js";

const PREFIX = `${GROUP}/`;
const USER = new Set(USER_ANNOTATIONS);

/** A label or annotation key only Warmstart may write. */
export function isStampKey(key: string, kind: "label" | "annotation"): boolean {
  return key.startsWith(PREFIX) && !(kind === "annotation" && USER.has(key));
}

export interface Stripped {
  pod: V1Pod;
  /** What was removed, as `label:<key>`, `annotation:<key>` or `schedulingGate:<name>`. */
  removed: string[];
}

/**
 * The pod without the stamps its author set (a copy; the input is never changed). Our scheduling
 * gate goes too: a pod gated by hand would wait for a release that never looks at it. Maps that
 * are not maps (a malformed pod) are left for the API server to refuse.
 */
export function stripStamps(pod: V1Pod): Stripped {
  const removed: string[] = [];
  const meta = pod.metadata;
  if (!isRecord(pod) || !isRecord(meta)) return { pod, removed };
  const out: V1Pod = { ...pod, metadata: { ...meta } };
  const clean = (kind: "label" | "annotation", map: unknown): Record<string, string> | undefined => {
    if (!isRecord(map)) return undefined;
    const keys = Object.keys(map).filter((k) => isStampKey(k, kind));
    if (!keys.length) return undefined;
    const copy = { ...(map as Record<string, string>) };
    for (const k of keys) {
      delete copy[k];
      removed.push(`${kind}:${k}`);
    }
    return copy;
  };
  const labels = clean("label", meta.labels);
  if (labels) out.metadata!.labels = labels;
  const annotations = clean("annotation", meta.annotations);
  if (annotations) out.metadata!.annotations = annotations;
  const spec = pod.spec as V1PodSpec | undefined;
  const gates: unknown = isRecord(spec) ? spec.schedulingGates : undefined;
  const ours = (g: unknown): boolean => isRecord(g) && g.name === SCHEDULING_GATE;
  if (spec && Array.isArray(gates) && gates.some(ours)) {
    const kept = (gates as V1PodSchedulingGate[]).filter((g) => !ours(g));
    const { schedulingGates: _all, ...rest } = spec;
    out.spec = kept.length ? { ...rest, schedulingGates: kept } : rest;
    removed.push(`schedulingGate:${SCHEDULING_GATE}`);
  }
  return { pod: removed.length ? out : pod, removed };
}
