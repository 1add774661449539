/**
 * How Kubernetes names GPUs: the extended resource a device plugin advertises and the label GPU
 * feature discovery puts on a node. Product code takes these from here, never from the local
 * cluster tooling.
 */
import type { V1Pod } from "@kubernetes/client-node";
import { listOf } from "./env.js";
import { isRecord } from "./guards.js";

export { GPU_RESOURCE } from "./classify.js";

export const GPU_PRODUCT_LABEL = "nvidia.com/gpu.product";

/**
 * The GPU products a pod can land on by its own choice: its node selector's
 * `nvidia.com/gpu.product`, and the `In` values of that key in its required node affinity (any
 * term). Sorted, each once; empty when the pod does not choose.
 */
export function gpuProductsOf(pod: V1Pod): string[] {
  const spec = isRecord(pod.spec) ? pod.spec : undefined;
  const out = new Set<string>();
  const selected = isRecord(spec?.nodeSelector) ? spec.nodeSelector[GPU_PRODUCT_LABEL] : undefined;
  if (typeof selected === "string" && selected) out.add(selected);
  const required = spec?.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution;
  for (const term of listOf(isRecord(required) ? required.nodeSelectorTerms : undefined)) {
    if (!isRecord(term)) continue;
    for (const e of Array.isArray(term.matchExpressions) ? (term.matchExpressions as unknown[]) : []) {
      if (!isRecord(e) || e.key !== GPU_PRODUCT_LABEL || e.operator !== "In") continue;
      for (const v of Array.isArray(e.values) ? (e.values as unknown[]) : [])
        if (typeof v === "string" && v) out.add(v);
    }
  }
  return [...out].sort();
}
