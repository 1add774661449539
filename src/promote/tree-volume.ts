/**
 * snapshot-clone, one tree per volume (SPEC 1.9): the committed tree is copied into a volume of
 * its own (claim `warmstart-tree-<short>` of the tree-volume class) by a short-lived writer pod
 * on the node that holds the tree, and that volume, never a store holding other trees, is what
 * gets snapshotted and cloned for every namespace. Block storage (RBD, PD) attaches to one node
 * at a time, so only a pod on that node can write it: the node agent cannot mount volumes itself.
 */
import type * as k8s from "@kubernetes/client-node";
import { setTimeout as sleep } from "node:timers/promises";
import { apiError, isAlreadyExists, isNotFound } from "../common/kube.js";
import type { PromoteClients } from "./claims.js";
import { MANAGED_BY, promoteLabels, storageQuantity } from "./objects.js";

export const treeVolumeName = (short: string): string => `warmstart-tree-${short}`;

/** Where the tree's folder sits in its volume (a file system's root may hold `lost+found`). */
export const TREE_FOLDER = "tree";

export interface TreeVolumeInput {
  short: string;
  hash: string;
  /** The claim and the writer pod live there. */
  systemNamespace: string;
  storageClass: string;
  /** The node holding the committed tree, and the tree's path there. */
  node: string;
  tree: string;
  sizeBytes: number;
  /** The Warmstart image (it runs `warmstart capture`) and how it is pulled. */
  image: string;
  imagePullSecrets?: string[];
  /** The cache record: the claim and the pod go with it when it is deleted. */
  owner?: { name: string; uid: string };
  timeoutMs: number;
  signal?: AbortSignal;
}

/** A file system's overhead on top of the data (inodes, journal), generously. */
const sizeFor = (bytes: number): string => storageQuantity(Math.ceil(bytes * 1.1) + 256 * 2 ** 20);

function metadataFor(i: TreeVolumeInput, labels: Record<string, string>): k8s.V1ObjectMeta {
  return {
    name: treeVolumeName(i.short),
    namespace: i.systemNamespace,
    labels,
    ...(i.owner
      ? {
          ownerReferences: [
            {
              apiVersion: "warmstart.dev/v1alpha1",
              kind: "ModelCache",
              name: i.owner.name,
              uid: i.owner.uid,
            },
          ],
        }
      : {}),
  };
}

export function treeVolumeClaim(i: TreeVolumeInput): k8s.V1PersistentVolumeClaim {
  return {
    apiVersion: "v1",
    kind: "PersistentVolumeClaim",
    metadata: metadataFor(i, promoteLabels(i.short, i.systemNamespace)),
    spec: {
      accessModes: ["ReadWriteOnce"],
      volumeMode: "Filesystem",
      storageClassName: i.storageClass,
      resources: { requests: { storage: sizeFor(i.sizeBytes) } },
    },
  };
}

/**
 * The writer: `warmstart capture` from the tree (read-only, on this node) into the volume. Root,
 * so owners and modes survive; placed by the scheduler (a node selector, not `nodeName`), so a
 * WaitForFirstConsumer class provisions the volume where the tree is.
 */
export function treeWriterPod(i: TreeVolumeInput): k8s.V1Pod {
  return {
    apiVersion: "v1",
    kind: "Pod",
    // No warmstart.dev/* label: on a pod, only the webhook writes those (it removes any other's).
    metadata: metadataFor(i, { ...MANAGED_BY, "app.kubernetes.io/component": "tree-writer" }),
    spec: {
      restartPolicy: "Never",
      // It talks to nothing: on the host's network it needs no pod network (a node whose network
      // plugin is not up yet, or has none, still gets its trees written).
      hostNetwork: true,
      nodeSelector: { "kubernetes.io/hostname": i.node },
      tolerations: [{ operator: "Exists" }],
      activeDeadlineSeconds: Math.max(60, Math.ceil(i.timeoutMs / 1000)),
      automountServiceAccountToken: false,
      ...(i.imagePullSecrets?.length
        ? { imagePullSecrets: i.imagePullSecrets.map((name) => ({ name })) }
        : {}),
      containers: [
        {
          name: "write",
          image: i.image,
          command: ["warmstart", "capture", "/tree", `/volume/${TREE_FOLDER}`, "--hash", i.hash],
          securityContext: { runAsUser: 0, allowPrivilegeEscalation: false },
          terminationMessagePolicy: "FallbackToLogsOnError",
          volumeMounts: [
            { name: "tree", mountPath: "/tree", readOnly: true },
            { name: "volume", mountPath: "/volume" },
          ],
        },
      ],
      volumes: [
        { name: "tree", hostPath: { path: i.tree, type: "Directory" } },
        { name: "volume", persistentVolumeClaim: { claimName: treeVolumeName(i.short) } },
      ],
    },
  };
}

/**
 * Writes the tree into its own volume and returns that claim, once the writer has succeeded and
 * is gone (it no longer holds the volume). A writer that failed is removed and its reason thrown.
 */
export async function writeTreeVolume(
  c: PromoteClients,
  i: TreeVolumeInput,
): Promise<{ namespace: string; name: string }> {
  const name = treeVolumeName(i.short);
  const where = `${i.systemNamespace}/${name}`;
  const deadline = Date.now() + i.timeoutMs;
  await createClaim(c, i, deadline);
  try {
    await c.core.createNamespacedPod({ namespace: i.systemNamespace, body: treeWriterPod(i) });
  } catch (err) {
    if (!isAlreadyExists(err)) throw apiError(`creating the tree volume's writer pod ${where}`, err);
  }
  const removeWriter = (uid: string | undefined): Promise<void> =>
    c.core
      .deleteNamespacedPod({
        namespace: i.systemNamespace,
        name,
        gracePeriodSeconds: 0,
        body: uid ? { preconditions: { uid } } : {},
      })
      .then(
        () => undefined,
        (err: unknown) => {
          if (!isNotFound(err)) throw apiError(`removing the writer pod ${where}`, err);
        },
      );
  for (;;) {
    let pod: k8s.V1Pod | undefined;
    try {
      pod = await c.core.readNamespacedPod({ namespace: i.systemNamespace, name });
    } catch (err) {
      if (!isNotFound(err)) throw apiError(`reading the writer pod ${where}`, err);
    }
    if (!pod) {
      await removeTreeVolume(c, i.systemNamespace, i.short);
      throw new Error(`the writer pod ${where} is gone before it finished`);
    }
    const phase = pod.status?.phase;
    if (phase === "Pending" && !(await liveClaim(c, i.systemNamespace, name))) {
      await removeWriter(pod.metadata?.uid);
      throw new Error(`the tree volume's claim ${where} was removed before its writer ran`);
    }
    if (phase === "Succeeded") {
      await removeWriter(pod.metadata?.uid);
      return { namespace: i.systemNamespace, name };
    }
    const terminated = pod.status?.containerStatuses?.[0]?.state?.terminated;
    if (phase === "Failed" || Date.now() > deadline) {
      await removeWriter(pod.metadata?.uid);
      // Whatever it left half-written goes too: the next election writes a fresh volume.
      await removeTreeVolume(c, i.systemNamespace, i.short);
      const why =
        phase === "Failed"
          ? `failed (${terminated?.reason ?? pod.status?.reason ?? "?"}): ${(terminated?.message ?? pod.status?.message ?? "").trim().slice(-500)}`
          : `did not finish in ${Math.round(i.timeoutMs / 1000)} s (${phase ?? "no phase"})`;
      throw new Error(`writing the tree into its volume ${where} ${why}`);
    }
    await sleep(1_000, undefined, i.signal ? { signal: i.signal } : undefined);
  }
}

/** The claim, unless it is gone or going. */
async function liveClaim(
  c: PromoteClients,
  namespace: string,
  name: string,
): Promise<k8s.V1PersistentVolumeClaim | undefined> {
  try {
    const claim = await c.core.readNamespacedPersistentVolumeClaim({ namespace, name });
    return claim.metadata?.deletionTimestamp ? undefined : claim;
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw apiError(`reading the tree volume's claim ${namespace}/${name}`, err);
  }
}

/**
 * Creates the tree's claim. One left by an earlier try that is still being removed (a failed
 * snapshot's, held by its protection finalizer a while) is waited out: taking it as this try's
 * would leave the writer pending on a claim about to vanish. A live one (an agent restarted
 * mid-write) is this try's.
 */
async function createClaim(c: PromoteClients, i: TreeVolumeInput, deadline: number): Promise<void> {
  const where = `${i.systemNamespace}/${treeVolumeName(i.short)}`;
  for (;;) {
    try {
      await c.core.createNamespacedPersistentVolumeClaim({
        namespace: i.systemNamespace,
        body: treeVolumeClaim(i),
      });
      return;
    } catch (err) {
      if (!isAlreadyExists(err)) throw apiError(`creating the tree volume's claim ${where}`, err);
    }
    if (await liveClaim(c, i.systemNamespace, treeVolumeName(i.short))) return;
    if (Date.now() > deadline)
      throw new Error(`the tree volume's claim ${where} left by an earlier try is still being removed`);
    await sleep(1_000, undefined, i.signal ? { signal: i.signal } : undefined);
  }
}

/** Once the snapshot holds the tree, its writer volume is not needed. */
export async function removeTreeVolume(
  c: PromoteClients,
  systemNamespace: string,
  short: string,
): Promise<void> {
  try {
    await c.core.deleteNamespacedPersistentVolumeClaim({
      namespace: systemNamespace,
      name: treeVolumeName(short),
    });
  } catch (err) {
    if (!isNotFound(err))
      throw apiError(`removing the tree volume ${systemNamespace}/${treeVolumeName(short)}`, err);
  }
}
