import assert from "node:assert/strict";
import { test } from "node:test";
import { LABEL_HASH, LABEL_NAMESPACE } from "../core/contract.js";
import {
  cloneClaim,
  hostPathVolume,
  perNamespaceName,
  preBoundClaim,
  renderTemplate,
  sharedVolume,
  snapshotContentFor,
  snapshotFor,
  storageQuantity,
  storeSnapshot,
} from "./objects.js";
import { parseProfiles, resolveProfile, unshareable } from "./profiles.js";
import { CacheSourceSchema, encodeSource, sourceOf, treeSubPath, type CacheSource } from "./source.js";

const short = "0123456789abcdef";

const hostPath: CacheSource = CacheSourceSchema.parse({
  backend: "host-path",
  provisioner: "warmstart.dev/host-path",
  sizeBytes: 5 * 2 ** 20 + 1,
  node: "gpu-0",
  path: `/var/lib/warmstart/store/${short}`,
  hostPathType: "local",
});

const shared: CacheSource = CacheSourceSchema.parse({
  backend: "shared-volume",
  provisioner: "nfs.csi.k8s.io",
  sizeBytes: 10,
  storageClassName: "nfs-rox",
  mountOptions: ["nfsvers=4.1"],
  driver: "nfs.csi.k8s.io",
  volumeHandle: "nas#/exports",
  volumeAttributes: { server: "nas" },
  attributeTemplates: { subDir: "{path}" },
  handleTemplate: "{handle}#{path}#{namespace}",
  subPath: short,
});

const snap: CacheSource = CacheSourceSchema.parse({
  backend: "snapshot-clone",
  provisioner: "pd.csi.storage.gke.io",
  volumeType: "hyperdisk-ml",
  sizeBytes: 100,
  storageClassName: "hyperdisk-ml-rox",
  driver: "pd.csi.storage.gke.io",
  snapshotHandle: "projects/p/global/snapshots/s1",
  snapshotClass: "hdml",
  restoreSize: "64Gi",
  subPath: short,
});

void test("storage requests round up to whole MiB and are never zero", () => {
  assert.equal(storageQuantity(0), "1Mi");
  assert.equal(storageQuantity(1), "1Mi");
  assert.equal(storageQuantity(2 ** 20), "1Mi");
  assert.equal(storageQuantity(2 ** 20 + 1), "2Mi");
  assert.equal(storageQuantity(3 * 2 ** 30), "3072Mi");
});

void test("host-path: a ReadOnlyMany local PV on the capture node, pre-bound both ways, labels from creation", () => {
  const pv = hostPathVolume(short, hostPath, "team-a");
  const pvc = preBoundClaim(short, hostPath, "team-a", pv);
  const labels = {
    [LABEL_HASH]: short,
    [LABEL_NAMESPACE]: "team-a",
    "app.kubernetes.io/managed-by": "warmstart",
  };
  assert.deepEqual(pv.metadata?.labels, labels);
  assert.deepEqual(pvc.metadata?.labels, labels);
  assert.equal(pv.metadata?.name, `warmstart-${short}-team-a`);
  assert.deepEqual(pv.spec?.accessModes, ["ReadOnlyMany"]);
  assert.deepEqual(pv.spec?.local, { path: hostPath.path });
  assert.equal(pv.spec?.hostPath, undefined);
  assert.deepEqual(pv.spec?.mountOptions, ["ro"], "bound read-only on the node, whatever the pod asks");
  assert.equal(pv.spec?.persistentVolumeReclaimPolicy, "Retain", "deleting a claim never deletes the tree");
  assert.deepEqual(pv.spec?.nodeAffinity?.required?.nodeSelectorTerms, [
    { matchExpressions: [{ key: "kubernetes.io/hostname", operator: "In", values: ["gpu-0"] }] },
  ]);
  // Pre-bound: the PV names the claim, the claim names the PV, and they agree on what binding checks.
  assert.deepEqual(pv.spec?.claimRef, {
    apiVersion: "v1",
    kind: "PersistentVolumeClaim",
    namespace: "team-a",
    name: `rox-${short}`,
  });
  assert.equal(pvc.metadata?.name, `rox-${short}`);
  assert.equal(pvc.metadata?.namespace, "team-a");
  assert.equal(pvc.spec?.volumeName, pv.metadata?.name);
  assert.equal(pvc.spec?.storageClassName, pv.spec?.storageClassName);
  assert.equal(pvc.spec?.storageClassName, "", "an explicit empty class: nothing may provision it");
  assert.deepEqual(pvc.spec?.accessModes, ["ReadOnlyMany"]);
  assert.equal(pvc.spec?.resources?.requests?.storage, "6Mi");
  assert.equal(pv.spec?.capacity?.storage, "6Mi");
  assert.equal(pvc.spec?.volumeMode, pv.spec?.volumeMode);
});

void test("host-path can use a hostPath volume instead of local", () => {
  const pv = hostPathVolume(short, { ...hostPath, hostPathType: "hostPath" }, "ns");
  assert.deepEqual(pv.spec?.hostPath, { path: hostPath.path, type: "Directory" });
  assert.equal(pv.spec?.local, undefined);
  assert.equal(pv.spec?.mountOptions, undefined, "the kubelet refuses mount options on hostPath volumes");
  assert.ok(pv.spec?.nodeAffinity, "still pinned to the node that holds the tree");
});

void test("shared-volume: the handle and attribute templates are rendered per namespace", () => {
  const a = sharedVolume(short, shared, "team-a");
  const b = sharedVolume(short, shared, "team-b");
  assert.equal(a.spec?.csi?.driver, "nfs.csi.k8s.io");
  assert.equal(a.spec?.csi?.volumeHandle, `nas#/exports#${short}#team-a`);
  assert.equal(b.spec?.csi?.volumeHandle, `nas#/exports#${short}#team-b`);
  assert.notEqual(
    a.spec?.csi?.volumeHandle,
    b.spec?.csi?.volumeHandle,
    "two PVs on one node never share a handle",
  );
  assert.deepEqual(a.spec?.csi?.volumeAttributes, { server: "nas", subDir: short });
  assert.equal(a.spec?.csi?.readOnly, true);
  assert.deepEqual(
    a.spec?.mountOptions,
    ["nfsvers=4.1", "ro"],
    "mounted read-only on the node, whatever the pod asks",
  );
  assert.equal(a.spec?.storageClassName, "nfs-rox");
  assert.equal(a.spec?.nodeAffinity, undefined, "a shared volume is reachable from every node");
  const claim = preBoundClaim(short, shared, "team-a", a);
  assert.equal(claim.spec?.volumeName, perNamespaceName(short, "team-a"));
  assert.equal(claim.spec?.storageClassName, "nfs-rox");
  assert.equal(a.metadata?.labels?.[LABEL_NAMESPACE], "team-a");
});

void test("templates refuse unknown placeholders instead of passing a typo to a driver", () => {
  assert.equal(renderTemplate("{handle}/{short}", { handle: "h", short: "s" }), "h/s");
  assert.throws(
    () => renderTemplate("{handel}-{namespace}", { handle: "h", namespace: "n" }),
    /unknown placeholder \{handel\}/,
  );
  assert.throws(
    () => sharedVolume(short, { ...shared, handleTemplate: "{nope}" }, "ns"),
    /unknown placeholder/,
  );
});

void test("builders refuse a source that lacks what the backend needs", () => {
  assert.throws(() => hostPathVolume(short, { ...hostPath, node: undefined }, "ns"), /needs a node/);
  assert.throws(() => sharedVolume(short, { ...shared, volumeHandle: undefined }, "ns"), /volume handle/);
  assert.throws(() => cloneClaim(short, { ...snap, snapshotHandle: undefined }, "ns"), /snapshot handle/);
});

void test("snapshot-clone: a Retain content re-exposing the snapshot, its VolumeSnapshot, and a ROX clone", () => {
  const content = snapshotContentFor(short, snap, "team-a");
  const vs = snapshotFor(short, snap, "team-a");
  const pvc = cloneClaim(short, snap, "team-a");
  assert.equal(content.spec.deletionPolicy, "Retain");
  assert.deepEqual(content.spec.source, { snapshotHandle: snap.snapshotHandle });
  assert.equal(content.spec.driver, "pd.csi.storage.gke.io");
  assert.equal(content.spec.volumeSnapshotClassName, "hdml");
  // Pre-provisioned pair: each names the other.
  assert.deepEqual(content.spec.volumeSnapshotRef, { namespace: "team-a", name: vs.metadata.name });
  assert.deepEqual(vs.spec.source, { volumeSnapshotContentName: content.metadata.name });
  assert.equal(vs.metadata.namespace, "team-a");
  assert.deepEqual(pvc.spec?.dataSource, {
    apiGroup: "snapshot.storage.k8s.io",
    kind: "VolumeSnapshot",
    name: vs.metadata.name,
  });
  assert.deepEqual(pvc.spec?.accessModes, ["ReadOnlyMany"]);
  assert.equal(pvc.spec?.storageClassName, "hyperdisk-ml-rox");
  assert.equal(pvc.spec?.resources?.requests?.storage, "64Gi", "at least the snapshot's restore size");
  assert.equal(pvc.spec?.volumeName, undefined, "a clone is provisioned, not pre-bound");
  for (const o of [content.metadata, vs.metadata, pvc.metadata!]) {
    assert.equal(o.labels?.[LABEL_HASH], short);
    assert.equal(o.labels?.[LABEL_NAMESPACE], "team-a");
  }
  const source = storeSnapshot(short, { namespace: "warmstart-system", name: "store-gpu-0" }, "hdml");
  assert.deepEqual(source.spec.source, { persistentVolumeClaimName: "store-gpu-0" });
  assert.equal(source.metadata.namespace, "warmstart-system");
});

void test("the source round-trips through the annotation and a damaged one reads as none", () => {
  const cache = { metadata: { annotations: { "warmstart.dev/source": encodeSource(shared) } } };
  assert.deepEqual(sourceOf(cache), shared);
  assert.equal(sourceOf({ metadata: { annotations: { "warmstart.dev/source": "{not json" } } }), undefined);
  assert.equal(
    sourceOf({ metadata: { annotations: { "warmstart.dev/source": '{"backend":"tape"}' } } }),
    undefined,
  );
  assert.equal(sourceOf({ metadata: {} }), undefined);
});

/** The source promote records for a store volume under its driver's built-in profile. */
function sharedSourceFor(
  driver: string,
  volumeHandle: string,
  volumeAttributes: Record<string, string>,
): CacheSource {
  const p = resolveProfile(new Map(), driver);
  return CacheSourceSchema.parse({
    backend: p.backend,
    provisioner: driver,
    sizeBytes: 10,
    driver,
    volumeHandle,
    volumeAttributes,
    attributeTemplates: p.volumeAttributes,
    handleTemplate: p.handleTemplate,
    subPath: `trees/${short}`,
    treeAtRoot: true,
  });
}

void test("a shared volume's PV mounts the tree's folder only, in each driver's own terms (SPEC 1.9)", () => {
  // csi-driver-nfs mounts server:share/subdir; a dynamic volume's subdir is its attribute.
  const nfs = sharedVolume(
    short,
    sharedSourceFor("nfs.csi.k8s.io", "nas#exports#pvc-1##", {
      server: "nas",
      share: "/exports",
      subdir: "pvc-1",
    }),
    "team-a",
  ).spec!.csi!;
  assert.deepEqual(nfs.volumeAttributes, { server: "nas", share: `/exports/pvc-1/trees/${short}` });
  assert.equal(nfs.volumeHandle, `nas#exports#pvc-1###trees/${short}#team-a`, "unique per namespace");
  // A static volume with `subDir` spelled another way: replaced, never left beside the new value.
  const staticNfs = sharedVolume(
    short,
    sharedSourceFor("nfs.csi.k8s.io", "nas/exports", { server: "nas", share: "/exports/", subDir: "m" }),
    "team-a",
  ).spec!.csi!;
  assert.deepEqual(staticNfs.volumeAttributes, { server: "nas", share: `/exports/m/trees/${short}` });
  // EFS: fs-id[:subpath[:access-point]] with the tree's folder as the subpath.
  const efs = (handle: string): string =>
    sharedVolume(short, sharedSourceFor("efs.csi.aws.com", handle, {}), "team-a").spec!.csi!.volumeHandle;
  assert.equal(efs("fs-0a1b"), `fs-0a1b:/trees/${short}:`);
  assert.equal(efs("fs-0a1b:/models:fsap-9"), `fs-0a1b:/models/trees/${short}:fsap-9`);
  assert.equal(efs("fs-0a1b::fsap-9"), `fs-0a1b:/trees/${short}:fsap-9`);
  // FSx for Lustre: dnsname@tcp:/mountname/folder.
  const fsx = sharedVolume(
    short,
    sharedSourceFor("fsx.csi.aws.com", "fs-1", { dnsname: "fs-1.fsx", mountname: "abcd" }),
    "team-a",
  ).spec!.csi!;
  assert.equal(fsx.volumeAttributes?.mountname, `abcd/trees/${short}`);
  // A restore mounts the volume's root: it is the tree.
  assert.equal(treeSubPath(sharedSourceFor("nfs.csi.k8s.io", "h", {})), ".");
  assert.equal(treeSubPath(shared), short, "a source recorded before narrowing keeps its sub-folder");
});

void test("a shared volume whose driver would mount the whole store is refused, with the reason", () => {
  for (const driver of [
    "filestore.csi.storage.gke.io",
    "file.csi.azure.com",
    "cephfs.csi.ceph.com",
    "nvmesh-csi.excelero.com",
  ]) {
    const p = resolveProfile(new Map(), driver);
    assert.equal(p.backend, "shared-volume");
    assert.match(unshareable(p) ?? "", /would mount the whole store/, driver);
  }
  for (const driver of ["nfs.csi.k8s.io", "efs.csi.aws.com", "fsx.csi.aws.com"])
    assert.equal(unshareable(resolveProfile(new Map(), driver)), undefined, driver);
  // An operator's profile that names the folder makes a driver shareable.
  const configured = parseProfiles({
    "filestore.csi.storage.gke.io": JSON.stringify({
      volumeAttributes: { volume: "{attr:volume}/{path}" },
      mountsTree: true,
    }),
  }).entries;
  assert.equal(unshareable(resolveProfile(configured, "filestore.csi.storage.gke.io")), undefined);
  assert.match(unshareable(resolveProfile(new Map(), "ebs.csi.aws.com")) ?? "", /clones a volume per pod/);
});

void test("template placeholders for the store volume: attributes of any case, handle parts, joined paths", () => {
  const store = { handle: "fs-1:/a:fsap", attributes: { Share: "/x/" } };
  assert.equal(renderTemplate("{attr:share}/{path}", { path: "t/1" }, store), "/x/t/1");
  assert.equal(renderTemplate("{attr:missing}/{path}", { path: "t" }, store), "/t");
  assert.equal(renderTemplate("{handle:0}|{handle:2}|{handle:5}", {}, store), "fs-1|fsap|");
  assert.throws(() => renderTemplate("{attr:share}", {}), /unknown placeholder \{attr:share\}/);
});
