/**
 * The record's Kubernetes-style conditions, derived in one place from its phase and reason, so
 * `kubectl wait --for=condition=Ready modelcache/<short>` and generic tooling read what the phase
 * says:
 * - Ready: True once the cache is Ready (restorable), False otherwise;
 * - Progressing: True while an election is on its way (Electing, Capturing, Promoting), False
 *   once it ended (Ready or Failed).
 * Both carry the status's reason (the phase when it has none) and message.
 */
import type { CachePhase } from "./names.js";
import type { Condition, ModelCacheStatus } from "./modelcache.js";

export const CONDITION_TYPES = ["Ready", "Progressing"] as const;

type Truth = Condition["status"];

function truth(type: (typeof CONDITION_TYPES)[number], phase: CachePhase | undefined): Truth {
  if (!phase) return "Unknown";
  if (type === "Ready") return phase === "Ready" ? "True" : "False";
  return phase === "Ready" || phase === "Failed" ? "False" : "True";
}

/**
 * The conditions for a status with this phase, reason and message. A condition whose status did
 * not change keeps its lastTransitionTime from `previous`.
 */
export function conditionsFor(
  status: Pick<ModelCacheStatus, "phase" | "reason" | "message">,
  previous: readonly Condition[] | undefined,
  at: { now: Date; generation?: number | undefined },
): Condition[] {
  return CONDITION_TYPES.map((type): Condition => {
    const value = truth(type, status.phase);
    const before = previous?.find((c) => c.type === type);
    return {
      type,
      status: value,
      reason: status.reason || status.phase || "Unknown",
      message: status.message ?? "",
      lastTransitionTime:
        before?.status === value && before.lastTransitionTime
          ? before.lastTransitionTime
          : at.now.toISOString(),
      ...(at.generation !== undefined ? { observedGeneration: at.generation } : {}),
    };
  });
}

/**
 * What a status write adds to the fields a writer chose: when it writes a phase, the conditions
 * derived from it, and the phase's time when the phase changes (kept when only other fields do).
 */
export function stampStatus<P extends { phase?: CachePhase | undefined; [k: string]: unknown }>(
  current: { status?: ModelCacheStatus | undefined; metadata: { generation?: number | undefined } },
  patch: P,
  now: Date,
): P & { lastTransitionTime?: string; conditions?: Condition[] } {
  if (patch.phase === undefined) return patch;
  const merged = { ...current.status, ...(patch as Partial<ModelCacheStatus>) };
  return {
    ...patch,
    ...(patch.phase !== current.status?.phase ? { lastTransitionTime: now.toISOString() } : {}),
    conditions: conditionsFor(merged, current.status?.conditions, {
      now,
      generation: current.metadata.generation,
    }),
  };
}
