/**
 * Ensuring claim `rox-<short>` in one namespace. Create-only: every object is created whole, with
 * its labels, and AlreadyExists means someone else created it, which is just as good. Nothing is
 * ever updated, so concurrent callers (the node agent's promote, several admissions in the same
 * second) converge without conflicts. The existence of the claim is the bar, not Bound: with a
 * WaitForFirstConsumer class a clone binds only once a pod uses it.
 */
import * as k8s from "@kubernetes/client-node";
import { apiError, apiErrorInfo, isAlreadyExists, isNotFound, makeApiClient } from "../common/kube.js";
import { claimName } from "../core/contract.js";
import { REASON } from "../api/reasons.js";
import {
  SNAPSHOT_GROUP,
  SNAPSHOT_VERSION,
  cloneClaim,
  hostPathVolume,
  nodeStoreVolume,
  preBoundClaim,
  sharedVolume,
  snapshotContentFor,
  snapshotFor,
} from "./objects.js";
import type { CacheSource } from "./source.js";

export interface PromoteClients {
  core: k8s.CoreV1Api;
  custom: k8s.CustomObjectsApi;
}

export function promoteClients(kc: k8s.KubeConfig): PromoteClients {
  return { core: makeApiClient(kc, k8s.CoreV1Api), custom: makeApiClient(kc, k8s.CustomObjectsApi) };
}

/** The storage cannot name a claim ahead of time (per-pod clones): pods of this cache start cold. */
export class UnsupportedBackendError extends Error {
  readonly reason = REASON.Unsupported;
}

/**
 * The election a promote creates objects for is no longer the record's (a newer election, the
 * election ended, the cache Ready or being deleted): nothing more is created for it.
 */
export class SupersededError extends Error {}

/**
 * An object a call created, not one it found: what a failed or superseded promote may take back
 * (by UID, so one made again since under the same name is never removed).
 */
export interface CreatedObject {
  kind: "PersistentVolumeClaim" | "PersistentVolume" | "VolumeSnapshot" | "VolumeSnapshotContent";
  name: string;
  namespace?: string;
  uid?: string;
}

/** What a promote passes to the calls that create its objects. */
export interface CreateOptions {
  /** Told of each object created. */
  created?: (o: CreatedObject) => void;
}

/** `created`: this call made the claim; `exists`: it was there; `namespace-gone`: nothing can run there. */
export type EnsureOutcome = "created" | "exists" | "namespace-gone";

/** A namespace that is gone or terminating refuses new objects; no pod can start there anyway. */
export function isNamespaceGone(err: unknown, namespace: string): boolean {
  const i = apiErrorInfo(err);
  if (i.code === 403 && /being terminated/i.test(i.message)) return true;
  return i.code === 404 && new RegExp(`namespaces? "?${namespace}"? not found`, "i").test(i.message);
}

/** The object as created, or undefined when it already existed. */
async function createOnce<T extends k8s.KubernetesObject>(
  what: string,
  create: () => Promise<T>,
): Promise<T | undefined> {
  try {
    return await create();
  } catch (err) {
    if (isAlreadyExists(err)) return undefined;
    throw apiError(`creating ${what}`, err);
  }
}

function tell(o: CreateOptions, kind: CreatedObject["kind"], made: k8s.KubernetesObject | undefined): void {
  const m = made?.metadata;
  if (!m?.name) return;
  o.created?.({
    kind,
    name: m.name,
    ...(m.namespace ? { namespace: m.namespace } : {}),
    ...(m.uid ? { uid: m.uid } : {}),
  });
}

async function claimExists(
  c: PromoteClients,
  short: string,
  namespace: string,
): Promise<k8s.V1PersistentVolumeClaim | undefined> {
  try {
    return await c.core.readNamespacedPersistentVolumeClaim({ name: claimName(short), namespace });
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw apiError(`reading claim ${namespace}/${claimName(short)}`, err);
  }
}

/**
 * Makes `rox-<short>` exist in `namespace` for a promoted cache. A pre-bound PV goes before its
 * claim: the volume controller binds such a pair when it syncs the claim, and a claim synced
 * while its PV does not exist yet waits for the controller's periodic resync (15 s by default).
 */
export async function ensureClaim(
  c: PromoteClients,
  short: string,
  source: CacheSource,
  namespace: string,
  opts: { storeNamespace?: string } & CreateOptions = {},
): Promise<EnsureOutcome> {
  if (source.backend === "per-pod-clone") {
    throw new UnsupportedBackendError(
      `provisioner ${source.provisioner} clones a volume per pod: no claim can be named ahead of time`,
    );
  }
  const existing = await claimExists(c, short, namespace);
  // Bound means its volume exists too; nothing left to do.
  if (existing?.status?.phase === "Bound") return "exists";
  let created = false;
  try {
    if (source.backend === "snapshot-clone") {
      // In the store's own namespace the promote's snapshot already has the clone's source name.
      if (namespace !== opts.storeNamespace) {
        const content = snapshotContentFor(short, source, namespace);
        const ref = { group: SNAPSHOT_GROUP, version: SNAPSHOT_VERSION };
        const madeContent = await createOnce(
          `VolumeSnapshotContent ${content.metadata.name}`,
          () =>
            c.custom.createClusterCustomObject({
              ...ref,
              plural: "volumesnapshotcontents",
              body: content,
            }) as Promise<k8s.KubernetesObject>,
        );
        tell(opts, "VolumeSnapshotContent", madeContent);
        const snap = snapshotFor(short, source, namespace);
        try {
          const madeSnap = await createOnce(
            `VolumeSnapshot ${namespace}/${snap.metadata.name}`,
            () =>
              c.custom.createNamespacedCustomObject({
                ...ref,
                plural: "volumesnapshots",
                namespace,
                body: snap,
              }) as Promise<k8s.KubernetesObject>,
          );
          tell(opts, "VolumeSnapshot", madeSnap);
        } catch (err) {
          // Retain: deleting the content this call just made leaves the snapshot itself alone.
          if (madeContent && isNamespaceGone((err as Error).cause ?? err, namespace)) {
            await c.custom
              .deleteClusterCustomObject({
                ...ref,
                plural: "volumesnapshotcontents",
                name: content.metadata.name!,
              })
              .catch(() => undefined);
          }
          throw err;
        }
      }
      if (!existing) {
        const claim = cloneClaim(short, source, namespace);
        const made = await createOnce(`claim ${namespace}/${claimName(short)}`, () =>
          c.core.createNamespacedPersistentVolumeClaim({ namespace, body: claim }),
        );
        tell(opts, "PersistentVolumeClaim", made);
        created = Boolean(made);
      }
    } else {
      const volume =
        source.backend === "host-path"
          ? hostPathVolume(short, source, namespace)
          : source.backend === "node-store"
            ? nodeStoreVolume(short, source, namespace)
            : sharedVolume(short, source, namespace);
      const pvName = volume.metadata!.name!;
      const ours = await createOnce(`PersistentVolume ${pvName}`, () =>
        c.core.createPersistentVolume({ body: volume }),
      );
      tell(opts, "PersistentVolume", ours);
      if (!existing) {
        const claim = preBoundClaim(short, source, namespace, volume);
        try {
          const made = await createOnce(`claim ${namespace}/${claimName(short)}`, () =>
            c.core.createNamespacedPersistentVolumeClaim({ namespace, body: claim }),
          );
          tell(opts, "PersistentVolumeClaim", made);
          created = Boolean(made);
        } catch (err) {
          // The PV this call just made would outlive a namespace that is going away.
          if (ours && isNamespaceGone((err as Error).cause ?? err, namespace)) {
            await c.core
              .deletePersistentVolume({ name: pvName, body: { preconditions: { uid: ours.metadata?.uid } } })
              .catch(() => undefined);
          }
          throw err;
        }
      }
    }
  } catch (err) {
    const cause = (err as Error).cause ?? err;
    if (isNamespaceGone(cause, namespace)) return "namespace-gone";
    throw err;
  }
  return created ? "created" : "exists";
}
