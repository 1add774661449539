/** How long a pod took to turn Ready: shown by the dashboard, counted on a cache's record per restore. */
import type { V1Pod, V1PodCondition } from "@kubernetes/client-node";
import { ANN_ROLE } from "./contract.js";

const toMs = (t: Date | string | undefined): number | undefined => (t ? new Date(t).getTime() : undefined);

/**
 * A pod's seconds to Ready (to a tenth), or undefined while it is not Ready. A follower's run from
 * its release (when it was scheduled): its gated wait is the leader's download, not its own start.
 * Any other pod's run from its admission.
 */
export function readySeconds(p: V1Pod): number | undefined {
  const condition = (type: string): V1PodCondition | undefined =>
    p.status?.conditions?.find((c) => c.type === type && c.status === "True");
  const from =
    p.metadata?.annotations?.[ANN_ROLE] === "follower"
      ? condition("PodScheduled")?.lastTransitionTime
      : p.metadata?.creationTimestamp;
  const start = toMs(from);
  const end = toMs(condition("Ready")?.lastTransitionTime);
  if (end === undefined || start === undefined) return undefined;
  return Math.max(0, Math.round((end - start) / 100) / 10);
}
