/**
 * The objects a promote creates, as pure functions of the cache source and the consumer
 * namespace. Every object carries all its labels from creation on and is never updated, so two
 * callers racing to create it converge on one object through AlreadyExists. Names are
 * deterministic: the API server is the lock.
 */
import type * as k8s from "@kubernetes/client-node";
import { LABEL_HASH, LABEL_NAMESPACE, claimName } from "../core/contract.js";
import type { CacheSource } from "./source.js";

export const SNAPSHOT_GROUP = "snapshot.storage.k8s.io";
export const SNAPSHOT_VERSION = "v1";
export const MANAGED_BY = { "app.kubernetes.io/managed-by": "warmstart" } as const;
/** The node agent's own CSI driver (node-store, docs/adr/0011-store-driver.md); its handle is a full hash. */
export const NODE_STORE_DRIVER = "store.warmstart.dev";

/** Labels of everything minted for one cache in (or for) one namespace. */
export function promoteLabels(short: string, namespace: string): Record<string, string> {
  return { [LABEL_HASH]: short, [LABEL_NAMESPACE]: namespace, ...MANAGED_BY };
}

/** The cluster-scoped PV (or VolumeSnapshotContent) of one cache in one namespace. */
export const perNamespaceName = (short: string, namespace: string): string =>
  `warmstart-${short}-${namespace}`;
/** The namespaced VolumeSnapshot a clone is made from (snapshot-clone). */
export const snapshotName = (short: string): string => `warmstart-${short}`;

/** A storage request covering `bytes`, in whole MiB, at least 1Mi. */
export function storageQuantity(bytes: number): string {
  return `${Math.max(1, Math.ceil(bytes / 2 ** 20))}Mi`;
}

/**
 * Replaces `{name}` placeholders, and `{attr:NAME}` (the store volume's CSI attribute, matched
 * without regard to case, "" when absent) and `{handle:N}` (the N-th `:`-separated part of the
 * store's handle, "" when absent) when `store` is given. An unknown placeholder is an error, so a
 * typo never reaches a driver. Runs of `/` collapse to one, so an empty part joins cleanly
 * (`{attr:subdir}/{path}`).
 */
export function renderTemplate(
  template: string,
  vars: Readonly<Record<string, string>>,
  store?: { handle: string; attributes: Readonly<Record<string, string>> },
): string {
  const rendered = template.replace(
    /\{([a-zA-Z]+)(?::([A-Za-z0-9_.-]+))?\}/g,
    (whole, name: string, arg: string | undefined) => {
      if (arg !== undefined && store) {
        if (name === "attr") return attributeOf(store.attributes, arg) ?? "";
        if (name === "handle" && /^\d$/.test(arg)) return store.handle.split(":")[Number(arg)] ?? "";
      }
      const v = arg === undefined ? vars[name] : undefined;
      if (v === undefined) throw new Error(`unknown placeholder ${whole} in "${template}"`);
      return v;
    },
  );
  return rendered.replace(/\/{2,}/g, "/");
}

/** The value of a CSI attribute, its key matched without regard to case (drivers differ). */
function attributeOf(attributes: Readonly<Record<string, string>>, key: string): string | undefined {
  const k = Object.keys(attributes).find((a) => a.toLowerCase() === key.toLowerCase());
  return k === undefined ? undefined : attributes[k];
}

function claimRefTo(short: string, namespace: string): k8s.V1ObjectReference {
  return { apiVersion: "v1", kind: "PersistentVolumeClaim", namespace, name: claimName(short) };
}

function nodeAffinity(node: string): k8s.V1VolumeNodeAffinity {
  return {
    required: {
      nodeSelectorTerms: [
        { matchExpressions: [{ key: "kubernetes.io/hostname", operator: "In", values: [node] }] },
      ],
    },
  };
}

/** host-path: the tree on one node, exposed read-only to one namespace, pre-bound to its claim. */
export function hostPathVolume(
  short: string,
  source: CacheSource,
  namespace: string,
): k8s.V1PersistentVolume {
  if (!source.node || !source.path)
    throw new Error(`cache ${short}: host-path source needs a node and a path`);
  const type = source.hostPathType ?? "local";
  return staticVolume(short, source, namespace, {
    ...(type === "local"
      ? { local: { path: source.path } }
      : { hostPath: { path: source.path, type: "Directory" } }),
    nodeAffinity: nodeAffinity(source.node),
  });
}

/**
 * node-store: the tree through the node agents' CSI driver, with **no** node affinity: a pod may
 * run on any node, whose agent replicates the tree from its peers before it mounts it. The handle
 * is the full hash (the driver refuses anything else); no mount options, the driver mounts the
 * tree `ro,nosuid,nodev` itself whatever the pod asks.
 */
export function nodeStoreVolume(
  short: string,
  source: CacheSource,
  namespace: string,
): k8s.V1PersistentVolume {
  const hash = source.volumeHandle ?? "";
  if (!/^[0-9a-f]{64}$/.test(hash) || !hash.startsWith(short))
    throw new Error(`cache ${short}: node-store source needs the cache's full hash as its volume handle`);
  return staticVolume(short, source, namespace, {
    csi: { driver: NODE_STORE_DRIVER, volumeHandle: hash, readOnly: true },
  });
}

/**
 * A read-only PV of the cache for one namespace, pre-bound to its `rox-<short>` claim. ReadOnlyMany
 * is a promise the kubelet does not keep for a pod that mounts the claim without `readOnly`: a
 * volume type that takes mount options is mounted `ro` on the node whatever the pod asks (SPEC
 * 1.9). The kubelet refuses mount options on `hostPath` volumes; the node-store driver takes none.
 */
function staticVolume(
  short: string,
  source: CacheSource,
  namespace: string,
  volume: Partial<k8s.V1PersistentVolumeSpec>,
): k8s.V1PersistentVolume {
  const mountOptions =
    volume.csi?.driver === NODE_STORE_DRIVER
      ? []
      : volume.hostPath
        ? source.mountOptions
        : [...new Set([...source.mountOptions, "ro"])];
  return {
    apiVersion: "v1",
    kind: "PersistentVolume",
    metadata: { name: perNamespaceName(short, namespace), labels: promoteLabels(short, namespace) },
    spec: {
      capacity: { storage: storageQuantity(source.sizeBytes) },
      accessModes: ["ReadOnlyMany"],
      volumeMode: "Filesystem",
      persistentVolumeReclaimPolicy: "Retain",
      storageClassName: source.storageClassName,
      ...(mountOptions.length ? { mountOptions } : {}),
      ...volume,
      claimRef: claimRefTo(short, namespace),
    },
  };
}

/**
 * shared-volume: the store volume's data narrowed to the one tree (the profile's templates name
 * the tree's folder in the handle or an attribute, SPEC 1.9), under a handle rewritten for the
 * namespace (a driver keys node-side state by handle, so two PVs on one node must not share it).
 * A template attribute replaces the store's attribute of any case, and one that renders empty
 * removes it.
 */
export function sharedVolume(short: string, source: CacheSource, namespace: string): k8s.V1PersistentVolume {
  if (!source.driver || !source.volumeHandle) {
    throw new Error(`cache ${short}: shared-volume source needs a CSI driver and volume handle`);
  }
  const vars = { handle: source.volumeHandle, namespace, short, path: source.subPath ?? "" };
  const store = { handle: source.volumeHandle, attributes: source.volumeAttributes ?? {} };
  const attributes: Record<string, string> = { ...source.volumeAttributes };
  for (const [k, v] of Object.entries(source.attributeTemplates ?? {})) {
    const value = renderTemplate(v, vars, store);
    for (const existing of Object.keys(attributes))
      if (existing.toLowerCase() === k.toLowerCase()) delete attributes[existing];
    if (value) attributes[k] = value;
  }
  return staticVolume(short, source, namespace, {
    csi: {
      driver: source.driver,
      volumeHandle: renderTemplate(source.handleTemplate ?? "{handle}", vars, store),
      readOnly: true,
      ...(source.fsType ? { fsType: source.fsType } : {}),
      ...(Object.keys(attributes).length ? { volumeAttributes: attributes } : {}),
    },
  });
}

/** Claim `rox-<short>` pre-bound to its PV (host-path, node-store and shared-volume). */
export function preBoundClaim(
  short: string,
  source: CacheSource,
  namespace: string,
  volume: k8s.V1PersistentVolume,
): k8s.V1PersistentVolumeClaim {
  return {
    apiVersion: "v1",
    kind: "PersistentVolumeClaim",
    metadata: { name: claimName(short), namespace, labels: promoteLabels(short, namespace) },
    spec: {
      accessModes: ["ReadOnlyMany"],
      volumeMode: "Filesystem",
      storageClassName: source.storageClassName,
      resources: { requests: { storage: volume.spec!.capacity!.storage! } },
      volumeName: volume.metadata!.name!,
    },
  };
}

export interface VolumeSnapshotContent {
  apiVersion: string;
  kind: "VolumeSnapshotContent";
  metadata: k8s.V1ObjectMeta;
  spec: {
    deletionPolicy: "Retain" | "Delete";
    driver: string;
    source: { snapshotHandle?: string; volumeHandle?: string };
    volumeSnapshotClassName?: string;
    volumeSnapshotRef: { namespace: string; name: string; kind?: string; apiVersion?: string };
  };
  status?: {
    snapshotHandle?: string;
    restoreSize?: number;
    readyToUse?: boolean;
    error?: { message?: string };
  };
}

export interface VolumeSnapshot {
  apiVersion: string;
  kind: "VolumeSnapshot";
  metadata: k8s.V1ObjectMeta;
  spec: {
    volumeSnapshotClassName?: string;
    source: { persistentVolumeClaimName?: string; volumeSnapshotContentName?: string };
  };
  status?: {
    readyToUse?: boolean;
    boundVolumeSnapshotContentName?: string;
    restoreSize?: string;
    error?: { message?: string };
  };
}

function snapshotSource(short: string, source: CacheSource): { driver: string; handle: string } {
  if (!source.driver || !source.snapshotHandle) {
    throw new Error(`cache ${short}: snapshot-clone source needs a CSI driver and snapshot handle`);
  }
  return { driver: source.driver, handle: source.snapshotHandle };
}

/**
 * snapshot-clone, per namespace: a pre-provisioned content that re-exposes the promote's snapshot
 * (Retain: deleting it never deletes the snapshot every other namespace clones from)...
 */
export function snapshotContentFor(
  short: string,
  source: CacheSource,
  namespace: string,
): VolumeSnapshotContent {
  const { driver, handle } = snapshotSource(short, source);
  return {
    apiVersion: `${SNAPSHOT_GROUP}/${SNAPSHOT_VERSION}`,
    kind: "VolumeSnapshotContent",
    metadata: { name: perNamespaceName(short, namespace), labels: promoteLabels(short, namespace) },
    spec: {
      deletionPolicy: "Retain",
      driver,
      source: { snapshotHandle: handle },
      ...(source.snapshotClass ? { volumeSnapshotClassName: source.snapshotClass } : {}),
      volumeSnapshotRef: { namespace, name: snapshotName(short) },
    },
  };
}

/** ...the VolumeSnapshot bound to that content... */
export function snapshotFor(short: string, source: CacheSource, namespace: string): VolumeSnapshot {
  return {
    apiVersion: `${SNAPSHOT_GROUP}/${SNAPSHOT_VERSION}`,
    kind: "VolumeSnapshot",
    metadata: { name: snapshotName(short), namespace, labels: promoteLabels(short, namespace) },
    spec: {
      ...(source.snapshotClass ? { volumeSnapshotClassName: source.snapshotClass } : {}),
      source: { volumeSnapshotContentName: perNamespaceName(short, namespace) },
    },
  };
}

/** ...and claim `rox-<short>` cloned from it, read-only for many nodes. */
export function cloneClaim(
  short: string,
  source: CacheSource,
  namespace: string,
): k8s.V1PersistentVolumeClaim {
  snapshotSource(short, source);
  return {
    apiVersion: "v1",
    kind: "PersistentVolumeClaim",
    metadata: { name: claimName(short), namespace, labels: promoteLabels(short, namespace) },
    spec: {
      accessModes: ["ReadOnlyMany"],
      volumeMode: "Filesystem",
      ...(source.storageClassName ? { storageClassName: source.storageClassName } : {}),
      resources: { requests: { storage: source.restoreSize ?? storageQuantity(source.sizeBytes) } },
      dataSource: { apiGroup: SNAPSHOT_GROUP, kind: "VolumeSnapshot", name: snapshotName(short) },
    },
  };
}

/** snapshot-clone, once per cache: the snapshot of the store volume that holds the captured tree. */
export function storeSnapshot(
  short: string,
  storeClaim: { namespace: string; name: string },
  snapshotClass: string | undefined,
): VolumeSnapshot {
  return {
    apiVersion: `${SNAPSHOT_GROUP}/${SNAPSHOT_VERSION}`,
    kind: "VolumeSnapshot",
    metadata: {
      name: snapshotName(short),
      namespace: storeClaim.namespace,
      labels: promoteLabels(short, storeClaim.namespace),
    },
    spec: {
      ...(snapshotClass ? { volumeSnapshotClassName: snapshotClass } : {}),
      source: { persistentVolumeClaimName: storeClaim.name },
    },
  };
}
