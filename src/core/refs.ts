/**
 * How users name a cache: its full hash (64 hex digits) or the first 16 of them (its record's
 * name), in the `warmstart.dev/restore-from` annotation or on the command line.
 */
import type { V1Pod } from "@kubernetes/client-node";
import { ANN_RESTORE_FROM, LABEL_HASH, RO_VOLUME } from "./contract.js";
import { hasFillVolume, seedOutcome } from "./waiting.js";

/** A cache hash as users may write it, once normalized: 64 hex digits, or the first 16. */
export const HASH_REF = /^[0-9a-f]{16}(?:[0-9a-f]{48})?$/;

/** A hash as a user wrote it, the way it is compared: no surrounding space, lower case. */
export const normalizeHashRef = (ref: string): string => ref.trim().toLowerCase();

/**
 * The cache a pod asks to restore from, normalized the way admission reads it; undefined when the
 * annotation is absent or blank. Not checked against HASH_REF: admission says why a bad one is refused.
 */
export function restoreFromOf(
  annotations: Readonly<Record<string, unknown>> | undefined,
): string | undefined {
  const ref = annotations?.[ANN_RESTORE_FROM];
  return typeof ref === "string" ? normalizeHashRef(ref) || undefined : undefined;
}

/**
 * The cache a decorated pod restores from, read from its spec (which nobody can change after
 * admission): the short hash of the read-only claim admission mounted, or for a waiting follower
 * its own (webhook-stamped) hash once its seed reported the tree restored. Its annotations are no
 * proof: `restore-from` stays the author's to edit on a running pod.
 */
export function restoredFrom(pod: V1Pod): string | undefined {
  // A waiting follower restores its own hash, through the volume its node's agent filled.
  if (hasFillVolume(pod))
    return seedOutcome(pod)?.outcome === "restored" ? pod.metadata?.labels?.[LABEL_HASH] : undefined;
  const claim = (pod.spec?.volumes ?? []).find((v) => v.name === RO_VOLUME)?.persistentVolumeClaim?.claimName;
  return /^rox-([0-9a-f]{16})$/.exec(claim ?? "")?.[1];
}
