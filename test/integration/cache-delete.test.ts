/**
 * The end of a cache's life on the real API server: `warmstart cache delete` (and `kubectl delete
 * modelcache`, through the record's finalizers) removes everything the cache created, in every
 * namespace and on the node that stores it, retrying what fails and reporting what is left;
 * `warmstart cache retry` lets a hash that kept failing be elected again.
 */
import { test, before, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import type * as k8s from "@kubernetes/client-node";
import { kube, localCluster, tempNamespace, waitFor } from "../harness.js";
import { FaultProxy } from "../fault-proxy.js";
import { pauseRole } from "../roles.js";
import {
  ANN_HASH,
  ANN_REASON,
  ANN_ROLE,
  FINALIZER_CLEANUP,
  LABEL_HASH,
  claimName,
  leaseName,
  shortHash,
} from "../../src/core/contract.js";
import { SYSTEM_NAMESPACE } from "../../src/common/kube.js";
import { PACKAGE_ROOT } from "../../tools/localcluster/versions.js";
import {
  bound,
  claimIn,
  cleanupCache,
  createPod,
  getCache,
  ignoreNotFound,
  mcRef,
  mergePatch,
  readyLeader,
  startAgent,
  testNode,
  watchCache,
  workerPod,
  type TestAgent,
} from "../agents.js";

const run = promisify(execFile);

before(async () => {
  const st = await localCluster();
  if (!st?.roles.webhook || !st.roles.server)
    throw new Error("these tests need the webhook and the server of `warmstart cluster up`");
});

/** Runs `warmstart ARGS` against the API server behind `kubeconfig`; never throws. */
async function warmstart(
  kubeconfig: string,
  ...args: string[]
): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await run(process.execPath, [join(PACKAGE_ROOT, "bin/warmstart"), ...args], {
      env: { ...process.env, KUBECONFIG: kubeconfig, LOG_LEVEL: "silent" },
      timeout: 120_000,
    });
    return { code: 0, stdout: r.stdout, stderr: r.stderr };
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof e.code === "number" ? e.code : 1, stdout: e.stdout ?? "", stderr: e.stderr ?? "" };
  }
}

async function kubeconfigFile(
  t: { after: (fn: () => Promise<void>) => void },
  kc: k8s.KubeConfig,
): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "ws-kc-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, "kubeconfig");
  await writeFile(file, kc.exportConfig(), { mode: 0o600 });
  return file;
}

/** A Ready cache on the test agent's node, claimed in two namespaces; its pods are gone again. */
async function readyCache(
  t: TestContext,
  ta: TestAgent,
  prefix: string,
): Promise<{ hash: string; short: string; namespaces: string[] }> {
  const { core } = await kube();
  const nsA = await tempNamespace(t, `${prefix}-a`);
  const nsB = await tempNamespace(t, `${prefix}-b`);
  const model = `org/${prefix}-${nsA}`;
  const { pod } = await readyLeader(ta, nsA, "leader", model);
  const hash = pod.metadata!.annotations![ANN_HASH]!;
  const short = shortHash(hash);
  cleanupCache(t, short, [ta.store]);
  await createPod(nsB, workerPod("follower", model));
  await watchCache(short, (c) => c.status?.phase === "Ready");
  for (const ns of [nsA, nsB]) {
    assert.ok(await claimIn(ns, short), `claim in ${ns}`);
    await core.deleteCollectionNamespacedPod({ namespace: ns, gracePeriodSeconds: 0 });
  }
  await waitFor("the pods gone", async () => {
    for (const ns of [nsA, nsB])
      if ((await core.listNamespacedPod({ namespace: ns })).items.length) return false;
    return true;
  });
  return { hash, short, namespaces: [nsA, nsB] };
}

async function leftovers(short: string): Promise<string[]> {
  const { core } = await kube();
  const sel = { labelSelector: `${LABEL_HASH}=${short}` };
  return [
    ...(await core.listPersistentVolumeClaimForAllNamespaces(sel)).items.map(
      (c) => `claim ${c.metadata?.namespace}/${c.metadata?.name}`,
    ),
    ...(await core.listPersistentVolume(sel)).items.map((v) => `pv ${v.metadata?.name}`),
    ...((await getCache(short)) ? [`record ${short}`] : []),
  ];
}

void test("`warmstart cache delete` removes claims, PVs, the stored tree and the record, retrying the API calls that fail at first", async (t) => {
  // The command alone does the rollback here (the server would do it too, without the faults).
  await pauseRole(t, "server");
  const where = await testNode(t);
  const ta = await startAgent(t, where);
  const { kc } = await kube();
  const { short, namespaces } = await readyCache(t, ta, "del");
  const cache = (await getCache(short))!;
  assert.ok(cache.metadata.finalizers?.includes(FINALIZER_CLEANUP), "the record holds the cleanup finalizer");
  assert.ok(
    cache.metadata.finalizers?.includes(`warmstart.dev/store-${ta.node}`),
    "and the finalizer of the node that stores its tree",
  );

  // The operator's calls go through a proxy that refuses the first deletes of every kind.
  const proxy = await FaultProxy.start(kc);
  t.after(() => proxy.close());
  const faults = [
    proxy.inject({ method: "DELETE", path: /^\/api\/v1\/persistentvolumes\//, times: 2, status: [500, 503] }),
    proxy.inject({
      method: "DELETE",
      path: new RegExp(`^/api/v1/namespaces/${namespaces[1]}/persistentvolumeclaims/`),
      times: 1,
      status: [500],
    }),
    proxy.inject({ method: "DELETE", path: /\/modelcaches\//, times: 1, status: [503] }),
    proxy.inject({ method: "GET", path: /^\/api\/v1\/persistentvolumes$/, times: 1, status: [500] }),
  ];
  const r = await warmstart(
    await kubeconfigFile(t, proxy.kubeConfig()),
    "cache",
    "delete",
    short,
    "--timeout",
    "60s",
  );
  assert.equal(r.code, 0, `${r.stdout}\n${r.stderr}`);
  for (const f of faults) assert.ok(f.hits >= 1, "every injected failure was met");
  for (const ns of namespaces)
    assert.match(r.stdout, new RegExp(`deleted PersistentVolumeClaim ${ns}/${claimName(short)}`));
  assert.match(r.stdout, new RegExp(`deleted PersistentVolume warmstart-${short}-`));
  assert.match(r.stdout, new RegExp(`cache ${short} deleted`));
  const pvDeletes = proxy.seen("DELETE", /^\/api\/v1\/persistentvolumes\//).map((x) => x.status);
  assert.deepEqual(pvDeletes.slice(0, 3), [500, 503, 200], "retried until it went through");

  assert.deepEqual(await leftovers(short), []);
  await assert.rejects(stat(join(ta.store, short)), /ENOENT/, "the node's agent removed the stored tree");
});

void test("`warmstart cache delete` reports what it cannot remove (a claim a pod still mounts) and fails; run again later, it finishes", async (t) => {
  await pauseRole(t, "server");
  const where = await testNode(t);
  const ta = await startAgent(t, where);
  const { kc, core } = await kube();
  const { hash, short, namespaces } = await readyCache(t, ta, "busy");
  const [nsA] = namespaces as [string, string];
  // A restore in use: it mounts the claim, so the claim stays until it goes.
  const user = await createPod(nsA, workerPod("user", `org/busy-${nsA}`, { node: ta.node }));
  assert.equal(user.metadata?.annotations?.[ANN_ROLE], "restore", user.metadata?.annotations?.[ANN_REASON]);
  assert.equal(user.metadata?.annotations?.[ANN_HASH], hash);
  await bound(nsA, "user");
  const file = await kubeconfigFile(t, kc);

  const first = await warmstart(file, "cache", "delete", short, "--timeout", "3s");
  assert.equal(first.code, 1, "not everything could be removed");
  assert.match(
    first.stdout,
    new RegExp(`PersistentVolumeClaim ${nsA}/${claimName(short)}: in use by pod\\(s\\) user`),
  );
  assert.match(first.stdout, /not fully deleted/);
  assert.match(
    first.stdout,
    new RegExp(`StoredTree ${short}: on node ${ta.node}: in use by pod\\(s\\) ${nsA}/user`),
    "the pods that hold the tree are named",
  );
  assert.ok(
    (await stat(join(ta.store, short))).isDirectory(),
    "a tree a running pod reads is not pulled from under it",
  );
  const cache = await getCache(short);
  assert.ok(cache?.metadata.deletionTimestamp, "the record is being deleted");
  assert.equal(cache.status?.reason, "Deleting", "and no longer restored from");
  const late = await createPod(nsA, workerPod("late", `org/busy-${nsA}`, { node: ta.node }));
  assert.notEqual(late.metadata?.annotations?.[ANN_ROLE], "restore", "admission no longer restores from it");

  await core.deleteCollectionNamespacedPod({ namespace: nsA, gracePeriodSeconds: 0 });
  await waitFor(
    "the pods gone",
    async () => (await core.listNamespacedPod({ namespace: nsA })).items.length === 0,
  );
  // The next election of the hash (the late pod's) must not keep the old cache's record alive.
  await (
    await kube()
  ).coordination
    .deleteNamespacedLease({ name: leaseName(hash), namespace: SYSTEM_NAMESPACE })
    .catch(ignoreNotFound);
  const second = await warmstart(file, "cache", "delete", short, "--timeout", "60s");
  assert.equal(second.code, 0, `${second.stdout}\n${second.stderr}`);
  assert.deepEqual(await leftovers(short), []);
  await assert.rejects(stat(join(ta.store, short)), /ENOENT/);
});

void test("`kubectl delete modelcache` does the same through the record's finalizers", async (t) => {
  const where = await testNode(t);
  const ta = await startAgent(t, where);
  const { custom } = await kube();
  const { short } = await readyCache(t, ta, "kdel");
  await custom.deleteClusterCustomObject({ ...mcRef, name: short });
  await waitFor("everything gone", async () => (await leftovers(short)).length === 0, 60_000);
  await assert.rejects(stat(join(ta.store, short)), /ENOENT/);
});

void test("`warmstart cache retry` clears the failed-capture count: a hash admitted cold is elected again", async (t) => {
  const { kc, core, coordination, custom } = await kube();
  const ns = await tempNamespace(t, "retry");
  const model = `org/retry-${ns}`;
  const first = await createPod(ns, workerPod("first", model, { manualReady: true }));
  assert.equal(first.metadata?.annotations?.[ANN_ROLE], "leader");
  const hash = first.metadata.annotations[ANN_HASH]!;
  const short = shortHash(hash);
  cleanupCache(t, short, []);
  // Three elections whose capture failed, as the node agents count them.
  await custom.patchClusterCustomObjectStatus(
    {
      ...mcRef,
      name: short,
      body: { status: { phase: "Failed", reason: "CaptureFailed", message: "disk full", failedCaptures: 3 } },
    },
    mergePatch,
  );
  await core.deleteNamespacedPod({ namespace: ns, name: "first", gracePeriodSeconds: 0 });
  await coordination
    .deleteNamespacedLease({ name: leaseName(hash), namespace: SYSTEM_NAMESPACE })
    .catch(ignoreNotFound);
  const file = await kubeconfigFile(t, kc);
  const view = await warmstart(file, "caches", "-o", "json");
  assert.equal(view.code, 0, view.stderr);
  const row = (JSON.parse(view.stdout) as { hash: string; failedCaptures: number }[]).find(
    (c) => c.hash === short,
  );
  assert.equal(row?.failedCaptures, 3, "the count is shown");

  const cold = await createPod(ns, workerPod("cold", model, { manualReady: true }));
  assert.equal(cold.metadata?.annotations?.[ANN_ROLE], "cold");
  assert.match(cold.metadata?.annotations?.[ANN_REASON] ?? "", new RegExp(`warmstart cache retry ${short}`));

  const r = await warmstart(file, "cache", "retry", hash);
  assert.equal(r.code, 0, r.stderr);
  assert.match(r.stdout, /failed captures 3 → 0/);
  assert.equal((await getCache(short))?.status?.failedCaptures, 0);
  const again = await createPod(ns, workerPod("again", model, { manualReady: true }));
  assert.equal(again.metadata?.annotations?.[ANN_ROLE], "leader", again.metadata?.annotations?.[ANN_REASON]);

  const missing = await warmstart(file, "cache", "retry", "0".repeat(16));
  assert.equal(missing.code, 1);
  assert.match(missing.stderr, /no cache 0000000000000000/);
  const bad = await warmstart(file, "cache", "delete", "not-a-hash");
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /not a cache hash/);
});
