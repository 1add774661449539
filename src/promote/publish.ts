/**
 * From a committed tree in a node's cache store to a cache source: what storage the store is
 * (which picks the storage profile, hence the backend) and, per backend, the volume identity that
 * every namespace's claim will point at.
 */
import * as k8s from "@kubernetes/client-node";
import { relative } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { HOST_PATH_PROVISIONER } from "../core/contract.js";
import { apiError, isAlreadyExists, isConflict, isNotFound } from "../common/kube.js";
import {
  SNAPSHOT_GROUP,
  SNAPSHOT_VERSION,
  storeSnapshot,
  type VolumeSnapshot,
  type VolumeSnapshotContent,
} from "./objects.js";
import { unshareable, type StorageProfile } from "./profiles.js";
import type { CacheSource } from "./source.js";
import { SupersededError, type CreateOptions, type PromoteClients } from "./claims.js";
import { removeTreeVolume, TREE_FOLDER, writeTreeVolume } from "./tree-volume.js";

export interface StoreLocation {
  node: string;
  /** The store directory as the agent sees it. */
  dir: string;
  /** The claim the store directory is a mount of, when it is a volume (shared or snapshot-able). */
  claim?: { namespace: string; name: string };
  /** Overrides what the claim's StorageClass says (or names the provisioner of a store without a claim). */
  provisioner?: string;
  volumeType?: string;
  /** snapshot-clone: each tree is written into a volume of its own of this StorageClass. */
  treeVolumeClass?: string;
}

export interface StoreStorage {
  provisioner: string;
  volumeType?: string;
  claim?: { namespace: string; name: string };
  csi?: { driver: string; volumeHandle: string; fsType?: string; volumeAttributes?: Record<string, string> };
  treeVolumeClass?: string;
}

/**
 * Learns the store's provisioner (and volume type, and CSI identity) from its claim, or from the
 * class of its per-tree volumes. A store claim is mounted by every node's agent, so it must be
 * ReadWriteMany: a ReadWriteOnce one attaches to one node and leaves the other agents stuck.
 */
export async function describeStore(kc: k8s.KubeConfig, loc: StoreLocation): Promise<StoreStorage> {
  if (loc.treeVolumeClass) return describeTreeVolumes(kc, loc, loc.treeVolumeClass);
  if (!loc.claim)
    return {
      provisioner: loc.provisioner ?? HOST_PATH_PROVISIONER,
      ...(loc.volumeType ? { volumeType: loc.volumeType } : {}),
    };
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const storage = kc.makeApiClient(k8s.StorageV1Api);
  const { namespace, name } = loc.claim;
  let pvc: k8s.V1PersistentVolumeClaim;
  try {
    pvc = await core.readNamespacedPersistentVolumeClaim({ name, namespace });
  } catch (err) {
    throw apiError(`reading the store claim ${namespace}/${name}`, err);
  }
  if (!pvc.spec?.accessModes?.includes("ReadWriteMany"))
    throw new Error(
      `the store claim ${namespace}/${name} is ${pvc.spec?.accessModes?.join(",") || "not ReadWriteMany"}: every node's agent mounts it, so it must be ReadWriteMany (for storage that attaches to one node, keep the store on the node and give --tree-volume-class)`,
    );
  let provisioner = loc.provisioner;
  let volumeType = loc.volumeType;
  const className = pvc.spec?.storageClassName;
  if (className && (!provisioner || !volumeType)) {
    try {
      const sc = await storage.readStorageClass({ name: className });
      provisioner ??= sc.provisioner;
      volumeType ??= sc.parameters?.type;
    } catch (err) {
      if (!isNotFound(err)) throw apiError(`reading StorageClass ${className}`, err);
    }
  }
  let csi: StoreStorage["csi"];
  const pvName = pvc.spec?.volumeName;
  if (pvName) {
    try {
      const pv = await core.readPersistentVolume({ name: pvName });
      if (pv.spec?.csi) {
        csi = {
          driver: pv.spec.csi.driver,
          volumeHandle: pv.spec.csi.volumeHandle,
          ...(pv.spec.csi.fsType ? { fsType: pv.spec.csi.fsType } : {}),
          ...(pv.spec.csi.volumeAttributes ? { volumeAttributes: pv.spec.csi.volumeAttributes } : {}),
        };
        provisioner ??= pv.spec.csi.driver;
      }
    } catch (err) {
      throw apiError(`reading the store volume ${pvName}`, err);
    }
  }
  if (!provisioner) throw new Error(`cannot tell the provisioner of the store claim ${namespace}/${name}`);
  return { provisioner, ...(volumeType ? { volumeType } : {}), claim: loc.claim, ...(csi ? { csi } : {}) };
}

async function describeTreeVolumes(
  kc: k8s.KubeConfig,
  loc: StoreLocation,
  className: string,
): Promise<StoreStorage> {
  let sc: k8s.V1StorageClass;
  try {
    sc = await kc.makeApiClient(k8s.StorageV1Api).readStorageClass({ name: className });
  } catch (err) {
    throw apiError(`reading StorageClass ${className} (--tree-volume-class)`, err);
  }
  const volumeType = loc.volumeType ?? sc.parameters?.type;
  return {
    provisioner: loc.provisioner ?? sc.provisioner,
    ...(volumeType ? { volumeType } : {}),
    treeVolumeClass: className,
  };
}

export interface PublishInput extends CreateOptions {
  short: string;
  hash: string;
  /**
   * snapshot-clone: how the tree's volume is written (the Warmstart image, in the system
   * namespace) and how long the copy may take (default 30 minutes).
   */
  writer?: { image: string; systemNamespace: string; imagePullSecrets?: string[]; timeoutMs?: number };
  /** The cache record, which owns what a promote leaves running or bound. */
  owner?: { name: string; uid: string };
  store: StoreLocation;
  storage: StoreStorage;
  profile: StorageProfile;
  /** The committed tree's directory. */
  tree: string;
  sizeBytes: number;
  /** snapshot-clone: how long to wait for the snapshot to be ready to use. */
  snapshotTimeoutMs?: number;
  signal?: AbortSignal;
  /** Whether the promote's election is still the record's, asked before the snapshot is taken. */
  current?: () => Promise<boolean>;
}

/** What every namespace's claim of this cache will be made from. Throws when the storage cannot back it. */
export async function publishSource(c: PromoteClients, i: PublishInput): Promise<CacheSource> {
  const base = {
    backend: i.profile.backend,
    provisioner: i.storage.provisioner,
    ...(i.storage.volumeType ? { volumeType: i.storage.volumeType } : {}),
    sizeBytes: i.sizeBytes,
    storageClassName: i.profile.storageClassName,
    mountOptions: i.profile.mountOptions,
  };
  const subPath = relative(i.store.dir, i.tree);
  switch (i.profile.backend) {
    case "host-path":
      return { ...base, node: i.store.node, path: i.tree, hostPathType: i.profile.hostPathType };
    case "node-store":
      // Any node's agent serves the tree by its hash (ADR 0011): no node, no path, no mount options.
      return { ...base, mountOptions: [], volumeHandle: i.hash };
    case "shared-volume": {
      const refused = unshareable(i.profile);
      if (refused) throw new Error(refused);
      const csi = i.storage.csi;
      if (!csi)
        throw new Error(
          `shared-volume needs the store on a CSI volume (--store-claim); ${i.store.dir} has none`,
        );
      return {
        ...base,
        driver: csi.driver,
        volumeHandle: csi.volumeHandle,
        ...(csi.fsType ? { fsType: csi.fsType } : {}),
        ...(csi.volumeAttributes ? { volumeAttributes: csi.volumeAttributes } : {}),
        ...(Object.keys(i.profile.volumeAttributes).length
          ? { attributeTemplates: i.profile.volumeAttributes }
          : {}),
        handleTemplate: i.profile.handleTemplate,
        subPath,
        treeAtRoot: true,
      };
    }
    case "snapshot-clone": {
      const cls = i.storage.treeVolumeClass;
      if (!cls || !i.writer)
        throw new Error(
          `snapshot-clone takes a volume per tree (--tree-volume-class and --image): a snapshot of a store volume would hold every tree in it`,
        );
      const timeoutMs = i.snapshotTimeoutMs ?? 600_000;
      const volume = await writeTreeVolume(c, {
        short: i.short,
        hash: i.hash,
        systemNamespace: i.writer.systemNamespace,
        storageClass: cls,
        node: i.store.node,
        tree: i.tree,
        sizeBytes: i.sizeBytes,
        image: i.writer.image,
        ...(i.writer.imagePullSecrets ? { imagePullSecrets: i.writer.imagePullSecrets } : {}),
        ...(i.owner ? { owner: i.owner } : {}),
        timeoutMs: i.writer.timeoutMs || 30 * 60_000,
        ...(i.signal ? { signal: i.signal } : {}),
      });
      try {
        // The copy may have taken long: an election that moved on meanwhile gets no snapshot.
        if (i.current && !(await i.current()))
          throw new SupersededError("the election moved on while its tree was written");
        const snap = await snapshotStore(c, i, volume, timeoutMs);
        return {
          ...base,
          driver: snap.driver,
          snapshotHandle: snap.handle,
          ...(i.profile.snapshotClass ? { snapshotClass: i.profile.snapshotClass } : {}),
          ...(snap.restoreSize ? { restoreSize: snap.restoreSize } : {}),
          subPath: TREE_FOLDER,
        };
      } finally {
        // The snapshot holds the tree now (or failed and goes): its writer volume is not needed.
        // Stopped midway, both stay for the next start, which finds them by name and goes on.
        if (!i.signal?.aborted) await removeTreeVolume(c, volume.namespace, i.short);
      }
    }
    case "per-pod-clone":
      throw new Error(`per-pod clone storage cannot be promoted`);
  }
}

/** Snapshots the tree's volume (once per cache: the name is the lock) and waits until it can be cloned. */
async function snapshotStore(
  c: PromoteClients,
  i: PublishInput,
  claim: { namespace: string; name: string },
  timeoutMs: number,
): Promise<{ driver: string; handle: string; restoreSize?: string }> {
  const signal = i.signal;
  const body = storeSnapshot(i.short, claim, i.profile.snapshotClass);
  const ref = { group: SNAPSHOT_GROUP, version: SNAPSHOT_VERSION, namespace: claim.namespace };
  try {
    const made = (await c.custom.createNamespacedCustomObject({
      ...ref,
      plural: "volumesnapshots",
      body,
    })) as VolumeSnapshot;
    i.created?.({
      kind: "VolumeSnapshot",
      name: body.metadata.name!,
      namespace: claim.namespace,
      ...(made.metadata?.uid ? { uid: made.metadata.uid } : {}),
    });
  } catch (err) {
    if (!isAlreadyExists(err))
      throw apiError(`creating VolumeSnapshot ${claim.namespace}/${body.metadata.name}`, err);
  }
  const deadline = Date.now() + timeoutMs;
  // A snapshot that failed or never became ready is removed (that very object), or every later
  // election would find it by name and wait on it again until the cache is deleted.
  const discard = async (vs: VolumeSnapshot, why: string): Promise<never> => {
    await c.custom
      .deleteNamespacedCustomObject({
        ...ref,
        plural: "volumesnapshots",
        name: body.metadata.name!,
        body: { preconditions: { uid: vs.metadata?.uid } },
      })
      .catch((err: unknown) => {
        if (!isNotFound(err) && !isConflict(err))
          throw apiError(`removing VolumeSnapshot ${body.metadata.name}`, err);
      });
    throw new Error(`${why}; the snapshot was removed, so the next election takes a fresh one`);
  };
  for (;;) {
    const vs = (await c.custom.getNamespacedCustomObject({
      ...ref,
      plural: "volumesnapshots",
      name: body.metadata.name!,
    })) as VolumeSnapshot;
    if (vs.status?.error?.message)
      return discard(vs, `snapshot ${body.metadata.name} failed: ${vs.status.error.message}`);
    const contentName = vs.status?.boundVolumeSnapshotContentName;
    if (vs.status?.readyToUse && contentName) {
      const content = (await c.custom.getClusterCustomObject({
        group: SNAPSHOT_GROUP,
        version: SNAPSHOT_VERSION,
        plural: "volumesnapshotcontents",
        name: contentName,
      })) as VolumeSnapshotContent;
      const handle = content.status?.snapshotHandle;
      if (handle) {
        return {
          driver: content.spec.driver,
          handle,
          ...(vs.status.restoreSize ? { restoreSize: vs.status.restoreSize } : {}),
        };
      }
    }
    if (Date.now() > deadline)
      return discard(
        vs,
        `snapshot ${claim.namespace}/${body.metadata.name} not ready after ${Math.round(timeoutMs / 1000)}s`,
      );
    await sleep(1_000, undefined, signal ? { signal } : undefined);
  }
}
