import * as k8s from "@kubernetes/client-node";
import {
  ANN_CACHE_ENV,
  ANN_DEADLINE,
  ANN_GROUP,
  ANN_HASH,
  ANN_LEADER_NAMESPACE,
  LABEL_HASH,
  MODELCACHE,
  leaseName,
  shortHash,
} from "../core/contract.js";
import { getModelCache, type ModelCacheObject } from "../common/modelcache.js";
import { conditionsFor } from "../api/conditions.js";
import { transition } from "../api/transitions.js";
import { PHASE } from "../api/names.js";
import { REASON } from "../api/reasons.js";
import { sealInputs, type HashInputs } from "../core/hash.js";
import { redactUrlCredentials } from "../core/env.js";
import type { CacheEnvTemplate } from "../core/decorate.js";
import { isAlreadyExists, apiError, isConflict, isNotFound } from "../common/kube.js";

export type ElectionResult =
  | { role: "leader"; leaseUid: string }
  /** `leaderGroup`: the multi-node group of the leader, looked up for a follower that is a rank of one. */
  | { role: "follower"; leaderGroup?: string };

/**
 * The API server is the lock: the first pod of a hash to create Lease `warmstart-capture-<short>`
 * leads; everyone else meets AlreadyExists and follows. The holder is an id minted at admission
 * because the pod has no UID (and maybe no name) yet.
 */
export async function tryAcquire(
  coordination: k8s.CoordinationV1Api,
  opts: {
    namespace: string;
    hash: string;
    electionId: string;
    deadlineSeconds: number;
    podNamespace: string;
    /** The pod's multi-node group (gangs.ts groupKey): a rank never follows its own group. */
    group?: string;
  },
): Promise<ElectionResult> {
  const now = new Date();
  const lease: k8s.V1Lease = {
    metadata: {
      name: leaseName(opts.hash),
      namespace: opts.namespace,
      labels: { [LABEL_HASH]: shortHash(opts.hash) },
      annotations: {
        [ANN_HASH]: opts.hash,
        [ANN_DEADLINE]: new Date(now.getTime() + opts.deadlineSeconds * 1000).toISOString(),
        [ANN_LEADER_NAMESPACE]: opts.podNamespace,
        ...(opts.group ? { [ANN_GROUP]: opts.group } : {}),
      },
    },
    spec: {
      holderIdentity: opts.electionId,
      leaseDurationSeconds: Math.round(opts.deadlineSeconds),
      acquireTime: new k8s.V1MicroTime(now.toISOString()),
      renewTime: new k8s.V1MicroTime(now.toISOString()),
    },
  };
  try {
    const created = await coordination.createNamespacedLease({ namespace: opts.namespace, body: lease });
    return { role: "leader", leaseUid: created.metadata!.uid! };
  } catch (err) {
    if (!isAlreadyExists(err)) throw apiError(`creating Lease ${lease.metadata!.name}`, err);
  }
  if (!opts.group) return { role: "follower" };
  // Only a rank asks whose group leads: one GET, for the pods that may be in the leader's group.
  try {
    const held = await coordination.readNamespacedLease({
      name: leaseName(opts.hash),
      namespace: opts.namespace,
    });
    const leaderGroup = held.metadata?.annotations?.[ANN_GROUP];
    return { role: "follower", ...(leaderGroup ? { leaderGroup } : {}) };
  } catch (err) {
    // Retired meanwhile: this pod follows no one's group; the next pod of the hash leads.
    if (isNotFound(err)) return { role: "follower" };
    throw apiError(`reading Lease ${lease.metadata!.name}`, err);
  }
}

/** Give up a Lease this webhook just won (only that exact object: UID precondition). */
export async function releaseLease(
  coordination: k8s.CoordinationV1Api,
  namespace: string,
  hash: string,
  uid: string,
): Promise<void> {
  try {
    await coordination.deleteNamespacedLease({
      name: leaseName(hash),
      namespace,
      body: { preconditions: { uid } },
    });
  } catch (err) {
    if (!isNotFound(err)) throw apiError(`releasing Lease ${leaseName(hash)}`, err);
  }
}

/** Points a test can stop at, to put a write of its own between two of ours. */
export interface RecordElectionHooks {
  /** After the existing record was read, before it is reset for this election. */
  afterRead?: (existing: ModelCacheObject) => Promise<void>;
}

/**
 * Record a new election in the durable cache record: created in phase Electing, or (when a
 * failed earlier attempt left one) reset to Electing for this election. A cache that turned Ready
 * meanwhile is never reset: it is returned, and the caller restores from it instead (a pod admitted
 * just after Ready, once the Lease was gone, must not start a second capture). The reset is written
 * only over the record as read (resourceVersion precondition): a Ready that lands between the read
 * and the write makes the write fail, and the record is read again. A record being deleted is
 * neither restored from nor reset: its finalizers are removing the cache, and the leader's node
 * agent records the election once the record is gone.
 */
export async function recordElection(
  custom: k8s.CustomObjectsApi,
  opts: {
    hash: string;
    model?: string;
    inputs?: HashInputs;
    electionId: string;
    namespace: string;
    name?: string;
    cacheEnv?: CacheEnvTemplate;
  },
  hooks: RecordElectionHooks = {},
): Promise<ModelCacheObject | undefined> {
  const ref = { group: MODELCACHE.group, version: MODELCACHE.version, plural: MODELCACHE.plural };
  const name = shortHash(opts.hash);
  const spec = {
    hash: opts.hash,
    // Never a credential in a record (it is readable cluster-wide), whoever the caller is.
    ...(opts.model !== undefined ? { model: redactUrlCredentials(opts.model) } : {}),
    // Never verbatim: a record is readable cluster-wide.
    inputs: opts.inputs && sealInputs(opts.inputs),
    electionId: opts.electionId,
    leader: { namespace: opts.namespace, ...(opts.name ? { name: opts.name } : {}) },
  };
  // The leader's template, replayed by restores of this cache.
  const annotations = opts.cacheEnv ? { [ANN_CACHE_ENV]: JSON.stringify(opts.cacheEnv) } : undefined;
  const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
  // `current`: the record the conditions follow on; the write is conditional on its
  // resourceVersion only when `conditional` (not right after this webhook created it).
  const electing = (current: ModelCacheObject, conditional: boolean): Promise<ModelCacheObject> => {
    const now = new Date();
    const status = { phase: PHASE.Electing, reason: REASON.LeaderElected, message: "" } as const;
    const resourceVersion = conditional ? current.metadata.resourceVersion : undefined;
    return custom.patchClusterCustomObjectStatus(
      {
        ...ref,
        name,
        body: {
          ...(resourceVersion ? { metadata: { resourceVersion } } : {}),
          status: {
            ...status,
            lastTransitionTime: now.toISOString(),
            conditions: conditionsFor(status, current.status?.conditions, {
              now,
              generation: current.metadata.generation,
            }),
            // This status speaks for the new election; no leader of it has been seen yet, and no
            // tree: the digest, its node and the copies of an earlier capture go (the records
            // policy lets the capturing node write a digest only where none is).
            electionId: opts.electionId,
            leaderUid: null,
            manifestDigest: null,
            node: null,
            replicas: null,
          },
        },
      },
      merge,
    ) as Promise<ModelCacheObject>;
  };
  try {
    const created = (await custom.createClusterCustomObject({
      ...ref,
      body: {
        apiVersion: `${MODELCACHE.group}/${MODELCACHE.version}`,
        kind: MODELCACHE.kind,
        metadata: { name, labels: { [LABEL_HASH]: name }, ...(annotations ? { annotations } : {}) },
        spec,
      },
    })) as ModelCacheObject;
    await electing(created, false);
    return undefined;
  } catch (err) {
    if (!isAlreadyExists(err)) throw apiError(`creating ModelCache ${name}`, err);
  }
  for (let attempt = 0; attempt < RESET_ATTEMPTS; attempt++) {
    const existing = await getModelCache(custom, name);
    if (!existing) throw new Error(`ModelCache ${name} vanished while a new election was recorded`);
    if (existing.metadata.deletionTimestamp) return undefined;
    const s = existing.status;
    if (transition(s?.phase, "elect", s?.electionId === opts.electionId) === "ignore") return existing;
    await hooks.afterRead?.(existing);
    try {
      // Status before spec: for a moment the record must never read "Failed" with the new
      // election's id, which the release controller would take for this election failing.
      const reset = await electing(existing, true);
      await custom.patchClusterCustomObject(
        {
          ...ref,
          name,
          body: {
            metadata: {
              resourceVersion: reset.metadata.resourceVersion,
              ...(annotations ? { annotations } : {}),
            },
            // A merge patch keeps what it does not name: the previous leader's fields go explicitly.
            spec: { ...spec, leader: { name: null, uid: null, node: null, ...spec.leader } },
          },
        },
        merge,
      );
      return undefined;
    } catch (err) {
      // Written meanwhile (a Ready, a late Failed): read it again and decide again.
      if (!isConflict(err)) throw apiError(`resetting ModelCache ${name} for a new election`, err);
    }
  }
  throw new Error(`ModelCache ${name}: still changing after ${RESET_ATTEMPTS} attempts to reset it`);
}

const RESET_ATTEMPTS = 5;
