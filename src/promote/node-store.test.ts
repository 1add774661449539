/**
 * The node-store backend (SPEC 1.5, docs/adr/0011-store-driver.md): a node-local store becomes
 * node-store when the node agent serves the CSI driver, and its claims are pre-bound CSI PVs of
 * that driver with the full hash as handle and no node affinity.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { HOST_PATH_PROVISIONER, LABEL_HASH, LABEL_NAMESPACE } from "../core/contract.js";
import { ensureClaim, type PromoteClients } from "./claims.js";
import { NODE_STORE_DRIVER, hostPathVolume, nodeStoreVolume, preBoundClaim } from "./objects.js";
import { parseProfiles, resolveProfile, unshareable, withStoreDriver } from "./profiles.js";
import { publishSource } from "./publish.js";
import { deleteCachePass } from "./rollback.js";
import { CacheSourceSchema, encodeSource, sourceOf, treeSubPath, type CacheSource } from "./source.js";
import { createPromotion } from "./webhook.js";
import type { StorageProfiles } from "./profiles.js";

const hash = "0123456789abcdef".repeat(4);
const short = hash.slice(0, 16);
const none = new Map();

const nodeStore: CacheSource = CacheSourceSchema.parse({
  backend: "node-store",
  provisioner: HOST_PATH_PROVISIONER,
  sizeBytes: 5 * 2 ** 20 + 1,
  volumeHandle: hash,
});

void test("a node-local store is node-store when the node agent serves the driver, host-path when not", () => {
  for (const provisioner of [
    HOST_PATH_PROVISIONER,
    "kubernetes.io/no-provisioner",
    "rancher.io/local-path",
  ]) {
    const p = resolveProfile(none, provisioner);
    assert.equal(p.backend, "host-path", provisioner);
    assert.equal(withStoreDriver(p, false), p, "driver off: unchanged");
    const served = withStoreDriver(p, true);
    assert.equal(served.backend, "node-store", provisioner);
    assert.equal(served.provisioner, provisioner, "the profile key stays (prewarm policy)");
    assert.match(served.why ?? "", /store\.warmstart\.dev/);
    assert.equal(unshareable(served), undefined);
  }
  // Stores on shared or per-tree volumes keep their backend whether the driver is served or not.
  for (const provisioner of ["nfs.csi.k8s.io", "pd.csi.storage.gke.io", "ebs.csi.aws.com"]) {
    const p = resolveProfile(none, provisioner);
    assert.equal(withStoreDriver(p, true), p, provisioner);
  }
  // A profile naming node-store with no driver served would make volumes nothing mounts.
  const configured = parseProfiles({ [HOST_PATH_PROVISIONER]: "backend: node-store" });
  assert.deepEqual(configured.errors, []);
  const named = resolveProfile(configured.entries, HOST_PATH_PROVISIONER);
  assert.equal(named.backend, "node-store");
  assert.equal(withStoreDriver(named, true).backend, "node-store");
  assert.equal(withStoreDriver(named, false).backend, "host-path");
});

void test("node-store's recorded source is the full hash and the size: no node, no path", async () => {
  const profile = withStoreDriver(resolveProfile(none, HOST_PATH_PROVISIONER), true);
  const source = await publishSource({} as PromoteClients, {
    short,
    hash,
    store: { node: "gpu-0", dir: "/var/lib/warmstart/store" },
    storage: { provisioner: HOST_PATH_PROVISIONER },
    profile: { ...profile, mountOptions: ["noatime"] },
    tree: `/var/lib/warmstart/store/${short}`,
    sizeBytes: 1234,
  });
  assert.deepEqual(source, {
    backend: "node-store",
    provisioner: HOST_PATH_PROVISIONER,
    sizeBytes: 1234,
    storageClassName: "",
    mountOptions: [],
    volumeHandle: hash,
  });
  assert.deepEqual(
    sourceOf({ metadata: { annotations: { "warmstart.dev/source": encodeSource(source) } } }),
    source,
  );
});

void test("node-store: a read-only CSI PV of the driver, handle = full hash, no node affinity, pre-bound", () => {
  const pv = nodeStoreVolume(short, nodeStore, "team-a");
  const pvc = preBoundClaim(short, nodeStore, "team-a", pv);
  const labels = {
    [LABEL_HASH]: short,
    [LABEL_NAMESPACE]: "team-a",
    "app.kubernetes.io/managed-by": "warmstart",
  };
  assert.equal(pv.metadata?.name, `warmstart-${short}-team-a`, "named as the other backends' PVs");
  assert.deepEqual(pv.metadata?.labels, labels);
  assert.deepEqual(pvc.metadata?.labels, labels);
  assert.equal(pv.spec?.nodeAffinity, undefined, "a follower may run on any node");
  assert.equal(pv.spec?.mountOptions, undefined, "the driver mounts ro,nosuid,nodev itself");
  // Exactly this, nothing else (no nodeAffinity, no mountOptions).
  assert.deepEqual(pv.spec, {
    capacity: { storage: "6Mi" },
    accessModes: ["ReadOnlyMany"],
    volumeMode: "Filesystem",
    persistentVolumeReclaimPolicy: "Retain",
    storageClassName: "",
    csi: { driver: NODE_STORE_DRIVER, volumeHandle: hash, readOnly: true },
    claimRef: { apiVersion: "v1", kind: "PersistentVolumeClaim", namespace: "team-a", name: `rox-${short}` },
  });
  assert.equal(NODE_STORE_DRIVER, "store.warmstart.dev");
  assert.equal(pvc.metadata?.name, `rox-${short}`);
  assert.equal(pvc.spec?.volumeName, pv.metadata?.name);
  assert.equal(pvc.spec?.storageClassName, "");
  assert.deepEqual(pvc.spec?.accessModes, ["ReadOnlyMany"]);
  assert.equal(pvc.spec?.resources?.requests?.storage, "6Mi");
  // Even a recorded mount option stays off: the driver takes none.
  assert.equal(
    nodeStoreVolume(short, { ...nodeStore, mountOptions: ["ro"] }, "ns").spec?.mountOptions,
    undefined,
  );
  // The same source under host-path would pin the PV to a node: node-store never does.
  assert.throws(() => hostPathVolume(short, nodeStore, "ns"), /needs a node/);
});

void test("node-store refuses a handle that is not this cache's full hash", () => {
  for (const volumeHandle of [undefined, short, `${hash}0`, hash.toUpperCase(), "f".repeat(64), `../${hash}`])
    assert.throws(
      () =>
        nodeStoreVolume(
          short,
          { ...nodeStore, ...(volumeHandle ? { volumeHandle } : { volumeHandle: undefined }) },
          "ns",
        ),
      /full hash/,
      String(volumeHandle),
    );
});

void test("the webhook's view of a node-store cache: the volume is the tree, no subPath", async () => {
  assert.equal(treeSubPath(nodeStore), ".");
  assert.equal(treeSubPath({ ...nodeStore, subPath: short }), ".", "never a folder of the volume");
  const profiles = {
    resolve: (provisioner: string) => Promise.resolve(resolveProfile(none, provisioner)),
  } as unknown as StorageProfiles;
  const promotion = createPromotion({} as PromoteClients, profiles);
  const settings = await promotion.restoreProfile({
    metadata: { name: short, annotations: { "warmstart.dev/source": encodeSource(nodeStore) } },
    spec: { hash },
  });
  assert.deepEqual(settings, { prewarm: true, prewarmParallelism: 6, treePath: "." });
});

/** An API server in memory: PVs and claims, no snapshot kinds, no ModelCache. */
function fakeApi(): {
  clients: PromoteClients;
  pvs: Map<string, k8s.V1PersistentVolume>;
  claims: Map<string, k8s.V1PersistentVolumeClaim>;
} {
  const pvs = new Map<string, k8s.V1PersistentVolume>();
  const claims = new Map<string, k8s.V1PersistentVolumeClaim>();
  const notFound = (): Error => Object.assign(new Error("not found"), { code: 404 });
  const exists = (): Error => Object.assign(new Error("already exists"), { code: 409 });
  const selected = <T extends { metadata?: k8s.V1ObjectMeta }>(items: Iterable<T>, selector: string): T[] => {
    const [k, v] = selector.split("=");
    return [...items].filter((o) => o.metadata?.labels?.[k!] === v);
  };
  const core = {
    readNamespacedPersistentVolumeClaim: ({ name, namespace }: { name: string; namespace: string }) => {
      const c = claims.get(`${namespace}/${name}`);
      return c ? Promise.resolve(c) : Promise.reject(notFound());
    },
    createPersistentVolume: ({ body }: { body: k8s.V1PersistentVolume }) => {
      if (pvs.has(body.metadata!.name!)) return Promise.reject(exists());
      pvs.set(body.metadata!.name!, body);
      return Promise.resolve(body);
    },
    createNamespacedPersistentVolumeClaim: ({
      namespace,
      body,
    }: {
      namespace: string;
      body: k8s.V1PersistentVolumeClaim;
    }) => {
      const key = `${namespace}/${body.metadata!.name!}`;
      if (claims.has(key)) return Promise.reject(exists());
      claims.set(key, body);
      return Promise.resolve(body);
    },
    listPersistentVolumeClaimForAllNamespaces: ({ labelSelector }: { labelSelector: string }) =>
      Promise.resolve({ items: selected(claims.values(), labelSelector) }),
    listPersistentVolume: ({ labelSelector }: { labelSelector: string }) =>
      Promise.resolve({ items: selected(pvs.values(), labelSelector) }),
    deleteNamespacedPersistentVolumeClaim: ({ name, namespace }: { name: string; namespace: string }) =>
      claims.delete(`${namespace}/${name}`) ? Promise.resolve({}) : Promise.reject(notFound()),
    deletePersistentVolume: ({ name }: { name: string }) =>
      pvs.delete(name) ? Promise.resolve({}) : Promise.reject(notFound()),
  };
  const custom = {
    getClusterCustomObject: () => Promise.reject(notFound()),
    listClusterCustomObject: () => Promise.reject(notFound()),
  };
  return { clients: { core, custom } as unknown as PromoteClients, pvs, claims };
}

void test("node-store claims are ensured per namespace, and a cache delete finds and removes them", async () => {
  const { clients, pvs, claims } = fakeApi();
  assert.equal(await ensureClaim(clients, short, nodeStore, "team-a"), "created");
  assert.equal(await ensureClaim(clients, short, nodeStore, "team-b"), "created");
  assert.equal(await ensureClaim(clients, short, nodeStore, "team-a"), "exists", "create-only: converges");
  assert.deepEqual([...pvs.keys()].sort(), [`warmstart-${short}-team-a`, `warmstart-${short}-team-b`]);
  for (const pv of pvs.values()) {
    assert.equal(pv.spec?.csi?.driver, "store.warmstart.dev");
    assert.equal(pv.spec?.csi?.volumeHandle, hash, "every namespace's PV carries the same handle");
    assert.equal(pv.spec?.nodeAffinity, undefined);
  }
  assert.deepEqual([...claims.keys()].sort(), [`team-a/rox-${short}`, `team-b/rox-${short}`]);

  const report = await deleteCachePass(clients, hash, { retry: { attempts: 1, initialMs: 1, maxMs: 1 } });
  assert.deepEqual(
    report.items.map((i) => `${i.state} ${i.kind} ${i.namespace ? `${i.namespace}/` : ""}${i.name}`).sort(),
    [
      `deleted PersistentVolume warmstart-${short}-team-a`,
      `deleted PersistentVolume warmstart-${short}-team-b`,
      `deleted PersistentVolumeClaim team-a/rox-${short}`,
      `deleted PersistentVolumeClaim team-b/rox-${short}`,
    ],
  );
  assert.deepEqual(report.left, []);
  assert.equal(pvs.size + claims.size, 0);
});
