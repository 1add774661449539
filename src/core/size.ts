/**
 * The leader's capture volume size limit: the cluster's default, or the pod's own
 * `warmstart.dev/cache-size-limit`, never above the cluster's maximum. A leader that caches more
 * than its limit is evicted by the kubelet, so a model bigger than the default needs a way up.
 */
const SUFFIX: Readonly<Record<string, number>> = {
  "": 1,
  k: 1e3,
  M: 1e6,
  G: 1e9,
  T: 1e12,
  P: 1e15,
  E: 1e18,
  Ki: 2 ** 10,
  Mi: 2 ** 20,
  Gi: 2 ** 30,
  Ti: 2 ** 40,
  Pi: 2 ** 50,
  Ei: 2 ** 60,
};
// The byte quantities Kubernetes accepts for a size (no signs, no milli-bytes, no exponents).
const QUANTITY = /^(\d+(?:\.\d+)?|\.\d+)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$/;

/** Bytes of a quantity such as `200Gi`, `1.5Ti` or `500G`; undefined when it is not one, or not above zero. */
export function quantityBytes(q: string): number | undefined {
  const m = QUANTITY.exec(q.trim());
  if (!m) return undefined;
  const n = Number(m[1]) * (SUFFIX[m[2] ?? ""] ?? NaN);
  return Number.isFinite(n) && n >= 1 ? n : undefined;
}

export interface SizeLimit {
  /** The quantity the capture volume gets. */
  limit: string;
  /** Why it is not what the pod asked for, when it asked. */
  note?: string;
}

/** The capture volume limit for a pod (`requested`: its annotation, if any). */
export function captureSizeLimit(
  requested: string | undefined,
  cluster: { defaultLimit: string; maxLimit: string },
): SizeLimit {
  if (requested === undefined) return { limit: cluster.defaultLimit };
  const want = quantityBytes(requested);
  if (want === undefined)
    return {
      limit: cluster.defaultLimit,
      note: `cache-size-limit "${requested.slice(0, 64)}" is not a size; using ${cluster.defaultLimit}`,
    };
  const max = quantityBytes(cluster.maxLimit);
  if (max !== undefined && want > max)
    return {
      limit: cluster.maxLimit,
      note: `cache-size-limit ${requested} is above the cluster's maximum; using ${cluster.maxLimit}`,
    };
  return { limit: requested.trim() };
}
