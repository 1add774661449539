import { createHash } from "node:crypto";
import type * as k8s from "@kubernetes/client-node";
import { FINALIZER_STORE_PREFIX, MODELCACHE, shortHash } from "../core/contract.js";
import { apiError, isNotFound } from "./kube.js";
import { parseModelCache, type ModelCacheObject } from "../api/modelcache.js";

// The record's type is its schema's (src/api); re-exported for the roles that import it from here.
export type { ModelCacheObject, RestoreRecord, StartupRecord } from "../api/modelcache.js";

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

/** The cache record of a hash (full or short), checked against its schema; undefined when there is none. */
export async function getModelCache(
  custom: k8s.CustomObjectsApi,
  hashOrShort: string,
): Promise<ModelCacheObject | undefined> {
  let found: unknown;
  try {
    found = await custom.getClusterCustomObject({
      group: MODELCACHE.group,
      version: MODELCACHE.version,
      plural: MODELCACHE.plural,
      name: shortHash(hashOrShort),
    });
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw apiError(`reading ModelCache ${shortHash(hashOrShort)}`, err);
  }
  return parseModelCache(found);
}

/**
 * Whether the election record names this pod: admission records the leader's namespace, and its
 * name when the pod had one. Wearing the election's id proves nothing (the record, readable
 * cluster-wide, shows it); a pod elsewhere is never the leader.
 */
export function recordNamesPod(
  leader: { namespace?: string; name?: string } | undefined,
  pod: { namespace?: string; name?: string },
): boolean {
  if (!leader?.namespace || leader.namespace !== pod.namespace) return false;
  return !leader.name || leader.name === pod.name;
}
