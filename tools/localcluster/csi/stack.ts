/**
 * The local cluster's CSI stack: the folder driver stand-in on the real node (registered with its
 * kubelet), and the real Kubernetes sidecars (external-provisioner, csi-snapshotter,
 * snapshot-controller) built from their Go modules, with the VolumeSnapshot CRDs, a CSIDriver,
 * two StorageClasses (a shared one, and one whose volumes are snapshotted and cloned), a
 * VolumeSnapshotClass, and the storage profile that maps the driver to Warmstart's backends.
 */
import { access, constants, readFile, readdir } from "node:fs/promises";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { isAlreadyExists, SYSTEM_NAMESPACE } from "../../../src/common/kube.js";
import { STORAGE_PROFILES_CONFIGMAP } from "../../../src/core/contract.js";
import { PACKAGE_ROOT, cacheDir } from "../versions.js";
import type { ProcessRecord } from "../processes.js";
import { buildScriptSteps, runStep } from "../run-step.js";
import { CSI_DRIVER_NAME } from "./driver.js";

export const CSI_VERSIONS = {
  snapshotter: "v8.7.0",
  provisioner: "v6.4.0",
  csiTest: "v5.6.0",
  spec: "v1.12.0",
  kubeletApi: "v0.35.4",
} as const;

/** Volumes of this class are shared as they are (the shared-volume backend). */
export const SHARED_CLASS = "warmstart-folders-shared";
/** Volumes of this class are snapshotted and cloned read-only (the snapshot-clone backend). */
export const SNAPSHOT_CLASS = "warmstart-folders-snapshot";
/** Block volumes: what the driver cannot share read-only (Unsupported, pods start cold). */
export const BLOCK_CLASS = "warmstart-folders-block";
export const VOLUME_SNAPSHOT_CLASS = "warmstart-folders";

export const csiDir = (): string =>
  join(
    cacheDir(),
    `csi-snapshotter-${CSI_VERSIONS.snapshotter}-provisioner-${CSI_VERSIONS.provisioner}-csi-test-${CSI_VERSIONS.csiTest}`,
  );

const BINARIES = ["snapshot-controller", "csi-snapshotter", "csi-provisioner", "csi-sanity"] as const;

/** The sidecars' binaries and the protos, built (once) from their modules. */
export async function ensureCsiBinaries(progress: (line: string) => void): Promise<string> {
  const dir = csiDir();
  const have = await Promise.all(
    [...BINARIES.map((b) => join(dir, b)), join(dir, "csi.proto")].map((p) =>
      access(p, constants.R_OK).then(
        () => true,
        () => false,
      ),
    ),
  );
  if (have.every(Boolean)) return dir;
  progress(`building the CSI sidecars into ${dir} (once; later runs reuse them)`);
  await runStep("bash", [join(PACKAGE_ROOT, "tools/localcluster/build-csi.sh")], {
    env: {
      SNAPSHOTTER_VERSION: CSI_VERSIONS.snapshotter,
      PROVISIONER_VERSION: CSI_VERSIONS.provisioner,
      CSI_TEST_VERSION: CSI_VERSIONS.csiTest,
      CSI_SPEC_VERSION: CSI_VERSIONS.spec,
      KUBELET_API_VERSION: CSI_VERSIONS.kubeletApi,
      WARMSTART_CSI_DIR: dir,
    },
    show: buildScriptSteps,
    progress,
    heartbeat: "still building the CSI sidecars...",
  });
  return dir;
}

export interface CsiContext {
  stateDir: string;
  kubeconfig: string;
  kc: k8s.KubeConfig;
  /** The real node the driver's node service runs on, and its kubelet root. */
  node: string;
  kubeletRoot: string;
  launch: (name: string, command: string, args: string[]) => Promise<ProcessRecord>;
  progress: (line: string) => void;
}

export interface CsiState {
  driver: string;
  socket: string;
  dataDir: string;
  storageClasses: { shared: string; snapshot: string; block: string };
  volumeSnapshotClass: string;
}

export async function startCsi(ctx: CsiContext): Promise<CsiState> {
  const bins = await ensureCsiBinaries(ctx.progress);
  const socket = join(ctx.stateDir, "csi", "csi.sock");
  const dataDir = join(ctx.stateDir, "csi", "data");
  ctx.progress(`starting the CSI driver stand-in (${CSI_DRIVER_NAME}) and the Kubernetes CSI sidecars`);
  await applyObjects(ctx.kc, bins);
  await ctx.launch("csi-driver", process.execPath, [
    join(PACKAGE_ROOT, "dist/tools/localcluster/csi/main.js"),
    `--socket=${socket}`,
    `--data=${dataDir}`,
    `--node-id=${ctx.node}`,
    `--proto-dir=${bins}`,
    `--registration-dir=${join(ctx.kubeletRoot, "plugins_registry")}`,
  ]);
  const common = [`--kubeconfig=${ctx.kubeconfig}`, "--leader-election=false", "--v=2"];
  await ctx.launch("csi-provisioner", join(bins, "csi-provisioner"), [
    ...common,
    `--csi-address=${socket}`,
    "--timeout=60s",
    "--retry-interval-start=500ms",
    "--retry-interval-max=5s",
  ]);
  await ctx.launch("csi-snapshotter", join(bins, "csi-snapshotter"), [
    ...common,
    `--csi-address=${socket}`,
    "--timeout=60s",
    "--retry-interval-start=500ms",
    "--retry-interval-max=5s",
  ]);
  await ctx.launch("snapshot-controller", join(bins, "snapshot-controller"), [
    ...common,
    "--retry-interval-start=500ms",
    "--retry-interval-max=5s",
  ]);
  // The kubelet registers the driver on its node: CSINode lists it once that is done.
  const storage = ctx.kc.makeApiClient(k8s.StorageV1Api);
  const deadline = Date.now() + 60_000;
  for (;;) {
    const csiNode = await storage.readCSINode({ name: ctx.node }).catch(() => undefined);
    if (csiNode?.spec?.drivers?.some((d) => d.name === CSI_DRIVER_NAME)) break;
    if (Date.now() > deadline)
      throw new Error(`the kubelet of ${ctx.node} did not register ${CSI_DRIVER_NAME}`);
    await new Promise((r) => setTimeout(r, 250));
  }
  return {
    driver: CSI_DRIVER_NAME,
    socket,
    dataDir,
    storageClasses: { shared: SHARED_CLASS, snapshot: SNAPSHOT_CLASS, block: BLOCK_CLASS },
    volumeSnapshotClass: VOLUME_SNAPSHOT_CLASS,
  };
}

/** The objects that make the driver usable: CRDs, CSIDriver, classes and the storage profile. */
async function applyObjects(kc: k8s.KubeConfig, bins: string): Promise<void> {
  const objects = k8s.KubernetesObjectApi.makeApiClient(kc);
  const create = async (o: k8s.KubernetesObject): Promise<void> => {
    try {
      await objects.create(o);
    } catch (err) {
      if (!isAlreadyExists(err)) throw err;
    }
  };
  const crdDir = join(bins, "crds");
  for (const f of (await readdir(crdDir)).sort()) {
    for (const doc of k8s.loadAllYaml(
      await readFile(join(crdDir, f), "utf8"),
    ) as (k8s.KubernetesObject | null)[])
      if (doc?.kind) await create(doc);
  }
  const ext = kc.makeApiClient(k8s.ApiextensionsV1Api);
  for (let i = 0; i < 200; i++) {
    const crds = await ext.listCustomResourceDefinition();
    const snap = crds.items.filter((c) => c.spec.group === "snapshot.storage.k8s.io");
    if (
      snap.length >= 3 &&
      snap.every((c) => c.status?.conditions?.some((x) => x.type === "Established" && x.status === "True"))
    )
      break;
    await new Promise((r) => setTimeout(r, 100));
  }
  await create({
    apiVersion: "storage.k8s.io/v1",
    kind: "CSIDriver",
    metadata: { name: CSI_DRIVER_NAME },
    spec: {
      attachRequired: false,
      podInfoOnMount: false,
      fsGroupPolicy: "None",
      volumeLifecycleModes: ["Persistent"],
    },
  } as k8s.V1CSIDriver);
  const cls = (name: string, type: string): k8s.V1StorageClass => ({
    apiVersion: "storage.k8s.io/v1",
    kind: "StorageClass",
    metadata: { name },
    provisioner: CSI_DRIVER_NAME,
    parameters: { type },
    reclaimPolicy: "Delete",
    volumeBindingMode: "Immediate",
  });
  await create(cls(SHARED_CLASS, "shared"));
  await create(cls(SNAPSHOT_CLASS, "snapshot"));
  await create(cls(BLOCK_CLASS, "block"));
  await create({
    apiVersion: "snapshot.storage.k8s.io/v1",
    kind: "VolumeSnapshotClass",
    metadata: { name: VOLUME_SNAPSHOT_CLASS },
    driver: CSI_DRIVER_NAME,
    deletionPolicy: "Delete",
  } as k8s.KubernetesObject);

  // How Warmstart promotes a store on each class (SPEC 1.5): by the class's `type` parameter.
  const core = kc.makeApiClient(k8s.CoreV1Api);
  // Shared: like NFS's driver, a `subDir` attribute mounts one folder of the volume, so each
  // namespace's volume is the tree's folder and nothing else of the store.
  const shared = { backend: "shared-volume", volumeAttributes: { subDir: "{path}" }, mountsTree: true };
  const profile = {
    ...shared,
    volumeTypes: {
      shared,
      snapshot: {
        backend: "snapshot-clone",
        storageClassName: SNAPSHOT_CLASS,
        snapshotClass: VOLUME_SNAPSHOT_CLASS,
      },
      // A block device cannot be mounted read-only on many nodes: restores would need a clone per pod.
      block: { backend: "per-pod-clone" },
    },
  };
  const data = { [CSI_DRIVER_NAME]: JSON.stringify(profile) };
  try {
    await core.createNamespacedConfigMap({
      namespace: SYSTEM_NAMESPACE,
      body: { metadata: { name: STORAGE_PROFILES_CONFIGMAP, namespace: SYSTEM_NAMESPACE }, data },
    });
  } catch (err) {
    if (!isAlreadyExists(err)) throw err;
    await core.patchNamespacedConfigMap(
      { name: STORAGE_PROFILES_CONFIGMAP, namespace: SYSTEM_NAMESPACE, body: { data } },
      k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
    );
  }
}
