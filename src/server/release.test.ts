/**
 * One reconcile pass over API clients that answer from memory: what the pass reports and which
 * record it writes. The integration test release.test.ts runs the same passes on the real API server.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type * as k8s from "@kubernetes/client-node";
import { pino } from "pino";
import {
  ANN_ELECTION_ID,
  ANN_HASH,
  ANN_RESTORE_FROM,
  ANN_RESTORE_RECORDED,
  ANN_ROLE,
  FINALIZER_CLEANUP,
  LABEL_HASH,
  leaseName,
} from "../core/contract.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import { reconcileHash, type ReleaseDeps } from "./release.js";

const notFound = (): Error => Object.assign(new Error("not found"), { code: 404 });

/** The few calls a pass makes, over pods, Leases and records held here. */
function fakeCluster(o: { pods: k8s.V1Pod[]; leases?: k8s.V1Lease[]; records?: ModelCacheObject[] }): {
  deps: (extra?: Partial<ReleaseDeps>) => ReleaseDeps;
  records: Map<string, ModelCacheObject>;
  podPatches: Array<{ name: string; body: unknown }>;
} {
  const records = new Map((o.records ?? []).map((r) => [r.metadata.name!, structuredClone(r)]));
  const leases = new Map((o.leases ?? []).map((l) => [l.metadata!.name!, l]));
  const podPatches: Array<{ name: string; body: unknown }> = [];
  let rv = 1;
  const record = (name: string): ModelCacheObject => {
    const r = records.get(name);
    if (!r) throw notFound();
    return r;
  };
  const core = {
    listPodForAllNamespaces: ({ labelSelector }: { labelSelector: string }) =>
      Promise.resolve({
        items: o.pods.filter((p) => `${LABEL_HASH}=${p.metadata?.labels?.[LABEL_HASH]}` === labelSelector),
      }),
    patchNamespacedPod: (a: { name: string; body: unknown }) => (podPatches.push(a), Promise.resolve({})),
    createNamespacedEvent: () => Promise.resolve({}),
    createNamespacedPodEviction: () => Promise.resolve({}),
  };
  const coordination = {
    readNamespacedLease: ({ name }: { name: string }) => {
      const l = leases.get(name);
      return l ? Promise.resolve(l) : Promise.reject(notFound());
    },
    deleteNamespacedLease: ({ name }: { name: string }) =>
      leases.delete(name) ? Promise.resolve({}) : Promise.reject(notFound()),
  };
  const custom = {
    getClusterCustomObject: ({ name }: { name: string }) =>
      Promise.resolve().then(() => structuredClone(record(name))),
    patchClusterCustomObject: ({
      name,
      body,
    }: {
      name: string;
      body: { metadata: { finalizers?: string[] } };
    }) =>
      Promise.resolve().then(() => {
        const r = record(name);
        if (body.metadata.finalizers) r.metadata.finalizers = body.metadata.finalizers;
        r.metadata.resourceVersion = String(++rv);
        return structuredClone(r);
      }),
    patchClusterCustomObjectStatus: ({ name, body }: { name: string; body: { status: object } }) =>
      Promise.resolve().then(() => {
        const r = record(name);
        r.status = { ...r.status, ...body.status };
        r.metadata.resourceVersion = String(++rv);
        return structuredClone(r);
      }),
  };
  return {
    records,
    podPatches,
    deps: (extra = {}) => ({
      core: core as unknown as k8s.CoreV1Api,
      coordination: coordination as unknown as k8s.CoordinationV1Api,
      custom: custom as unknown as k8s.CustomObjectsApi,
      systemNamespace: "warmstart-system",
      log: pino({ level: "silent" }),
      now: Date.now,
      leaderGraceMs: 30_000,
      recheckMs: 15_000,
      ...extra,
    }),
  };
}

test("a retired election is reported by its reason, never by a message that names its pods", async () => {
  const short = "0123456789abcdef";
  const leader: k8s.V1Pod = {
    metadata: {
      namespace: "team-a",
      name: "worker-7f9c-x2",
      uid: "uid-leader",
      labels: { [LABEL_HASH]: short },
      annotations: { [ANN_ELECTION_ID]: "e1", [ANN_ROLE]: "leader" },
      deletionTimestamp: new Date(),
    },
  };
  const lease: k8s.V1Lease = {
    metadata: { name: leaseName(short), namespace: "warmstart-system", uid: "lease-1", resourceVersion: "1" },
    spec: { holderIdentity: "e1" },
  };
  const retired: Array<[string, string]> = [];
  const cluster = fakeCluster({ pods: [leader], leases: [lease] });
  await reconcileHash(
    short,
    cluster.deps({ onRetire: (_s, reason, message) => retired.push([reason, message]) }),
  );
  assert.deepEqual(retired, [["LeaderGone", "leader pod team-a/worker-7f9c-x2 terminated"]]);
});

test("a restore is counted on the cache it asked for, its restore-from read the way admission reads it", async () => {
  const source = "abcdef0123456789";
  const own = "ff".repeat(32);
  const ready: ModelCacheObject = {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: source, resourceVersion: "1", finalizers: [FINALIZER_CLEANUP] },
    spec: { hash: source.repeat(4) },
    status: { phase: "Ready", leaderReadySeconds: 100, modelBytes: 1000 },
  };
  const restored: k8s.V1Pod = {
    metadata: {
      namespace: "team-a",
      name: "r-0",
      uid: "uid-r0",
      creationTimestamp: new Date("2026-01-01T00:00:00Z"),
      labels: { [LABEL_HASH]: own.slice(0, 16) },
      annotations: {
        [ANN_ROLE]: "restore",
        [ANN_HASH]: own,
        // Admission trims and lower-cases it before it looks the cache up.
        [ANN_RESTORE_FROM]: ` ${source.toUpperCase()} `,
      },
    },
    status: {
      phase: "Running",
      conditions: [{ type: "Ready", status: "True", lastTransitionTime: new Date("2026-01-01T00:00:12Z") }],
    },
  };
  const cluster = fakeCluster({ pods: [restored], records: [ready] });
  await reconcileHash(own.slice(0, 16), cluster.deps());
  const s = cluster.records.get(source)?.status;
  assert.equal(s?.restores, 1);
  assert.deepEqual(
    s?.recentRestores?.map((r) => [r.name, r.readySeconds]),
    [["r-0", 12]],
  );
  assert.equal(s?.savedBytes, 1000);
  assert.deepEqual(
    cluster.podPatches.map((p) => p.name),
    ["r-0"],
  );
  assert.match(JSON.stringify(cluster.podPatches[0]?.body), new RegExp(ANN_RESTORE_RECORDED));
});
