/**
 * The CSI backends of promote (SPEC 1.5) end to end on the real node, with the local cluster's
 * CSI stack (the folder driver stand-in and the real provisioner, snapshotter and
 * snapshot-controller): followers in two namespaces start from the leader's tree (snapshot-clone:
 * the tree is written into a volume of its own, snapshotted, and cloned read-only per namespace;
 * shared-volume: the node's store is a shared CSI volume and each namespace's static volume is
 * the tree's folder in it).
 */
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdir, mkdtemp, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import * as k8s from "@kubernetes/client-node";
import { getModelCache } from "../../src/common/modelcache.js";
import { snapshotName } from "../../src/promote/objects.js";
import { SYSTEM_NAMESPACE } from "../../src/common/kube.js";
import {
  ANN_ROLE,
  ANN_TREE,
  LABEL_HASH,
  READY_MARKER,
  STORAGE_PROFILES_CONFIGMAP,
  claimName,
} from "../../src/core/contract.js";
import { readState, startClusterProcessAgain, stopClusterProcess } from "../../tools/localcluster/cluster.js";
import { CSI_DRIVER_NAME, FolderDriver } from "../../tools/localcluster/csi/driver.js";
import { BLOCK_CLASS, csiDir, SHARED_CLASS, SNAPSHOT_CLASS } from "../../tools/localcluster/csi/stack.js";
import { freePort, isAlive } from "../../tools/localcluster/processes.js";
import { PACKAGE_ROOT } from "../../tools/localcluster/versions.js";
import { runCsiSanity } from "../csi-sanity.js";
import { isPodReady, kube, listPods, runToEnd, tempNamespace, uniqueName, waitFor } from "../harness.js";
import {
  createEngines,
  engineReport,
  hubStats,
  initExits,
  modelBytes,
  mountByHand,
  realNodeOrSkip,
  type RealNode,
} from "../realnode.js";

const READY_MS = 240_000;
const mergePatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);

test("csi-sanity passes against the driver stand-in", async (t) => {
  if (!(await csiReady(t))) return;
  const bins = csiDir();
  const dir = await mkdtemp(join(tmpdir(), "csi-sanity-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const driver = new FolderDriver({
    socket: join(dir, "csi.sock"),
    dataDir: join(dir, "data"),
    nodeId: "sanity",
    protoDir: bins,
  });
  await driver.start();
  t.after(() => driver.stop());
  await runCsiSanity(t, {
    sanity: join(bins, "csi-sanity"),
    endpoint: join(dir, "csi.sock"),
    dir,
    minPassed: 47,
  });
});

/** A claim for the node's cache store on a class of the driver, bound, and its folder. */
async function storeVolume(
  t: TestContext,
  storageClass: string,
  mode: string,
): Promise<{ claim: string; dir: string }> {
  const { core } = await kube();
  const st = await readState();
  const name = uniqueName("store");
  await core.createNamespacedPersistentVolumeClaim({
    namespace: SYSTEM_NAMESPACE,
    body: {
      metadata: { name },
      spec: {
        accessModes: [mode],
        storageClassName: storageClass,
        resources: { requests: { storage: "2Gi" } },
      },
    },
  });
  t.after(async () => {
    await core
      .deleteNamespacedPersistentVolumeClaim({ name, namespace: SYSTEM_NAMESPACE })
      .catch(() => undefined);
  });
  const pvc = await waitFor(
    `store claim ${name} bound`,
    async () => {
      const c = await core.readNamespacedPersistentVolumeClaim({ name, namespace: SYSTEM_NAMESPACE });
      return c.status?.phase === "Bound" ? c : undefined;
    },
    60_000,
  );
  const pv = await core.readPersistentVolume({ name: pvc.spec!.volumeName! });
  return {
    claim: `${SYSTEM_NAMESPACE}/${name}`,
    dir: join(st!.csi!.dataDir, "volumes", pv.spec!.csi!.volumeHandle),
  };
}

/**
 * The real node's agent, for this test, keeps its store on a CSI volume: the cluster's own agent
 * of that node is stopped meanwhile (two agents would both capture) and started again after.
 */
async function storeOnVolume(
  t: TestContext,
  node: RealNode,
  store: { claim?: string; dir: string },
  extra: string[] = [],
): Promise<AgentProcess> {
  const cluster = `node-agent-${node.name}`;
  await stopClusterProcess(cluster);
  const port = await freePort();
  const st = await readState();
  const args = [
    join(PACKAGE_ROOT, "bin/warmstart"),
    "node-agent",
    `--node=${node.name}`,
    `--kubelet-root=${node.kubeletRoot}`,
    `--store=${store.dir}`,
    ...(store.claim ? [`--store-claim=${store.claim}`] : []),
    "--warmup=1s",
    "--resync=10s",
    "--no-durable",
    "--host=127.0.0.1",
    `--port=${port}`,
    ...extra,
  ];
  let agent: ChildProcess | undefined;
  let stderr = "";
  const handle: AgentProcess = {
    async start() {
      agent = spawn(process.execPath, args, {
        env: { ...process.env, KUBECONFIG: st!.kubeconfig, WARMSTART_LOG_FORMAT: "json" },
        stdio: ["ignore", "ignore", "pipe"],
      });
      agent.stderr!.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
      await waitFor(
        `the CSI-store node agent (${stderr})`,
        async () => (await fetch(`http://127.0.0.1:${port}/healthz`)).ok,
      );
    },
    async stop() {
      const a = agent;
      if (!a || a.exitCode !== null || a.signalCode !== null) return { code: a?.exitCode ?? null, ms: 0 };
      const t0 = Date.now();
      const exited = new Promise<number | null>((r) => a.once("exit", (code) => r(code)));
      a.kill("SIGTERM");
      return { code: await exited, ms: Date.now() - t0 };
    },
  };
  t.after(async () => {
    await handle.stop();
    await startClusterProcessAgain(cluster);
  });
  await handle.start();
  return handle;
}

/** The test's own node agent process: started, and stopped as the kubelet would (SIGTERM). */
interface AgentProcess {
  start(): Promise<void>;
  /** SIGTERM, then its exit code and how long it took to exit. */
  stop(): Promise<{ code: number | null; ms: number }>;
}

/**
 * The real node's agent, for this test, keeps its store on the node and writes each tree into a
 * volume of its own of `storageClass` (snapshot-clone), through a writer pod of the Warmstart image.
 */
async function treesOnVolumes(
  t: TestContext,
  node: RealNode,
  storageClass: string,
  extra: string[] = [],
): Promise<{ dir: string; agent: AgentProcess }> {
  const dir = await mkdtemp(join(tmpdir(), "csi-store-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const agent = await storeOnVolume(t, node, { dir }, [
    `--tree-volume-class=${storageClass}`,
    `--image=${node.images.warmstart}`,
    ...extra,
  ]);
  return { dir, agent };
}

async function readyPods(namespace: string, n: number): Promise<k8s.V1Pod[]> {
  return waitFor(
    `${n} ready engine pods in ${namespace}`,
    async () => {
      const pods = (await listPods(namespace, "app=engine")).filter((p) => !p.metadata?.deletionTimestamp);
      return pods.length === n && pods.every(isPodReady) ? pods : undefined;
    },
    READY_MS,
  );
}

/** Two namespaces of one chart: the leader's namespace (2 replicas) and another (1 restore). */
async function storyInTwoNamespaces(
  t: TestContext,
  node: RealNode,
): Promise<{ short: string; pods: k8s.V1Pod[] }> {
  const { custom } = await kube();
  const model = `synthetic/${uniqueName("csi")}`;
  const a = await tempNamespace(t, "csi-a");
  const b = await tempNamespace(t, "csi-b");
  // When each pod was first seen scheduled and Ready, and the cache Ready (polled: conditions
  // carry whole seconds only), for the figures this backend gives.
  const seen = new Map<string, { scheduled?: number; ready?: number; role?: string }>();
  let short: string | undefined;
  let cacheReady: number | undefined;
  const poll = setInterval(() => {
    void (async () => {
      const now = Date.now();
      for (const p of [...(await listPods(a, "app=engine")), ...(await listPods(b, "app=engine"))]) {
        const e = seen.get(p.metadata!.name!) ?? { role: p.metadata?.annotations?.[ANN_ROLE] };
        if (p.spec?.nodeName && e.scheduled === undefined) e.scheduled = now;
        if (isPodReady(p) && e.ready === undefined) e.ready = now;
        seen.set(p.metadata!.name!, e);
        short ??= p.metadata?.labels?.[LABEL_HASH];
      }
      if (
        short &&
        cacheReady === undefined &&
        (await getModelCache(custom, short))?.status?.phase === "Ready"
      )
        cacheReady = now;
    })().catch(() => undefined);
  }, 250);
  t.after(() => clearInterval(poll));
  await createEngines(t, node, a, { replicas: 2, model });
  const first = await readyPods(a, 2);
  await createEngines(t, node, b, { replicas: 1, model });
  const second = await readyPods(b, 1);
  clearInterval(poll);
  const size = await modelBytes(node, model);
  assert.equal((await hubStats(node)).repos[model]?.bytes, size, "one model's worth from the hub");
  const leader = [...seen.values()].find((e) => e.role === "leader");
  const secs = (ms: number | undefined): string => (ms === undefined ? "?" : (ms / 1000).toFixed(1));
  t.diagnostic(
    `leader Ready to cache Ready (capture and promote): ${secs(cacheReady && leader?.ready ? cacheReady - leader.ready : undefined)} s; ` +
      [...seen.entries()]
        .filter(([, e]) => e.role !== "leader")
        .map(
          ([n, e]) =>
            `${e.role} ${n}: scheduled to Ready ${secs(e.ready && e.scheduled ? e.ready - e.scheduled : undefined)} s`,
        )
        .join("; "),
  );
  return { short: first[0]!.metadata!.labels![LABEL_HASH]!, pods: [...first, ...second] };
}

/** `tree`: the tree's folder in the volume the restores mount ("." when the volume is the tree). */
async function assertRestoredFromVolume(node: RealNode, pods: k8s.V1Pod[], tree: string): Promise<void> {
  const restored = pods.filter((p) => p.metadata?.annotations?.[ANN_ROLE] !== "leader");
  assert.equal(restored.length, 2, "a follower and a restore in another namespace");
  for (const p of restored) {
    assert.equal(p.metadata?.annotations?.[ANN_TREE], tree, `${p.metadata?.name} mounts the tree's folder`);
    assert.deepEqual(Object.values(initExits(p)), [0, 0], `${p.metadata?.name}: init containers`);
    const r = await engineReport(node, p);
    assert.equal(r.fetchedBytes, 0, `${p.metadata?.name} fetched nothing`);
    assert.equal(r.compileCache, "hit");
    assert.equal(r.modelStore.writable, false, "the clone is mounted read-only");
  }
}

/**
 * `warmstart cache delete` on this backend: the workload gone, every object the promote made
 * (claims, PVs, VolumeSnapshots and their contents, labelled with the hash) is deleted, the
 * driver's folders behind them go (the provisioner and snapshotter delete through the driver),
 * the node agent removes the stored tree, and the store volume itself is untouched.
 */
async function deleteAndAssertGone(
  t: TestContext,
  short: string,
  namespaces: string[],
  store: { dir: string },
): Promise<void> {
  const { kc, core, apps } = await kube();
  const objects = k8s.KubernetesObjectApi.makeApiClient(kc);
  const st = await readState();
  const sel = `${LABEL_HASH}=${short}`;
  const snapshotsOf = async (
    kind: "VolumeSnapshot" | "VolumeSnapshotContent",
  ): Promise<k8s.KubernetesObject[]> =>
    (
      await objects.list(
        "snapshot.storage.k8s.io/v1",
        kind,
        undefined,
        undefined,
        undefined,
        undefined,
        undefined,
        sel,
      )
    ).items;
  const handles = [
    ...(await core.listPersistentVolume({ labelSelector: sel })).items.map((v) =>
      join(st!.csi!.dataDir, "volumes", v.spec!.csi!.volumeHandle),
    ),
    // Each snapshot's data: through the content bound to it (made by the snapshot controller).
    ...(await Promise.all(
      (await snapshotsOf("VolumeSnapshot")).map(async (v) => {
        const content = (v as { status?: { boundVolumeSnapshotContentName?: string } }).status
          ?.boundVolumeSnapshotContentName;
        const c = (await objects.read({
          apiVersion: "snapshot.storage.k8s.io/v1",
          kind: "VolumeSnapshotContent",
          metadata: { name: content! },
        })) as { status?: { snapshotHandle?: string } };
        return join(st!.csi!.dataDir, "snapshots", c.status!.snapshotHandle!);
      }),
    )),
  ].filter((d) => !d.includes("#")); // a shared-volume handle names the store's own data
  const present = async (): Promise<string[]> =>
    [
      ...(await core.listPersistentVolumeClaimForAllNamespaces({ labelSelector: sel })).items.map(
        (c) => `claim ${c.metadata?.namespace}/${c.metadata?.name}`,
      ),
      ...(await core.listPersistentVolume({ labelSelector: sel })).items.map((v) => `pv ${v.metadata?.name}`),
      ...(await snapshotsOf("VolumeSnapshot")).map((v) => `snapshot ${v.metadata?.name}`),
      ...(await snapshotsOf("VolumeSnapshotContent")).map((v) => `content ${v.metadata?.name}`),
      ...(await Promise.all(handles.map(async (d) => ((await exists(d)) ? `folder ${d}` : "")))),
      ...((await exists(join(store.dir, short))) ? [`stored tree ${short}`] : []),
      ...((await getModelCache((await kube()).custom, short)) ? [`record ${short}`] : []),
    ].filter(Boolean);
  const before = await present();
  for (const ns of namespaces)
    assert.ok(
      before.includes(`claim ${ns}/${claimName(short)}`),
      `a claim in ${ns} before: ${before.join(", ")}`,
    );
  for (const ns of namespaces) {
    await apps.deleteNamespacedDeployment({ name: "engine", namespace: ns, gracePeriodSeconds: 0 });
    await core.deleteCollectionNamespacedPod({ namespace: ns, gracePeriodSeconds: 0 });
  }
  await waitFor("the workload's pods gone", async () => {
    for (const ns of namespaces) if ((await listPods(ns, "app=engine")).length) return false;
    return true;
  });
  const started = Date.now();
  const r = await runToEnd(
    process.execPath,
    [join(PACKAGE_ROOT, "bin/warmstart"), "cache", "delete", short, "--timeout", "90s", "-o", "json"],
    120_000,
    { KUBECONFIG: st!.kubeconfig, LOG_LEVEL: "silent" },
  );
  assert.equal(r.status, 0, `cache delete failed:\n${r.stdout}\n${r.stderr}`);
  const report = JSON.parse(r.stdout) as { gone: boolean; left: unknown[] };
  assert.equal(report.gone, true, "the record is gone");
  assert.deepEqual(report.left, []);
  await waitFor(
    "every object and folder of the cache gone",
    async () => {
      const left = await present();
      if (left.length) throw new Error(`still there: ${left.join(", ")}`);
      return true;
    },
    90_000,
  );
  assert.ok(await exists(store.dir), "the store volume itself stays");
  t.diagnostic(
    `cache delete: ${before.length} object(s) and folder(s), ${handles.length} of them the driver's, gone in ${((Date.now() - started) / 1000).toFixed(1)} s`,
  );
}

const exists = (p: string): Promise<boolean> =>
  stat(p).then(
    () => true,
    () => false,
  );

test("snapshot-clone: each tree is written into a volume of its own and snapshotted; followers in two namespaces start from read-only clones of it", async (t) => {
  const node = await realNodeOrSkip(t);
  if (!node || !(await csiReady(t))) return;
  const { custom, core } = await kube();
  const store = await treesOnVolumes(t, node, SNAPSHOT_CLASS);
  const { short, pods } = await storyInTwoNamespaces(t, node);
  const cache = await getModelCache(custom, short);
  assert.equal(cache?.status?.phase, "Ready");
  for (const ns of new Set(pods.map((p) => p.metadata!.namespace!))) {
    const claim = await core.readNamespacedPersistentVolumeClaim({ name: claimName(short), namespace: ns });
    assert.deepEqual(claim.spec?.accessModes, ["ReadOnlyMany"]);
    assert.equal(claim.spec?.dataSource?.kind, "VolumeSnapshot", `${ns}: a clone of the snapshot`);
    const pv = await core.readPersistentVolume({ name: claim.spec.volumeName! });
    assert.equal(pv.spec?.csi?.driver, CSI_DRIVER_NAME);
  }
  await assertRestoredFromVolume(node, pods, "tree");
  // The attacker: a root pod mounting its namespace's clone whole, without readOnly, sees this
  // tree alone (no store, no other tree) and cannot write it.
  const seen = await mountByHand(t, node, pods.at(-1)!.metadata!.namespace!, claimName(short));
  assert.deepEqual(seen.entries, ["tree"], "the clone holds the one tree");
  assert.match(seen.write, /Read-only file system/);
  await deleteAndAssertGone(t, short, [...new Set(pods.map((p) => p.metadata!.namespace!))], store);
});

test("shared-volume: the store volume is shared by per-namespace static volumes; followers start from it", async (t) => {
  const node = await realNodeOrSkip(t);
  if (!node || !(await csiReady(t))) return;
  const { custom, core } = await kube();
  const store = await storeVolume(t, SHARED_CLASS, "ReadWriteMany");
  await mkdir(join(store.dir, DECOY), { recursive: true });
  await writeFile(join(store.dir, DECOY, READY_MARKER), "");
  await storeOnVolume(t, node, store);
  const { short, pods } = await storyInTwoNamespaces(t, node);
  assert.equal((await getModelCache(custom, short))?.status?.phase, "Ready");
  const storePv = (await core.listPersistentVolume()).items.find((v) =>
    store.dir.endsWith(v.spec?.csi?.volumeHandle ?? "\0"),
  );
  for (const ns of new Set(pods.map((p) => p.metadata!.namespace!))) {
    const claim = await core.readNamespacedPersistentVolumeClaim({ name: claimName(short), namespace: ns });
    const pv = await core.readPersistentVolume({ name: claim.spec!.volumeName! });
    assert.ok(
      pv.spec?.csi?.volumeHandle.startsWith(`${storePv!.spec!.csi!.volumeHandle}#`),
      `${ns}: a handle of the store volume's own data (${pv.spec?.csi?.volumeHandle})`,
    );
  }
  await assertRestoredFromVolume(node, pods, ".");
  // The attacker: a root pod mounting the claim itself, whole, without readOnly, sees the one
  // tree (its ready marker at the root), nothing else of the store, and cannot write.
  const seen = await mountByHand(t, node, pods.at(-1)!.metadata!.namespace!, claimName(short));
  assert.ok(seen.entries.includes(READY_MARKER), `the tree's root: ${seen.entries.join(", ")}`);
  assert.ok(!seen.entries.includes(DECOY), "another tree of the store is out of reach");
  assert.ok(!seen.entries.includes(short), "the volume is the tree, not the store holding it");
  assert.match(seen.write, /Read-only file system|EROFS|Permission denied/);
  await deleteAndAssertGone(t, short, [...new Set(pods.map((p) => p.metadata!.namespace!))], store);
});

/** Another scope's tree in the store volume, which no claim of this test's cache may show. */
const DECOY = "0decoy0decoy0dec";

test("a node agent stopped while its snapshot promote waits exits 0 within its shutdown deadline, and started again it resumes the promote to Ready", async (t) => {
  const node = await realNodeOrSkip(t);
  if (!node || !(await csiReady(t))) return;
  const { custom } = await kube();
  // The snapshot sidecar held still: the snapshot is made but never turns ready while it is.
  const st = await readState();
  const snapshotter = st?.processes.find((p) => p.name === "csi-snapshotter");
  assert.ok(snapshotter && (await isAlive(snapshotter)), "the local cluster's csi-snapshotter runs");
  const resume = async (): Promise<void> => {
    if (await isAlive(snapshotter)) process.kill(snapshotter.pid, "SIGCONT");
  };
  t.after(resume);
  const { agent } = await treesOnVolumes(t, node, SNAPSHOT_CLASS, ["--snapshot-timeout=10m"]);
  process.kill(snapshotter.pid, "SIGSTOP");

  const ns = await tempNamespace(t, "csi-stop");
  await createEngines(t, node, ns, { replicas: 1, model: `synthetic/${uniqueName("stop")}` });
  const short = await waitFor("a leader", async () => {
    const pods = await listPods(ns, "app=engine");
    return pods.find((p) => p.metadata?.annotations?.[ANN_ROLE] === "leader")?.metadata?.labels?.[LABEL_HASH];
  });
  await waitFor(
    "the promote waiting on its snapshot",
    async () =>
      (await getModelCache(custom, short))?.status?.phase === "Promoting" &&
      (await custom
        .getNamespacedCustomObject({
          group: "snapshot.storage.k8s.io",
          version: "v1",
          namespace: SYSTEM_NAMESPACE,
          plural: "volumesnapshots",
          name: snapshotName(short),
        })
        .then(() => true)
        .catch(() => false)),
    READY_MS,
  );
  // Stopped as the kubelet stops it: the wait ends with the controller, within the deadline (25 s).
  const stopped = await agent.stop();
  t.diagnostic(`stopped mid-promote: exit ${stopped.code} after ${stopped.ms} ms`);
  assert.equal(stopped.code, 0, "a clean exit");
  assert.ok(stopped.ms < 25_000, `within the shutdown deadline: ${stopped.ms} ms`);
  assert.equal((await getModelCache(custom, short))?.status?.phase, "Promoting", "the promote is not failed");

  // Started again with the snapshot sidecar going: the promote resumes and the cache turns Ready.
  await resume();
  await agent.start();
  await waitFor(
    "the cache Ready after the restart",
    async () => (await getModelCache(custom, short))?.status?.phase === "Ready",
    READY_MS,
  );
});

test("a snapshot that never becomes ready: the cache ends Failed and no follower waits forever", async (t) => {
  const node = await realNodeOrSkip(t);
  if (!node || !(await csiReady(t))) return;
  const { core, custom } = await kube();
  const storage = (await kube()).kc.makeApiClient(k8s.StorageV1Api);
  const objects = k8s.KubernetesObjectApi.makeApiClient((await kube()).kc);
  const type = uniqueName("unready");
  // A class of the driver whose snapshots never turn ready to use, promoted by snapshot-clone.
  await storage.createStorageClass({
    body: {
      metadata: { name: type },
      provisioner: CSI_DRIVER_NAME,
      parameters: { type },
      volumeBindingMode: "Immediate",
      reclaimPolicy: "Delete",
    },
  });
  await objects.create({
    apiVersion: "snapshot.storage.k8s.io/v1",
    kind: "VolumeSnapshotClass",
    metadata: { name: type },
    driver: CSI_DRIVER_NAME,
    deletionPolicy: "Delete",
    parameters: { readyToUse: "false" },
  } as k8s.KubernetesObject);
  const cm = await core.readNamespacedConfigMap({
    name: STORAGE_PROFILES_CONFIGMAP,
    namespace: SYSTEM_NAMESPACE,
  });
  const before = cm.data?.[CSI_DRIVER_NAME] ?? "{}";
  const profile = JSON.parse(before) as { volumeTypes?: Record<string, unknown> };
  profile.volumeTypes = {
    ...profile.volumeTypes,
    [type]: { backend: "snapshot-clone", snapshotClass: type },
  };
  await patchProfile(core, JSON.stringify(profile));
  t.after(async () => {
    await patchProfile(core, before);
    await storage.deleteStorageClass({ name: type }).catch(() => undefined);
    await objects
      .delete({
        apiVersion: "snapshot.storage.k8s.io/v1",
        kind: "VolumeSnapshotClass",
        metadata: { name: type },
      })
      .catch(() => undefined);
  });
  await treesOnVolumes(t, node, type, ["--snapshot-timeout=5s"]);

  const ns = await tempNamespace(t, "csi-stuck");
  const model = `synthetic/${uniqueName("stuck")}`;
  await createEngines(t, node, ns, { replicas: 2, model });
  const short = await waitFor("a leader", async () => {
    const pods = await listPods(ns, "app=engine");
    return pods.find((p) => p.metadata?.annotations?.[ANN_ROLE] === "leader")?.metadata?.labels?.[LABEL_HASH];
  });
  // The failure is counted on the record; its phase may already be a next election's when looked at
  // (the evicted follower's replacement leads one at once), so the count and its reason are read.
  const failed = await waitFor(
    "the cache's election Failed",
    async () => {
      const c = await getModelCache(custom, short);
      if (c?.status?.phase === "Failed") return c.status.message ?? "";
      return (c?.status?.failedCaptures ?? 0) >= 1 ? "counted" : undefined;
    },
    READY_MS,
  );
  if (failed !== "counted") assert.match(failed, /snapshot/i);
  // Every replica ends Ready (cold after the failure, or re-elected): none stays gated.
  await readyPods(ns, 2);
});

async function patchProfile(core: k8s.CoreV1Api, value: string): Promise<void> {
  await core.patchNamespacedConfigMap(
    {
      name: STORAGE_PROFILES_CONFIGMAP,
      namespace: SYSTEM_NAMESPACE,
      body: { data: { [CSI_DRIVER_NAME]: value } },
    },
    mergePatch,
  );
}

async function csiReady(t: TestContext): Promise<boolean> {
  const st = await readState();
  if (!st?.csi) {
    t.skip("the local cluster runs without its CSI stack (cluster up --no-csi)");
    return false;
  }
  return true;
}

test("a class the driver cannot share read-only (block): Unsupported, and the pods of that hash start cold", async (t) => {
  const node = await realNodeOrSkip(t);
  if (!node || !(await csiReady(t))) return;
  const { custom } = await kube();
  await treesOnVolumes(t, node, BLOCK_CLASS);
  const ns = await tempNamespace(t, "csi-block");
  const model = `synthetic/${uniqueName("block")}`;
  await createEngines(t, node, ns, { replicas: 2, model });
  const short = await waitFor("a leader", async () => {
    const pods = await listPods(ns, "app=engine");
    return pods.find((p) => p.metadata?.annotations?.[ANN_ROLE] === "leader")?.metadata?.labels?.[LABEL_HASH];
  });
  const cache = await waitFor(
    "the cache Unsupported",
    async () => {
      const c = await getModelCache(custom, short);
      return c?.status?.phase === "Failed" ? c : undefined;
    },
    READY_MS,
  );
  assert.equal(cache.status?.reason, "Unsupported");
  // No pod waits on a cache that cannot be: every replica ends Ready, the later ones cold.
  const pods = await readyPods(ns, 2);
  const later = pods.filter((p) => p.metadata?.annotations?.[ANN_ROLE] !== "leader");
  assert.ok(later.length >= 1);
  for (const p of later) {
    assert.equal(p.metadata?.annotations?.[ANN_ROLE], "cold", `${p.metadata?.name} starts cold`);
    assert.match(p.metadata?.annotations?.["warmstart.dev/reason"] ?? "", /share|Unsupported|clone/i);
  }
});
