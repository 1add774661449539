import { createHash } from "node:crypto";
import type * as k8s from "@kubernetes/client-node";
import { FINALIZER_STORE_PREFIX, MODELCACHE, shortHash } from "../core/contract.js";
import { apiError, isNotFound } from "./kube.js";

/** One restore counted on its cache's record (the last few are kept, for the views and for dedupe). */
export interface RestoreRecord {
  namespace: string;
  name: string;
  uid: string;
  role: string;
  /** Release (follower) or admission (restore) to Ready. */
  readySeconds: number;
  at: string;
}

/** The durable record of one cache (CRD `modelcaches.warmstart.dev`), as every role reads it. */
export interface ModelCacheObject {
  apiVersion: string;
  kind: string;
  metadata: k8s.V1ObjectMeta;
  spec: {
    hash: string;
    model?: string;
    inputs?: unknown;
    electionId?: string;
    leader?: { namespace?: string; name?: string; uid?: string; node?: string };
  };
  status?: {
    phase?: string;
    reason?: string;
    message?: string;
    backend?: string;
    namespaces?: string[];
    node?: string;
    /** The election the status was written for; what it says about any other election is void. */
    electionId?: string;
    /** The UID of that election's leader, recorded when it was first seen. */
    leaderUid?: string;
    /** Elections of this hash whose capture (or promote) failed; admission goes cold past a limit. */
    failedCaptures?: number;
    /** The last election counted in failedCaptures (one election never counts twice). */
    lastFailedElection?: string;
    sizeBytes?: number;
    modelBytes?: number;
    leaderReadySeconds?: number;
    restores?: number;
    savedBytes?: number;
    savedSeconds?: number;
    restoredReadySecondsTotal?: number;
    lastRestoredAt?: string;
    recentRestores?: RestoreRecord[];
    [k: string]: unknown;
  };
}

/** Whether the record's status speaks for this election (written for it, or for the one in its spec). */
export function statusOf(cache: ModelCacheObject, electionId: string | undefined): boolean {
  if (!electionId) return false;
  return (cache.status?.electionId ?? cache.spec.electionId) === electionId;
}

/** The recorded leader UID of the record's current election, if one was recorded. */
export function recordedLeader(cache: ModelCacheObject): string | undefined {
  const s = cache.status;
  return s?.leaderUid && s.electionId && s.electionId === cache.spec.electionId ? s.leaderUid : undefined;
}

/**
 * The finalizer a node's agent puts on a record before its store holds the cache's tree. A
 * finalizer's name part is at most 63 characters; longer node names are hashed.
 */
export function storeFinalizer(node: string): string {
  const fits = /^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/.test(node) && node.length <= 57;
  return `${FINALIZER_STORE_PREFIX}${fits ? node : `h-${createHash("sha256").update(node).digest("hex").slice(0, 40)}`}`;
}

/** The cache record of a hash (full or short), or undefined when there is none. */
export async function getModelCache(
  custom: k8s.CustomObjectsApi,
  hashOrShort: string,
): Promise<ModelCacheObject | undefined> {
  try {
    return (await custom.getClusterCustomObject({
      group: MODELCACHE.group,
      version: MODELCACHE.version,
      plural: MODELCACHE.plural,
      name: shortHash(hashOrShort),
    })) as ModelCacheObject;
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw apiError(`reading ModelCache ${shortHash(hashOrShort)}`, err);
  }
}
