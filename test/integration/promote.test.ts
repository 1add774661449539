/**
 * Promote backends against the real API server: concurrent claim creation converges without a
 * single update, claims of WaitForFirstConsumer classes count while still Pending, snapshot-clone
 * waits for its snapshot and pre-provisions a content + snapshot pair per namespace, and storage
 * profiles come from the ConfigMap.
 */
import { test, before, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import * as k8s from "@kubernetes/client-node";
import { impersonating, impersonatingConfig, kube, tempNamespace, uniqueName, waitFor } from "../harness.js";
import { renderChart } from "../chart.js";
import { FaultProxy } from "../fault-proxy.js";
import { pauseRole } from "../roles.js";
import { readState } from "../../tools/localcluster/cluster.js";
import {
  ANN_CACHE_SOURCE,
  LABEL_HASH,
  LABEL_NAMESPACE,
  LABEL_SHARE_GROUP,
  MODELCACHE,
  SKIP,
  STORAGE_PROFILES_CONFIGMAP,
  claimName,
} from "../../src/core/contract.js";
import { SYSTEM_NAMESPACE, isAlreadyExists, isNotFound } from "../../src/common/kube.js";
import { createLogger } from "../../src/common/log.js";
import { PACKAGE_ROOT } from "../../tools/localcluster/versions.js";
import { ensureClaim, promoteClients, type CreatedObject } from "../../src/promote/claims.js";
import { removeCreated } from "../../src/promote/rollback.js";
import { cleanupCache, mcRef } from "../agents.js";
import {
  SNAPSHOT_GROUP,
  SNAPSHOT_VERSION,
  cloneClaim,
  hostPathVolume,
  nodeStoreVolume,
  perNamespaceName,
  preBoundClaim,
  sharedVolume,
  snapshotContentFor,
  snapshotFor,
  snapshotName,
  storeSnapshot,
} from "../../src/promote/objects.js";
import { ensureClaimsForStampedPods } from "../../src/promote/promote.js";
import { resolveProfile } from "../../src/promote/profiles.js";
import { describeStore, publishSource } from "../../src/promote/publish.js";
import { CacheSourceSchema, encodeSource, type CacheSource } from "../../src/promote/source.js";
import { treeVolumeClaim, treeVolumeName, treeWriterPod } from "../../src/promote/tree-volume.js";
import { promotion } from "../../src/promote/webhook.js";

const log = createLogger("promote-test", process.env.LOG_LEVEL ?? "warn");
const snap = { group: SNAPSHOT_GROUP, version: SNAPSHOT_VERSION };
const mergePatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);
const newShort = (): string => randomBytes(8).toString("hex");
const ignoreNotFound = (err: unknown): void => {
  if (!isNotFound(err)) throw err;
};

before(async () => {
  // The CSI snapshot CRDs, when the cluster has none (the local cluster has no snapshot controller).
  const { kc } = await kube();
  const client = k8s.KubernetesObjectApi.makeApiClient(kc);
  const file = join(PACKAGE_ROOT, "deploy/crds/testing/volumesnapshot-crds.yaml");
  // loadAllYaml maps wire names to the typed model: a plain object would lose x-kubernetes-* fields on create.
  for (const obj of k8s.loadAllYaml(await readFile(file, "utf8")) as k8s.KubernetesObject[]) {
    try {
      await client.create(obj);
    } catch (err) {
      if (!isAlreadyExists(err)) throw err;
    }
  }
  const { custom } = await kube();
  await waitFor("snapshot CRDs served", async () => {
    await custom.listClusterCustomObject({ ...snap, plural: "volumesnapshotcontents" });
    await custom.listClusterCustomObject({ ...snap, plural: "volumesnapshotclasses" });
    return true;
  });
});

/** Cluster-scoped objects of a short hash are removed after the test. */
function cleanup(t: { after: (fn: () => Promise<void>) => void }, short: string): void {
  t.after(async () => {
    const { core, custom } = await kube();
    const sel = `${LABEL_HASH}=${short}`;
    for (const pv of (await core.listPersistentVolume({ labelSelector: sel })).items) {
      await core.deletePersistentVolume({ name: pv.metadata!.name! }).catch(ignoreNotFound);
    }
    const contents = (await custom.listClusterCustomObject({
      ...snap,
      plural: "volumesnapshotcontents",
      labelSelector: sel,
    })) as {
      items: k8s.KubernetesObject[];
    };
    for (const c of contents.items) {
      await custom
        .deleteClusterCustomObject({ ...snap, plural: "volumesnapshotcontents", name: c.metadata!.name! })
        .catch(ignoreNotFound);
    }
  });
}

const hostPathSource = (short: string, sizeBytes = 12_345_678): CacheSource =>
  CacheSourceSchema.parse({
    backend: "host-path",
    provisioner: "warmstart.dev/host-path",
    sizeBytes,
    node: "gpu-0",
    path: `/var/lib/warmstart/store/${short}`,
    hostPathType: "local",
  });

const sharedSource = (short: string): CacheSource =>
  CacheSourceSchema.parse({
    backend: "shared-volume",
    provisioner: "nfs.csi.k8s.io",
    sizeBytes: 5_000,
    driver: "nfs.csi.k8s.io",
    volumeHandle: "nas#/exports",
    volumeAttributes: { server: "nas" },
    attributeTemplates: { subDir: "{path}" },
    handleTemplate: "{handle}#{path}#{namespace}",
    subPath: short,
  });

const snapshotSource = (storageClassName: string): CacheSource =>
  CacheSourceSchema.parse({
    backend: "snapshot-clone",
    provisioner: "example.csi.warmstart.dev",
    sizeBytes: 5_000,
    storageClassName,
    driver: "example.csi.warmstart.dev",
    snapshotHandle: "snap-0001",
    snapshotClass: "example-snapclass",
    restoreSize: "1Gi",
  });

for (const [backend, make] of [
  ["host-path", hostPathSource],
  ["shared-volume", sharedSource],
  ["snapshot-clone", () => snapshotSource("")],
] as const) {
  void test(`${backend}: three concurrent claim creations for one namespace converge on one claim, no error, no update`, async (t) => {
    const { kc, core, custom } = await kube();
    const proxy = await FaultProxy.start(kc);
    t.after(() => proxy.close());
    const ns = await tempNamespace(t, "cc");
    const short = newShort();
    cleanup(t, short);
    // Every create waits long enough that all three callers are past their existence check, and
    // any update of a PV, claim or snapshot object would be refused: convergence must not need one.
    proxy.inject({
      method: "POST",
      path: /\/(persistentvolumeclaims|persistentvolumes|volumesnapshots|volumesnapshotcontents)$/,
      delayMs: 300,
    });
    for (const method of ["PUT", "PATCH"]) {
      proxy.inject({
        method,
        path: /\/(persistentvolumeclaims|persistentvolumes|volumesnapshots|volumesnapshotcontents)\//,
        status: [500],
      });
    }
    const clients = promoteClients(proxy.kubeConfig());
    const source = make(short);
    const outcomes = await Promise.all([1, 2, 3].map(() => ensureClaim(clients, short, source, ns)));
    assert.deepEqual([...outcomes].sort(), ["created", "exists", "exists"]);
    assert.equal(
      proxy.seen("POST", new RegExp(`/namespaces/${ns}/persistentvolumeclaims$`)).length,
      3,
      "the three really raced",
    );
    assert.equal(
      proxy.requests.filter((r) => r.method === "PUT" || r.method === "PATCH").length,
      0,
      "nothing was ever updated",
    );

    const claims = await core.listNamespacedPersistentVolumeClaim({
      namespace: ns,
      labelSelector: `${LABEL_HASH}=${short}`,
    });
    assert.equal(claims.items.length, 1);
    const claim = claims.items[0]!;
    assert.equal(claim.metadata?.name, claimName(short));
    assert.equal(claim.metadata?.labels?.[LABEL_NAMESPACE], ns);
    assert.deepEqual(claim.spec?.accessModes, ["ReadOnlyMany"]);
    if (backend === "snapshot-clone") {
      assert.equal(claim.spec?.dataSource?.kind, "VolumeSnapshot");
      const contents = (await custom.listClusterCustomObject({
        ...snap,
        plural: "volumesnapshotcontents",
        labelSelector: `${LABEL_HASH}=${short}`,
      })) as { items: unknown[] };
      assert.equal(contents.items.length, 1);
      const snaps = (await custom.listNamespacedCustomObject({
        ...snap,
        plural: "volumesnapshots",
        namespace: ns,
      })) as { items: unknown[] };
      assert.equal(snaps.items.length, 1);
    } else {
      const pvs = await core.listPersistentVolume({ labelSelector: `${LABEL_HASH}=${short}` });
      assert.equal(pvs.items.length, 1);
      assert.equal(pvs.items[0]!.spec?.claimRef?.namespace, ns);
      assert.equal(claim.spec?.volumeName, pvs.items[0]!.metadata?.name);
      if (backend === "shared-volume")
        assert.equal(pvs.items[0]!.spec?.csi?.volumeHandle, `nas#/exports#${short}#${ns}`);
      // Up to one volume-controller resync (15 s) when its claim sync loses the race with the PV.
      await waitFor(
        "the pre-bound pair binds",
        async () => {
          const c = await core.readNamespacedPersistentVolumeClaim({ namespace: ns, name: claimName(short) });
          return c.status?.phase === "Bound";
        },
        45_000,
      );
    }
  });
}

/** A pod in `namespace` wearing the cache's label, as a forger (or a webhook that failed open) leaves it. */
async function stampedPod(namespace: string, short: string): Promise<void> {
  const { core } = await kube();
  const name = `stamped-${short}`;
  await core.createNamespacedPod({
    namespace,
    body: {
      metadata: { name, annotations: { [SKIP]: "true" } },
      spec: { containers: [{ name: "c", image: "busybox" }], schedulingGates: [{ name: "test/hold" }] },
    },
  });
  await core.patchNamespacedPod(
    { namespace, name, body: { metadata: { labels: { [LABEL_HASH]: short } } } },
    mergePatch,
  );
}

void test("a forged hash label in a namespace outside the cache's scope gets no claim (namespace and group scopes)", async (t) => {
  const { kc, core } = await kube();
  const owner = await tempNamespace(t, "scope-owner");
  const attacker = await tempNamespace(t, "scope-attacker");
  const mate = await tempNamespace(t, "scope-mate");
  const group = `g-${randomBytes(4).toString("hex")}`;
  for (const ns of [owner, mate])
    await core.patchNamespace(
      { name: ns, body: { metadata: { labels: { [LABEL_SHARE_GROUP]: group } } } },
      mergePatch,
    );
  for (const [scope, allowed] of [
    [`namespace:${owner}`, [owner]],
    [`group:${group}`, [mate, owner].sort()],
  ] as const) {
    const short = newShort();
    cleanup(t, short);
    for (const ns of [owner, attacker, mate]) await stampedPod(ns, short);
    const r = await ensureClaimsForStampedPods({
      clients: promoteClients(kc),
      short,
      scope,
      source: hostPathSource(short),
      log,
    });
    assert.equal(r.ok, true, JSON.stringify(r.results));
    assert.deepEqual(r.namespaces, allowed, scope);
    const claim = await core
      .readNamespacedPersistentVolumeClaim({ namespace: attacker, name: claimName(short) })
      .catch((err: unknown) => (ignoreNotFound(err), undefined));
    assert.equal(claim, undefined, `${scope}: no claim in the forger's namespace`);
  }
});

void test("snapshot-clone with a WaitForFirstConsumer class: a Pending claim counts, in every namespace with stamped pods", async (t) => {
  const { kc, core, custom } = await kube();
  const storage = kc.makeApiClient(k8s.StorageV1Api);
  const className = uniqueName("wffc");
  await storage.createStorageClass({
    body: {
      metadata: { name: className },
      provisioner: "example.csi.warmstart.dev",
      volumeBindingMode: "WaitForFirstConsumer",
    },
  });
  t.after(() => storage.deleteStorageClass({ name: className }).then(() => undefined, ignoreNotFound));
  const short = newShort();
  cleanup(t, short);
  const nsA = await tempNamespace(t, "wf-a");
  const nsB = await tempNamespace(t, "wf-b");
  const nsIdle = await tempNamespace(t, "wf-idle");
  // Pods stamped with the hash mark the namespaces that need the claim. The webhook removes a
  // stamp an author sets, so the test stamps them afterwards, as Warmstart would.
  for (const ns of [nsA, nsB]) {
    await core.createNamespacedPod({
      namespace: ns,
      body: {
        metadata: { name: "stamped", annotations: { [SKIP]: "true" } },
        spec: { containers: [{ name: "c", image: "busybox" }], schedulingGates: [{ name: "test/hold" }] },
      },
    });
    const p = await core.patchNamespacedPod(
      { namespace: ns, name: "stamped", body: { metadata: { labels: { [LABEL_HASH]: short } } } },
      mergePatch,
    );
    assert.equal(p.metadata?.labels?.[LABEL_HASH], short);
  }
  const r = await ensureClaimsForStampedPods({
    clients: promoteClients(kc),
    short,
    scope: "cluster",
    source: snapshotSource(className),
    log,
  });
  assert.equal(r.ok, true, JSON.stringify(r.results));
  assert.deepEqual(r.namespaces, [nsA, nsB].sort());
  for (const ns of [nsA, nsB]) {
    const claim = await core.readNamespacedPersistentVolumeClaim({ namespace: ns, name: claimName(short) });
    assert.equal(claim.status?.phase, "Pending", "not Bound, and that is fine");
    assert.equal(claim.spec?.storageClassName, className);
    assert.equal(claim.spec?.resources?.requests?.storage, "1Gi");
    const vs = (await custom.getNamespacedCustomObject({
      ...snap,
      plural: "volumesnapshots",
      namespace: ns,
      name: snapshotName(short),
    })) as {
      spec: { source: { volumeSnapshotContentName: string } };
    };
    assert.equal(vs.spec.source.volumeSnapshotContentName, perNamespaceName(short, ns));
    const vsc = (await custom.getClusterCustomObject({
      ...snap,
      plural: "volumesnapshotcontents",
      name: perNamespaceName(short, ns),
    })) as {
      spec: {
        volumeSnapshotRef: { namespace: string; name: string };
        source: { snapshotHandle: string };
        deletionPolicy: string;
      };
    };
    assert.deepEqual(vsc.spec.volumeSnapshotRef, { namespace: ns, name: snapshotName(short) });
    assert.equal(vsc.spec.source.snapshotHandle, "snap-0001");
    assert.equal(vsc.spec.deletionPolicy, "Retain");
  }
  await assert.rejects(
    core.readNamespacedPersistentVolumeClaim({ namespace: nsIdle, name: claimName(short) }),
    (e) => isNotFound(e),
  );
});

/**
 * A namespace for a snapshot-clone publish and a fresh Hyperdisk ML class (its profile is
 * snapshot-clone) for its trees' volumes.
 */
async function treeVolumeClass(t: TestContext, prefix: string): Promise<{ ns: string; className: string }> {
  const { kc } = await kube();
  const storage = kc.makeApiClient(k8s.StorageV1Api);
  const ns = await tempNamespace(t, prefix);
  const className = uniqueName("trees");
  await storage.createStorageClass({
    body: {
      metadata: { name: className },
      provisioner: "pd.csi.storage.gke.io",
      parameters: { type: "hyperdisk-ml" },
    },
  });
  t.after(() => storage.deleteStorageClass({ name: className }).then(() => undefined, ignoreNotFound));
  return { ns, className };
}

/**
 * Plays the kubelet for the tree volume's writer pod (held on a node that does not exist): it
 * appears with its claim, then ends as told. Returns the pod and claim as created.
 */
async function playWriter(
  ns: string,
  short: string,
  end: { phase: "Succeeded" | "Failed"; message?: string },
): Promise<{ pod: k8s.V1Pod; claim: k8s.V1PersistentVolumeClaim }> {
  const { core } = await kube();
  const name = treeVolumeName(short);
  const pod = await waitFor(`writer pod ${name}`, () =>
    core.readNamespacedPod({ namespace: ns, name }).catch(() => undefined),
  );
  const claim = await core.readNamespacedPersistentVolumeClaim({ namespace: ns, name });
  const terminated = {
    exitCode: end.phase === "Succeeded" ? 0 : 1,
    reason: end.phase === "Succeeded" ? "Completed" : "Error",
    message: end.message ?? "",
  };
  await core.patchNamespacedPodStatus(
    {
      namespace: ns,
      name,
      body: {
        status: {
          phase: end.phase,
          containerStatuses: [
            {
              name: "write",
              image: "warmstart:test",
              imageID: "",
              ready: false,
              restartCount: 0,
              state: { terminated },
            },
          ],
        },
      },
    },
    mergePatch,
  );
  return { pod, claim };
}

void test("snapshot-clone publish: the tree is written into a volume of its own, which is snapshotted once, and only that volume", async (t) => {
  // The test plays the snapshot controller and the kubelet: a real snapshot controller (the
  // local cluster's CSI stack, with real nodes) is held still meanwhile.
  if ((await readState())?.processes.some((p) => p.name === "snapshot-controller"))
    await pauseRole(t, "snapshot-controller");
  const { kc, core, custom } = await kube();
  const { ns, className } = await treeVolumeClass(t, "ss");
  const short = newShort();
  cleanup(t, short);
  const store = { node: "no-such-node", dir: "/var/lib/warmstart/store", treeVolumeClass: className };
  const described = await describeStore(kc, store);
  assert.equal(described.provisioner, "pd.csi.storage.gke.io", "the tree volumes' class picks the profile");
  assert.equal(described.volumeType, "hyperdisk-ml");
  const profile = resolveProfile(new Map(), described.provisioner, described.volumeType);
  assert.equal(profile.backend, "snapshot-clone");

  const hash = `${short}${"0".repeat(48)}`;
  const publishing = publishSource(promoteClients(kc), {
    short,
    hash,
    writer: { image: "warmstart:test", systemNamespace: ns },
    store,
    storage: described,
    profile: { ...profile, snapshotClass: "hdml" },
    tree: `/var/lib/warmstart/store/${short}`,
    sizeBytes: 1234,
    snapshotTimeoutMs: 20_000,
  });
  const { pod, claim } = await playWriter(ns, short, { phase: "Succeeded" });
  // The writer copies this one tree, read-only, into the volume, on the node that holds it.
  const write = pod.spec!.containers[0]!;
  assert.deepEqual(write.command, ["warmstart", "capture", "/tree", "/volume/tree", "--hash", hash]);
  const hostPath = pod.spec?.volumes?.find((v) => v.name === "tree")?.hostPath;
  assert.equal(hostPath?.path, `/var/lib/warmstart/store/${short}`);
  assert.equal(hostPath?.type, "Directory");
  assert.equal(write.volumeMounts?.find((m) => m.name === "tree")?.readOnly, true);
  assert.equal(pod.spec?.nodeSelector?.["kubernetes.io/hostname"], "no-such-node");
  assert.equal(claim.spec?.storageClassName, className);
  assert.deepEqual(claim.spec?.accessModes, ["ReadWriteOnce"]);
  // Play the snapshot controller: the snapshot appears, then is bound to a content and ready.
  const vs = await waitFor(
    "the tree volume's snapshot",
    async () =>
      (await custom.getNamespacedCustomObject({
        ...snap,
        plural: "volumesnapshots",
        namespace: ns,
        name: snapshotName(short),
      })) as {
        spec: { source: { persistentVolumeClaimName: string }; volumeSnapshotClassName: string };
      },
  );
  assert.deepEqual(vs.spec.source, { persistentVolumeClaimName: treeVolumeName(short) });
  assert.equal(vs.spec.volumeSnapshotClassName, "hdml");
  const contentName = `snapcontent-${short}`;
  await custom.createClusterCustomObject({
    ...snap,
    plural: "volumesnapshotcontents",
    body: {
      apiVersion: `${SNAPSHOT_GROUP}/${SNAPSHOT_VERSION}`,
      kind: "VolumeSnapshotContent",
      metadata: { name: contentName, labels: { [LABEL_HASH]: short } },
      spec: {
        deletionPolicy: "Delete",
        driver: "pd.csi.storage.gke.io",
        source: { volumeHandle: "disk-1" },
        volumeSnapshotRef: { namespace: ns, name: snapshotName(short) },
      },
    },
  });
  await custom.patchClusterCustomObjectStatus(
    {
      ...snap,
      plural: "volumesnapshotcontents",
      name: contentName,
      body: { status: { snapshotHandle: "projects/p/global/snapshots/s-42", readyToUse: true } },
    },
    mergePatch,
  );
  await custom.patchNamespacedCustomObjectStatus(
    {
      ...snap,
      plural: "volumesnapshots",
      namespace: ns,
      name: snapshotName(short),
      body: {
        status: { boundVolumeSnapshotContentName: contentName, readyToUse: true, restoreSize: "100Gi" },
      },
    },
    mergePatch,
  );
  const source = await publishing;
  assert.equal(source.backend, "snapshot-clone");
  assert.equal(source.driver, "pd.csi.storage.gke.io");
  assert.equal(source.snapshotHandle, "projects/p/global/snapshots/s-42");
  assert.equal(source.restoreSize, "100Gi");
  assert.equal(source.volumeType, "hyperdisk-ml");
  assert.equal(source.subPath, "tree", "where the tree sits inside its volume");
  // The writer and its volume are gone: the snapshot holds the tree.
  await assert.rejects(core.readNamespacedPod({ namespace: ns, name: treeVolumeName(short) }), isNotFound);
  await waitFor("the writer's claim removed", () =>
    core.readNamespacedPersistentVolumeClaim({ namespace: ns, name: treeVolumeName(short) }).then(
      (c) => Boolean(c.metadata?.deletionTimestamp),
      (err: unknown) => isNotFound(err),
    ),
  );
});

void test("snapshot-clone publish: a writer that fails, or a snapshot that fails or never becomes ready, is removed with its volume, so the next election starts afresh", async (t) => {
  if ((await readState())?.processes.some((p) => p.name === "snapshot-controller"))
    await pauseRole(t, "snapshot-controller");
  const { kc, core, custom } = await kube();
  const { ns, className } = await treeVolumeClass(t, "ss-stuck");
  const store = { node: "no-such-node", dir: "/var/lib/warmstart/store", treeVolumeClass: className };
  const described = await describeStore(kc, store);
  const profile = {
    ...resolveProfile(new Map(), described.provisioner, described.volumeType),
    snapshotClass: "hdml",
  };
  const read = (short: string): Promise<unknown> =>
    custom
      .getNamespacedCustomObject({
        ...snap,
        plural: "volumesnapshots",
        namespace: ns,
        name: snapshotName(short),
      })
      .catch((err: unknown) => (ignoreNotFound(err), undefined));
  const volumeLeft = (short: string): Promise<boolean> =>
    core.readNamespacedPersistentVolumeClaim({ namespace: ns, name: treeVolumeName(short) }).then(
      (c) => !c.metadata?.deletionTimestamp,
      () => false,
    );
  const publish = (short: string, snapshotTimeoutMs = 1_500): Promise<unknown> =>
    publishSource(promoteClients(kc), {
      short,
      hash: `${short}${"0".repeat(48)}`,
      writer: { image: "warmstart:test", systemNamespace: ns },
      store,
      storage: described,
      profile,
      tree: `/var/lib/warmstart/store/${short}`,
      sizeBytes: 1,
      snapshotTimeoutMs,
    });
  // The writer fails: its reason is the promote's, and nothing is left.
  const broken = newShort();
  cleanup(t, broken);
  const writing = publish(broken, 20_000);
  await playWriter(ns, broken, { phase: "Failed", message: "capture failed: no space left on device" });
  await assert.rejects(
    writing,
    /writing the tree into its volume .* failed \(Error\): capture failed: no space left/,
  );
  assert.equal(await volumeLeft(broken), false, "the half-written volume is removed");
  assert.equal(await read(broken), undefined, "nothing was snapshotted");
  // Never ready: nothing plays the snapshot controller.
  const stuck = newShort();
  cleanup(t, stuck);
  const stuckPublish = publish(stuck);
  await playWriter(ns, stuck, { phase: "Succeeded" });
  await assert.rejects(stuckPublish, /not ready after 2s; the snapshot was removed/);
  assert.equal(await read(stuck), undefined, "not left for the next election to wait on");
  assert.equal(await volumeLeft(stuck), false);
  // Failed: the controller says so.
  const failed = newShort();
  cleanup(t, failed);
  const publishing = publish(failed, 20_000);
  await playWriter(ns, failed, { phase: "Succeeded" });
  await waitFor("the snapshot", () => read(failed));
  await custom.patchNamespacedCustomObjectStatus(
    {
      ...snap,
      plural: "volumesnapshots",
      namespace: ns,
      name: snapshotName(failed),
      body: { status: { readyToUse: false, error: { message: "quota exceeded" } } },
    },
    mergePatch,
  );
  await assert.rejects(publishing, /failed: quota exceeded; the snapshot was removed/);
  assert.equal(await read(failed), undefined);
});

void test("snapshot-clone publish: a tree volume left by an earlier try and still being removed is waited out, and a writer whose claim goes fails at once", async (t) => {
  if ((await readState())?.processes.some((p) => p.name === "snapshot-controller"))
    await pauseRole(t, "snapshot-controller");
  const { kc, core } = await kube();
  const { ns, className } = await treeVolumeClass(t, "ss-again");
  const store = { node: "no-such-node", dir: "/var/lib/warmstart/store", treeVolumeClass: className };
  const described = await describeStore(kc, store);
  const profile = {
    ...resolveProfile(new Map(), described.provisioner, described.volumeType),
    snapshotClass: "hdml",
  };
  const input = (short: string): Parameters<typeof publishSource>[1] => ({
    short,
    hash: `${short}${"0".repeat(48)}`,
    writer: { image: "warmstart:test", systemNamespace: ns, timeoutMs: 20_000 },
    store,
    storage: described,
    profile,
    tree: `/var/lib/warmstart/store/${short}`,
    sizeBytes: 1,
    snapshotTimeoutMs: 1_500,
  });
  const HOLD = "warmstart.test/hold";
  const release = (name: string): Promise<unknown> =>
    core
      .patchNamespacedPersistentVolumeClaim(
        { namespace: ns, name, body: { metadata: { finalizers: null } } },
        mergePatch,
      )
      .catch(ignoreNotFound);

  // The previous try's claim, still held by a finalizer after its delete (a failed snapshot's,
  // which the promote that failed removed just before it was retried).
  const short = newShort();
  cleanup(t, short);
  const name = treeVolumeName(short);
  const old = treeVolumeClaim({
    ...input(short),
    systemNamespace: ns,
    storageClass: className,
    node: "no-such-node",
    tree: "/x",
    image: "warmstart:test",
    timeoutMs: 1,
  });
  old.metadata!.finalizers = [HOLD];
  const oldUid = (await core.createNamespacedPersistentVolumeClaim({ namespace: ns, body: old })).metadata!
    .uid;
  t.after(() => release(name));
  await core.deleteNamespacedPersistentVolumeClaim({ namespace: ns, name });
  const publishing = publishSource(promoteClients(kc), input(short));
  publishing.catch(() => undefined);
  await sleep(2_500);
  // Taking the going claim as its own would leave the writer pending for good once it is gone.
  await assert.rejects(core.readNamespacedPod({ namespace: ns, name }), isNotFound);
  await release(name);
  const { claim } = await playWriter(ns, short, { phase: "Succeeded" });
  assert.notEqual(claim.metadata?.uid, oldUid, "a claim of its own");
  assert.equal(claim.metadata?.deletionTimestamp, undefined);
  await assert.rejects(publishing, /not ready after 2s/);

  // A claim removed under a writer that has not run: the promote fails now, not at its deadline.
  const gone = newShort();
  cleanup(t, gone);
  const writing = publishSource(promoteClients(kc), input(gone));
  writing.catch(() => undefined);
  await waitFor("the writer pod", () =>
    core.readNamespacedPod({ namespace: ns, name: treeVolumeName(gone) }).catch(() => undefined),
  );
  const t0 = Date.now();
  await core.deleteNamespacedPersistentVolumeClaim({ namespace: ns, name: treeVolumeName(gone) });
  await assert.rejects(writing, /claim .* was removed before its writer ran/);
  assert.ok(Date.now() - t0 < 10_000, "at once, not after the capture deadline");
  await assert.rejects(core.readNamespacedPod({ namespace: ns, name: treeVolumeName(gone) }), isNotFound);
});

void test("the webhook's view: restore settings from the storage-profile ConfigMap, and a claim from the recorded source", async (t) => {
  const { kc, core } = await kube();
  const provisioner = `${uniqueName("nas")}.example.com`;
  // Add one key to the shared ConfigMap (creating it if needed) and take it out again afterwards.
  const body = {
    metadata: { name: STORAGE_PROFILES_CONFIGMAP },
    data: { [provisioner]: "backend: host-path\nprewarm: false\nprewarmParallelism: 3\n" },
  };
  try {
    await core.createNamespacedConfigMap({ namespace: SYSTEM_NAMESPACE, body });
  } catch (err) {
    if (!isAlreadyExists(err)) throw err;
    await core.patchNamespacedConfigMap(
      { namespace: SYSTEM_NAMESPACE, name: STORAGE_PROFILES_CONFIGMAP, body },
      mergePatch,
    );
  }
  t.after(async () => {
    await core
      .patchNamespacedConfigMap(
        {
          namespace: SYSTEM_NAMESPACE,
          name: STORAGE_PROFILES_CONFIGMAP,
          body: { data: { [provisioner]: null } },
        },
        mergePatch,
      )
      .catch(ignoreNotFound);
  });
  const short = newShort();
  cleanup(t, short);
  const hash = `${short}${"0".repeat(48)}`;
  const source = { ...hostPathSource(short), provisioner };
  const cache = {
    metadata: { name: short, annotations: { [ANN_CACHE_SOURCE]: encodeSource(source) } },
    spec: { hash },
  };
  const p = promotion(kc, SYSTEM_NAMESPACE, log);
  // A host-path volume is the tree itself: restores mount its root (".").
  assert.deepEqual(await p.restoreProfile(cache), { prewarm: false, prewarmParallelism: 3, treePath: "." });
  assert.deepEqual(
    await p.restoreProfile({
      metadata: {
        annotations: {
          [ANN_CACHE_SOURCE]: encodeSource({ ...source, backend: "snapshot-clone", subPath: short }),
        },
      },
      spec: { hash },
    }),
    { prewarm: false, prewarmParallelism: 3, treePath: short },
    "a volume that holds the tree in a folder: restores mount that folder",
  );
  assert.deepEqual(
    await p.restoreProfile({ metadata: {}, spec: { hash } }),
    { prewarm: true, prewarmParallelism: 6, treePath: "." },
    "no source: defaults",
  );
  const ns = await tempNamespace(t, "wh");
  assert.equal(await p.ensureClaim(cache, ns), "created");
  assert.equal(await p.ensureClaim(cache, ns), "exists");
  // A cache with no recorded source: an existing claim is accepted, a missing one cannot be made.
  assert.equal(await p.ensureClaim({ metadata: {}, spec: { hash } }, ns), "exists");
  const elsewhere = await tempNamespace(t, "wh2");
  await assert.rejects(
    p.ensureClaim({ metadata: {}, spec: { hash } }, elsewhere),
    /records no promoted source/,
  );
});

test("the webhook's and node agent's volume objects are held to a cache's read-only volumes: no writable or stray volume with their tokens", async (t) => {
  const { kc, admission } = await kube();
  const rbac = kc.makeApiClient(k8s.RbacAuthorizationV1Api);
  const ns = await tempNamespace(t, "volume-vap");
  // This test's copy. It matches only the chart's service accounts, which nothing else in the
  // local cluster runs as, so it cannot refuse another test's volumes.
  const name = `volume-objects-${ns}`;
  // Rendered for a store whose drivers are the test sources' (shared-volume's and snapshot-clone's).
  const objs = await renderChart(
    { "nodeAgent.store.csiDrivers": ["nfs.csi.k8s.io", "example.csi.warmstart.dev"] },
    { namespace: SYSTEM_NAMESPACE },
  );
  const policy = objs.find(
    (x) => x.kind === "ValidatingAdmissionPolicy" && x.metadata?.name?.endsWith("-volume-objects"),
  ) as k8s.V1ValidatingAdmissionPolicy;
  await admission.createValidatingAdmissionPolicy({ body: { ...policy, metadata: { name } } });
  t.after(() => admission.deleteValidatingAdmissionPolicy({ name }).then(() => undefined));
  await admission.createValidatingAdmissionPolicyBinding({
    body: { metadata: { name }, spec: { policyName: name, validationActions: ["Deny"] } },
  });
  t.after(() => admission.deleteValidatingAdmissionPolicyBinding({ name }).then(() => undefined));
  // RBAC lets the node agent's account create volumes, claims and snapshot objects (as the chart grants).
  const nodeAgent = `system:serviceaccount:${SYSTEM_NAMESPACE}:warmstart-node-agent`;
  await rbac.createClusterRole({
    body: {
      metadata: { name },
      rules: [
        {
          apiGroups: [""],
          resources: ["persistentvolumes", "persistentvolumeclaims", "pods"],
          verbs: ["create", "delete"],
        },
        {
          apiGroups: [SNAPSHOT_GROUP],
          resources: ["volumesnapshots", "volumesnapshotcontents"],
          verbs: ["create"],
        },
      ],
    },
  });
  t.after(() => rbac.deleteClusterRole({ name }).then(() => undefined));
  await rbac.createClusterRoleBinding({
    body: {
      metadata: { name },
      roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "ClusterRole", name },
      subjects: [{ kind: "User", apiGroup: "rbac.authorization.k8s.io", name: nodeAgent }],
    },
  });
  t.after(() => rbac.deleteClusterRoleBinding({ name }).then(() => undefined));
  const as = impersonating(kc, nodeAgent);
  const asCustom = impersonatingConfig(kc, nodeAgent).makeApiClient(k8s.CustomObjectsApi);
  const createVolume = (body: k8s.V1PersistentVolume): Promise<unknown> =>
    as.createPersistentVolume({ body, dryRun: "All" });
  const short = randomBytes(8).toString("hex");
  const hostPv = hostPathVolume(short, hostPathSource(short, 5_000), ns);
  const escape = (path: string): k8s.V1PersistentVolume => ({
    ...hostPv,
    spec: { ...hostPv.spec, local: { path } },
  });
  // The policy reaches the admission chain a moment after it is created: probe with dry runs.
  await waitFor("the policy to refuse a volume of the node's root", async () => {
    try {
      await createVolume(escape("/"));
      return false;
    } catch (err) {
      return /tree of the node's store/.test((err as { body?: string }).body ?? String(err));
    }
  });
  // What the code creates: allowed.
  await createVolume(hostPv);
  const sharedPv = sharedVolume(short, sharedSource(short), ns);
  await createVolume(sharedPv);
  await as.createNamespacedPersistentVolumeClaim({
    namespace: ns,
    body: preBoundClaim(short, sharedSource(short), ns, sharedPv),
    dryRun: "All",
  });
  const storeDriverPv = nodeStoreVolume(
    short,
    CacheSourceSchema.parse({
      backend: "node-store",
      provisioner: "store.warmstart.dev",
      sizeBytes: 5_000,
      volumeHandle: `${short}${randomBytes(24).toString("hex")}`,
    }),
    ns,
  );
  await createVolume(storeDriverPv);
  await createVolume(
    hostPathVolume(short, { ...hostPathSource(short, 5_000), hostPathType: "hostPath" }, ns),
  );
  // snapshot-clone: the tree volume's snapshot, then per namespace a content, its snapshot and the clone.
  const cloned = snapshotSource("");
  const createSnapshotObject = (
    plural: string,
    body: { metadata?: k8s.V1ObjectMeta; spec?: unknown },
  ): Promise<unknown> =>
    body.metadata?.namespace
      ? asCustom.createNamespacedCustomObject({
          ...snap,
          plural,
          namespace: body.metadata.namespace,
          body,
          dryRun: "All",
        })
      : asCustom.createClusterCustomObject({ ...snap, plural, body, dryRun: "All" });
  const content = snapshotContentFor(short, cloned, ns);
  const snapshot = snapshotFor(short, cloned, ns);
  await createSnapshotObject(
    "volumesnapshots",
    storeSnapshot(short, { namespace: SYSTEM_NAMESPACE, name: treeVolumeName(short) }, "trees"),
  );
  await createSnapshotObject("volumesnapshotcontents", content);
  await createSnapshotObject("volumesnapshots", snapshot);
  await as.createNamespacedPersistentVolumeClaim({
    namespace: ns,
    body: cloneClaim(short, cloned, ns),
    dryRun: "All",
  });
  // A stolen token's widenings (each a PV the volume controllers would act on): refused.
  const victimHandle = "fs-0a1b2c3d::";
  const withCsi = (pv: k8s.V1PersistentVolume, csi: Partial<k8s.V1CSIPersistentVolumeSource>) => ({
    ...pv,
    spec: { ...pv.spec, csi: { ...pv.spec!.csi!, ...csi } },
  });
  const withClaimRef = (ref: Partial<k8s.V1ObjectReference>): k8s.V1PersistentVolume => ({
    ...hostPv,
    spec: { ...hostPv.spec, claimRef: { ...hostPv.spec!.claimRef, ...ref } },
  });
  const annotated = (annotations: Record<string, string>): k8s.V1PersistentVolume => ({
    ...hostPv,
    metadata: { ...hostPv.metadata, annotations },
  });
  const roxClaim = preBoundClaim(short, sharedSource(short), ns, sharedPv);
  const createClaim = (body: k8s.V1PersistentVolumeClaim): Promise<unknown> =>
    as.createNamespacedPersistentVolumeClaim({ namespace: ns, body, dryRun: "All" });
  const attacks: Array<[string, () => Promise<unknown>, RegExp]> = [
    [
      "another CSI driver's volume under a victim's handle, pre-bound into a namespace of the thief's",
      () => createVolume(withCsi(sharedPv, { driver: "efs.csi.aws.com", volumeHandle: victimHandle })),
      /the store driver's or one of the store's drivers/,
    ],
    [
      "the store's driver under a victim's handle",
      () => createVolume(withCsi(sharedPv, { volumeHandle: victimHandle })),
      /names the cache's tree in its handle/,
    ],
    [
      "a victim's handle that merely contains the cache's short",
      () => createVolume(withCsi(sharedPv, { volumeHandle: `vol-${short}9` })),
      /names the cache's tree in its handle/,
    ],
    [
      "reclaim policy Delete (releasing it would delete what its handle names)",
      () =>
        createVolume({ ...sharedPv, spec: { ...sharedPv.spec, persistentVolumeReclaimPolicy: "Delete" } }),
      /is Retain/,
    ],
    [
      "reclaim policy Recycle",
      () => createVolume({ ...hostPv, spec: { ...hostPv.spec, persistentVolumeReclaimPolicy: "Recycle" } }),
      /is Retain/,
    ],
    [
      "a provisioner's annotation (it would own and delete the volume)",
      () => createVolume(annotated({ "pv.kubernetes.io/provisioned-by": "efs.csi.aws.com" })),
      /carry no annotation/,
    ],
    [
      "the binder's annotation",
      () => createVolume(annotated({ "pv.kubernetes.io/bound-by-controller": "yes" })),
      /carry no annotation/,
    ],
    [
      "a claimRef with a uid",
      () => createVolume(withClaimRef({ uid: "2b1f0c52-1c53-4a5e-9d1e-3f2b8a0c9d11" })),
      /by namespace and name only/,
    ],
    [
      "a claimRef with a resourceVersion",
      () => createVolume(withClaimRef({ resourceVersion: "1" })),
      /by namespace and name only/,
    ],
    [
      "a claimRef of another kind",
      () => createVolume(withClaimRef({ kind: "Pod" })),
      /by namespace and name only/,
    ],
    [
      "a CSI volume that names a secret for its driver to use",
      () =>
        createVolume(withCsi(sharedPv, { nodePublishSecretRef: { namespace: "default", name: "creds" } })),
      /names no secret/,
    ],
    [
      "the store driver's volume with attributes",
      () => createVolume(withCsi(storeDriverPv, { volumeAttributes: { store: "/" } })),
      /the store driver's no attribute/,
    ],
    [
      "a block volume",
      () => createVolume({ ...sharedPv, spec: { ...sharedPv.spec, volumeMode: "Block" } }),
      /is Retain, Filesystem/,
    ],
    [
      "a claim pre-bound to a volume not its cache's",
      () => createClaim({ ...roxClaim, spec: { ...roxClaim.spec, volumeName: `victim-${ns}` } }),
      /bound to its cache's volume or cloned from its cache's snapshot/,
    ],
    [
      "a claim cloned from another snapshot",
      () =>
        createClaim({
          ...cloneClaim(short, cloned, ns),
          spec: {
            ...cloneClaim(short, cloned, ns).spec,
            dataSource: { apiGroup: SNAPSHOT_GROUP, kind: "VolumeSnapshot", name: "backup" },
          },
        }),
      /bound to its cache's volume or cloned from its cache's snapshot/,
    ],
    [
      "an annotated claim",
      () =>
        createClaim({
          ...roxClaim,
          metadata: { ...roxClaim.metadata, annotations: { "pv.kubernetes.io/bind-completed": "yes" } },
        }),
      /carry no annotation/,
    ],
    [
      "a snapshot content that deletes the snapshot its handle names",
      () =>
        createSnapshotObject("volumesnapshotcontents", {
          ...content,
          spec: { ...content.spec, deletionPolicy: "Delete" },
        }),
      /a cache's snapshot content is Retain/,
    ],
    [
      "a snapshot content that snapshots a victim's volume",
      () =>
        createSnapshotObject("volumesnapshotcontents", {
          ...content,
          spec: { ...content.spec, source: { volumeHandle: victimHandle } },
        }),
      /a cache's snapshot content is Retain/,
    ],
    [
      "a snapshot content of another driver",
      () =>
        createSnapshotObject("volumesnapshotcontents", {
          ...content,
          spec: { ...content.spec, driver: "ebs.csi.aws.com" },
        }),
      /the store's drivers/,
    ],
    [
      "a snapshot content with the snapshotter's secret annotations",
      () =>
        createSnapshotObject("volumesnapshotcontents", {
          ...content,
          metadata: {
            ...content.metadata,
            annotations: {
              "snapshot.storage.kubernetes.io/deletion-secret-name": "creds",
              "snapshot.storage.kubernetes.io/deletion-secret-namespace": "default",
            },
          },
        }),
      /carry no annotation/,
    ],
    [
      "a snapshot of another claim",
      () =>
        createSnapshotObject("volumesnapshots", {
          ...snapshot,
          spec: { source: { persistentVolumeClaimName: "data" } },
        }),
      /a cache's snapshot is its tree volume's .* or its namespace's content's/,
    ],
  ];
  {
    // Each attack on its own, so that one accepted does not hide the others.
    const wrong: string[] = [];
    for (const [what, attempt, why] of attacks) {
      const got = await attempt().then(
        () => "accepted",
        (err: unknown) => (err as { body?: string }).body ?? String(err),
      );
      if (!why.test(got)) wrong.push(`${what}: ${got.slice(0, 300)}`);
    }
    assert.deepEqual(wrong, []);
  }
  // Anything else: refused.
  const refused: Array<[string, () => Promise<unknown>, RegExp]> = [
    [
      "a hostPath volume of the kubelet's pods",
      () =>
        createVolume({
          ...hostPv,
          spec: { ...hostPv.spec, local: undefined, hostPath: { path: "/var/lib/kubelet/pods" } },
        }),
      /tree of the node's store/,
    ],
    [
      "a folder beside the store",
      () => createVolume(escape("/var/lib/warmstart/store-other/x")),
      /tree of the node's store/,
    ],
    [
      "another cache's tree",
      () => createVolume(escape(`/var/lib/warmstart/store/${randomBytes(8).toString("hex")}`)),
      /tree of the node's store/,
    ],
    ["the whole store", () => createVolume(escape("/var/lib/warmstart/store/.")), /tree of the node's store/],
    [
      "the cache's tree mounted read-write (a root pod could write it)",
      () => createVolume({ ...hostPv, spec: { ...hostPv.spec, mountOptions: [] } }),
      /mounted ro/,
    ],
    [
      "a CSI volume mounted read-write",
      () => createVolume({ ...sharedPv, spec: { ...sharedPv.spec, mountOptions: undefined } }),
      /read-only CSI volume mounted ro/,
    ],
    [
      "the store driver's volume of another cache",
      () =>
        createVolume({
          ...storeDriverPv,
          spec: {
            ...storeDriverPv.spec,
            csi: { ...storeDriverPv.spec!.csi!, volumeHandle: randomBytes(32).toString("hex") },
          },
        }),
      /the store driver's handle is the cache's hash/,
    ],
    [
      "a writable CSI volume",
      () =>
        createVolume({
          ...sharedPv,
          spec: { ...sharedPv.spec, csi: { ...sharedPv.spec!.csi!, readOnly: false } },
        }),
      /read-only CSI volume/,
    ],
    [
      "a writable access mode",
      () => createVolume({ ...hostPv, spec: { ...hostPv.spec, accessModes: ["ReadWriteMany"] } }),
      /is ReadOnlyMany/,
    ],
    [
      "a volume bound to another claim",
      () => createVolume({ ...hostPv, spec: { ...hostPv.spec, claimRef: { namespace: ns, name: "data" } } }),
      /pre-bound to that namespace's rox-/,
    ],
    [
      "a volume without Warmstart's labels",
      () => createVolume({ ...hostPv, metadata: { name: hostPv.metadata!.name } }),
      /carry the managed-by, hash and namespace labels/,
    ],
    [
      "a claim labelled for another namespace",
      () =>
        as.createNamespacedPersistentVolumeClaim({
          namespace: "default",
          body: {
            ...preBoundClaim(short, sharedSource(short), ns, sharedPv),
            metadata: {
              ...preBoundClaim(short, sharedSource(short), ns, sharedPv).metadata,
              namespace: "default",
            },
          },
          dryRun: "All",
        }),
      /ReadOnlyMany, in the namespace it is labelled for/,
    ],
  ];
  for (const [what, attempt, why] of refused) await assert.rejects(attempt(), why, what);

  // Deleting: Warmstart's own objects only (RBAC grants delete on every volume and claim).
  const { core } = await kube();
  const victim = await core.createPersistentVolume({
    body: {
      metadata: { name: `victim-${ns}` },
      spec: {
        capacity: { storage: "1Gi" },
        accessModes: ["ReadWriteOnce"],
        hostPath: { path: "/var/lib/data" },
        persistentVolumeReclaimPolicy: "Retain",
      },
    },
  });
  t.after(() => core.deletePersistentVolume({ name: victim.metadata!.name! }).then(() => undefined));
  const victimClaim = await core.createNamespacedPersistentVolumeClaim({
    namespace: ns,
    body: {
      metadata: { name: "data" },
      spec: { accessModes: ["ReadWriteOnce"], resources: { requests: { storage: "1Gi" } } },
    },
  });
  await assert.rejects(
    as.deletePersistentVolume({ name: victim.metadata!.name!, dryRun: "All" }),
    /carry the managed-by, hash and namespace labels/,
    "another team's volume",
  );
  await assert.rejects(
    as.deleteNamespacedPersistentVolumeClaim({
      namespace: ns,
      name: victimClaim.metadata!.name!,
      dryRun: "All",
    }),
    /carry the managed-by, hash and namespace labels/,
    "another team's claim",
  );
  const ours = await core.createPersistentVolume({ body: hostPv });
  t.after(() =>
    core
      .deletePersistentVolume({ name: ours.metadata!.name! })
      .then(() => undefined)
      .catch(() => undefined),
  );
  await as.deletePersistentVolume({ name: ours.metadata!.name!, dryRun: "All" });

  // snapshot-clone: the tree's own volume and its writer, in the system namespace, with the
  // chart's image; nothing else runs with the node agent's token.
  const image = (objs.find((o) => o.kind === "DaemonSet") as k8s.V1DaemonSet).spec!.template.spec!
    .containers[0]!.image!;
  const writing = {
    short,
    hash: `${short}${"0".repeat(48)}`,
    systemNamespace: SYSTEM_NAMESPACE,
    storageClass: "trees",
    node: "gpu-0",
    tree: `/var/lib/warmstart/store/${short}`,
    sizeBytes: 1,
    image,
    timeoutMs: 60_000,
  };
  const createPod = (body: k8s.V1Pod): Promise<unknown> =>
    as.createNamespacedPod({ namespace: SYSTEM_NAMESPACE, body, dryRun: "All" });
  await as.createNamespacedPersistentVolumeClaim({
    namespace: SYSTEM_NAMESPACE,
    body: treeVolumeClaim(writing),
    dryRun: "All",
  });
  await createPod(treeWriterPod(writing));
  const writer = treeWriterPod(writing);
  const container = writer.spec!.containers[0]!;
  const pods: Array<[string, k8s.V1Pod]> = [
    ["another image", treeWriterPod({ ...writing, image: "evil:1" })],
    ["a tree outside the store", treeWriterPod({ ...writing, tree: "/" })],
    [
      "another cache's tree",
      treeWriterPod({ ...writing, tree: `/var/lib/warmstart/store/${randomBytes(8).toString("hex")}` }),
    ],
    [
      "another command",
      { ...writer, spec: { ...writer.spec!, containers: [{ ...container, command: ["sh", "-c", "id"] }] } },
    ],
    [
      "a privileged writer",
      {
        ...writer,
        spec: {
          ...writer.spec!,
          containers: [{ ...container, securityContext: { privileged: true } }],
        },
      },
    ],
    ["in a workload namespace", { ...writer, metadata: { ...writer.metadata, namespace: ns } }],
  ];
  for (const [what, body] of pods)
    await assert.rejects(
      body.metadata?.namespace === ns
        ? as.createNamespacedPod({ namespace: ns, body, dryRun: "All" })
        : createPod(body),
      /only pod is a tree's writer/,
      what,
    );
});

void test("a store claim that attaches to one node (ReadWriteOnce) is refused with the way out: every node's agent mounts the store", async (t) => {
  const { kc, core } = await kube();
  const ns = await tempNamespace(t, "rwo-store");
  for (const [name, mode] of [
    ["rwo", "ReadWriteOnce"],
    ["rwx", "ReadWriteMany"],
  ] as const)
    await core.createNamespacedPersistentVolumeClaim({
      namespace: ns,
      body: {
        metadata: { name },
        spec: { accessModes: [mode], storageClassName: "", resources: { requests: { storage: "1Gi" } } },
      },
    });
  const store = (name: string) => ({ node: "gpu-0", dir: "/store", claim: { namespace: ns, name } });
  await assert.rejects(
    describeStore(kc, store("rwo")),
    /store claim .*\/rwo is ReadWriteOnce: every node's agent mounts it, so it must be ReadWriteMany .*--tree-volume-class/,
  );
  // A ReadWriteMany claim is read on (it names no provisioner yet: unbound, no class).
  await assert.rejects(describeStore(kc, store("rwx")), /cannot tell the provisioner/);
});

void test("taking back a failed or superseded promote's objects leaves what a newer promote or a Ready cache may use, and an object made again since", async (t) => {
  const { core, custom } = await kube();
  const clients = promoteClients((await kube()).kc);
  const ns = await tempNamespace(t, "take-back");
  const short = newShort();
  const hash = short + randomBytes(24).toString("hex");
  cleanupCache(t, short, []);
  await custom.createClusterCustomObject({
    ...mcRef,
    body: {
      apiVersion: `${MODELCACHE.group}/${MODELCACHE.version}`,
      kind: MODELCACHE.kind,
      metadata: { name: short, labels: { [LABEL_HASH]: short } },
      spec: { hash, electionId: "e1" },
    },
  });
  const record = async (electionId: string, phase: string): Promise<void> => {
    await custom.patchClusterCustomObject(
      { ...mcRef, name: short, body: { spec: { electionId } } },
      mergePatch,
    );
    await custom.patchClusterCustomObjectStatus(
      { ...mcRef, name: short, body: { status: { phase, electionId } } },
      mergePatch,
    );
  };
  const made: CreatedObject[] = [];
  await record("e1", "Promoting");
  assert.equal(
    await ensureClaim(clients, short, hostPathSource(short), ns, { created: (o) => made.push(o) }),
    "created",
  );
  assert.deepEqual(made.map((m) => m.kind).sort(), ["PersistentVolume", "PersistentVolumeClaim"]);
  assert.ok(made.every((m) => m.uid));
  const claimThere = async (): Promise<k8s.V1PersistentVolumeClaim | undefined> =>
    core
      .readNamespacedPersistentVolumeClaim({ namespace: ns, name: claimName(short) })
      .catch((err: unknown) => {
        ignoreNotFound(err);
        return undefined;
      });

  // A newer election's promote may have found them by name (AlreadyExists), as may a Ready cache.
  await record("e2", "Promoting");
  const whileE2 = await removeCreated(clients, short, "e1", made);
  assert.deepEqual(
    whileE2.map((l) => [l.kind, l.why]),
    [
      ["PersistentVolumeClaim", "election e2 is promoting"],
      ["PersistentVolume", "election e2 is promoting"],
    ],
  );
  await record("e2", "Ready");
  assert.equal((await removeCreated(clients, short, "e1", made)).length, 2, "a Ready cache's");
  assert.ok(await claimThere(), "left in place");

  // The next election has not promoted anything yet: they are e1's own to take back.
  await record("e2", "Electing");
  assert.deepEqual(await removeCreated(clients, short, "e1", made), []);
  await waitFor("the claim and its volume gone", async () => {
    const pvs = await core.listPersistentVolume({ labelSelector: `${LABEL_HASH}=${short}` });
    return !(await claimThere()) && pvs.items.length === 0;
  });

  // One made again under the same names since (another UID) is someone else's.
  const again: CreatedObject[] = [];
  await ensureClaim(clients, short, hostPathSource(short), ns, { created: (o) => again.push(o) });
  await core.deleteNamespacedPersistentVolumeClaim({ namespace: ns, name: claimName(short) });
  await waitFor("the claim gone", async () => !(await claimThere()));
  assert.equal(await ensureClaim(clients, short, hostPathSource(short), ns), "created");
  const theirs = (await claimThere())!;
  assert.deepEqual(
    await removeCreated(
      clients,
      short,
      "e1",
      again.filter((o) => o.kind === "PersistentVolumeClaim"),
    ),
    [],
  );
  assert.equal(
    (await claimThere())?.metadata?.uid,
    theirs.metadata?.uid,
    "not removed: not the object e1 made",
  );
});
