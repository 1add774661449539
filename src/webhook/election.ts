import * as k8s from "@kubernetes/client-node";
import {
  ANN_DEADLINE,
  ANN_HASH,
  ANN_LEADER_NAMESPACE,
  LABEL_HASH,
  MODELCACHE,
  leaseName,
  shortHash,
} from "../core/contract.js";
import { getModelCache, type ModelCacheObject } from "../common/modelcache.js";
import { sealInputs, type HashInputs } from "../core/hash.js";

import { isAlreadyExists, apiError, isNotFound } from "../common/kube.js";

export type ElectionResult = { role: "leader"; leaseUid: string } | { role: "follower" };

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
    if (isAlreadyExists(err)) return { role: "follower" };
    throw apiError(`creating Lease ${lease.metadata!.name}`, err);
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

/**
 * Record a new election in the durable cache record: created in phase Electing, or (when a
 * failed earlier attempt left one) reset to Electing for this election. A cache that turned Ready
 * meanwhile is never reset: it is returned, and the caller restores from it instead (a pod admitted
 * just after Ready, once the Lease was gone, must not start a second capture).
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
  },
): Promise<ModelCacheObject | undefined> {
  const ref = { group: MODELCACHE.group, version: MODELCACHE.version, plural: MODELCACHE.plural };
  const name = shortHash(opts.hash);
  const spec = {
    hash: opts.hash,
    model: opts.model,
    // Never verbatim: a record is readable cluster-wide (SPEC 1.4).
    inputs: opts.inputs && sealInputs(opts.inputs),
    electionId: opts.electionId,
    leader: { namespace: opts.namespace, ...(opts.name ? { name: opts.name } : {}) },
  };
  const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
  const electing = (): Promise<unknown> =>
    custom.patchClusterCustomObjectStatus(
      {
        ...ref,
        name,
        body: {
          status: {
            phase: "Electing",
            reason: "LeaderElected",
            message: "",
            lastTransitionTime: new Date().toISOString(),
          },
        },
      },
      merge,
    );
  try {
    await custom.createClusterCustomObject({
      ...ref,
      body: {
        apiVersion: `${MODELCACHE.group}/${MODELCACHE.version}`,
        kind: MODELCACHE.kind,
        metadata: { name, labels: { [LABEL_HASH]: name } },
        spec,
      },
    });
    await electing();
  } catch (err) {
    if (!isAlreadyExists(err)) throw apiError(`creating ModelCache ${name}`, err);
    const existing = await getModelCache(custom, name);
    if (existing?.status?.phase === "Ready") return existing;
    // Status before spec: for a moment the record must never read "Failed" with the new
    // election's id, which the release controller would take for this election failing.
    await electing();
    await custom.patchClusterCustomObject({ ...ref, name, body: { spec } }, merge);
  }
  return undefined;
}
