import * as k8s from "@kubernetes/client-node";
import { ANN_ROLE, LABEL_HASH, MODELCACHE } from "../core/contract.js";
import { type ModelCacheObject } from "../common/modelcache.js";
import { ANN_DEADLINE } from "../core/contract.js";
import { redactUrlCredentials } from "../core/env.js";

/** What operators see: caches, elections and pods, derived from the cluster's objects. */
export interface CacheRow {
  hash: string;
  model: string;
  phase: string;
  reason: string;
  backend: string;
  sizeBytes: number;
  files: number;
  namespaces: string[];
  leaderReadySeconds: number | null;
  restores: number;
  restoredReadySeconds: number | null;
  savedSeconds: number;
  savedBytes: number;
  age: string;
}

export interface ElectionRow {
  hash: string;
  holder: string;
  leaderNamespace: string;
  acquired: string;
  deadline: string;
  followers: number;
}

export interface PodRow {
  namespace: string;
  name: string;
  hash: string;
  role: string;
  phase: string;
  ready: boolean;
  readySeconds: number | null;
  node: string;
}

export interface Snapshot {
  caches: CacheRow[];
  elections: ElectionRow[];
  pods: PodRow[];
  totals: { savedSeconds: number; savedBytes: number; restores: number; caches: number };
}

const iso = (t: Date | string | undefined): string => (t ? new Date(t).toISOString() : "");

export function podRow(p: k8s.V1Pod): PodRow {
  const created = p.metadata?.creationTimestamp
    ? new Date(p.metadata.creationTimestamp).getTime()
    : undefined;
  const readyCond = p.status?.conditions?.find((c) => c.type === "Ready");
  const ready = readyCond?.status === "True";
  const readyAt =
    ready && readyCond?.lastTransitionTime ? new Date(readyCond.lastTransitionTime).getTime() : undefined;
  return {
    namespace: p.metadata?.namespace ?? "",
    name: p.metadata?.name ?? "",
    hash: p.metadata?.labels?.[LABEL_HASH] ?? "",
    role: p.metadata?.annotations?.[ANN_ROLE] ?? "",
    phase: p.status?.phase ?? "",
    ready,
    readySeconds:
      created !== undefined && readyAt !== undefined ? Math.max(0, (readyAt - created) / 1000) : null,
    node: p.spec?.nodeName ?? "",
  };
}

const mean = (xs: number[]): number | null => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);

/** Pure: turn the cluster's objects into the operators' rows, with the benefit of each cache. */
export function buildSnapshot(
  caches: ModelCacheObject[],
  leases: k8s.V1Lease[],
  pods: k8s.V1Pod[],
): Snapshot {
  const podRows = pods.map(podRow);
  const cacheRows = caches.map((c): CacheRow => {
    const short = c.metadata.name ?? "";
    const mine = podRows.filter((p) => p.hash === short);
    const restored = mine
      .filter((p) => p.role === "restore" || p.role === "follower")
      .filter((p) => p.readySeconds !== null);
    const leaderReady =
      typeof c.status?.leaderReadySeconds === "number"
        ? c.status.leaderReadySeconds
        : mean(
            mine.filter((p) => p.role === "leader" && p.readySeconds !== null).map((p) => p.readySeconds!),
          );
    const restoredReady = mean(restored.map((p) => p.readySeconds!));
    const ready = c.status?.phase === "Ready";
    const sizeBytes = Number(c.status?.sizeBytes ?? 0);
    const modelBytes = Number(c.status?.modelBytes ?? sizeBytes);
    return {
      hash: short,
      // Records are written redacted; a record from before that must not show a credential either.
      model: redactUrlCredentials(c.spec.model ?? ""),
      phase: c.status?.phase ?? "Electing",
      reason: c.status?.reason ?? "",
      backend: c.status?.backend ?? "",
      sizeBytes,
      files: Number(c.status?.files ?? 0),
      namespaces: c.status?.namespaces ?? [],
      leaderReadySeconds: leaderReady,
      restores: ready ? restored.length : 0,
      restoredReadySeconds: restoredReady,
      savedSeconds:
        ready && leaderReady !== null && restoredReady !== null
          ? Math.max(0, leaderReady - restoredReady) * restored.length
          : 0,
      savedBytes: ready ? modelBytes * restored.length : 0,
      age: iso(c.metadata.creationTimestamp),
    };
  });
  const elections = leases.map((l): ElectionRow => {
    const short = l.metadata?.labels?.[LABEL_HASH] ?? "";
    return {
      hash: short,
      holder: l.spec?.holderIdentity ?? "",
      leaderNamespace: l.metadata?.annotations?.["warmstart.dev/leader-namespace"] ?? "",
      acquired: iso(l.spec?.acquireTime),
      deadline: l.metadata?.annotations?.[ANN_DEADLINE] ?? "",
      followers: podRows.filter((p) => p.hash === short && p.role === "follower" && !p.ready && !p.node)
        .length,
    };
  });
  return {
    caches: cacheRows,
    elections,
    pods: podRows,
    totals: {
      savedSeconds: cacheRows.reduce((a, c) => a + c.savedSeconds, 0),
      savedBytes: cacheRows.reduce((a, c) => a + c.savedBytes, 0),
      restores: cacheRows.reduce((a, c) => a + c.restores, 0),
      caches: cacheRows.filter((c) => c.phase === "Ready").length,
    },
  };
}

/**
 * What the API publishes: the snapshot without each election's holder id. The holder is the
 * leader pod's identity; whoever knows it can make a pod of their own look like the leader.
 */
export type PublishedSnapshot = Omit<Snapshot, "elections"> & { elections: Omit<ElectionRow, "holder">[] };

export function published(s: Snapshot): PublishedSnapshot {
  return { ...s, elections: s.elections.map(({ holder: _holder, ...rest }) => rest) };
}

/** For one-shot commands (`warmstart caches`): three LISTs. Long-running servers read their caches. */
export async function fetchSnapshot(kc: k8s.KubeConfig, systemNamespace: string): Promise<Snapshot> {
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const coordination = kc.makeApiClient(k8s.CoordinationV1Api);
  const custom = kc.makeApiClient(k8s.CustomObjectsApi);
  const [caches, leases, pods] = await Promise.all([
    custom.listClusterCustomObject({
      group: MODELCACHE.group,
      version: MODELCACHE.version,
      plural: MODELCACHE.plural,
    }) as Promise<{ items: ModelCacheObject[] }>,
    coordination.listNamespacedLease({ namespace: systemNamespace, labelSelector: LABEL_HASH }),
    core.listPodForAllNamespaces({ labelSelector: LABEL_HASH }),
  ]);
  return buildSnapshot(caches.items, leases.items, pods.items);
}
