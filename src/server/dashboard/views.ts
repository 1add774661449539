import * as k8s from "@kubernetes/client-node";
import { PHASE } from "../../api/index.js";
import {
  ANN_DEADLINE,
  ANN_LEADER_NAMESPACE,
  ANN_ROLE,
  ANN_STORE_BUDGET,
  ANN_STORE_USED,
  ANN_STORE_CACHES,
  ANN_STORE_NODE,
  LABEL_HASH,
  LABEL_STORE,
  MODELCACHE,
  SCHEDULING_GATE,
} from "../../core/contract.js";
import { isWaitingFollower, seedOutcome, waitUntilOf } from "../../core/waiting.js";
import { liveReplicas } from "../../api/modelcache.js";
import { type ModelCacheObject, type StartupRecord } from "../../common/modelcache.js";
import { ENGINE_PHASES, type EnginePhase } from "../../core/engine-log.js";
import { redactUrlCredentials } from "../../core/env.js";

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
  /** Failed captures counted against the cache (admission goes cold past a limit; `warmstart cache retry` clears it). */
  failedCaptures: number;
  /** The node whose store holds the promoted tree. */
  node: string;
  /** Every node whose agent serves a checked copy of the tree to its peers (status.replicas). */
  copies: string[];
  /** Nodes filling a copy from their peers now, and how far each is (0 to 100). */
  filling: { node: string; percent: number }[];
  /** The leader's start by phase, and the restores' mean (from status.startups). */
  leaderStart: Partial<Record<EnginePhase, number>> | null;
  restoredStart: Partial<Record<EnginePhase, number>> | null;
  /** The restores' compile caches, as their engines reported them. */
  compileCache: { hits: number; misses: number };
  lastRestoredAt: string;
  age: string;
}

/** One node's cache store, as its agent publishes it. */
export interface StoreRow {
  node: string;
  usedBytes: number;
  /** 0: no budget. */
  budgetBytes: number;
  caches: string[];
  updated: string;
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
  /** Its start as its engine's log told it, once its node agent recorded it. */
  startup: PodStartup | null;
  /** A follower still waiting: for which cache, how far its leader has got, gated or running. */
  waitsFor: WaitsFor | null;
}

export interface WaitsFor {
  cache: string;
  /** The election's leader pod (`namespace/name`), as its record names it. */
  leader: string;
  /** The cache's phase (Electing, Capturing, Promoting, Ready, Failed). */
  phase: string;
  /** Gated (holding no node and no GPU), or running until its wait deadline. */
  gated: boolean;
  until: string | null;
}

export interface PodStartup {
  engine: string;
  seconds: Partial<Record<EnginePhase, number>>;
  compileCache: "hit" | "miss" | "unknown";
  /** Why the compile cache missed, where it can be told. */
  cause: string | null;
}

export interface Snapshot {
  caches: CacheRow[];
  stores: StoreRow[];
  elections: ElectionRow[];
  pods: PodRow[];
  totals: { savedSeconds: number; savedBytes: number; restores: number; caches: number };
}

const iso = (t: Date | string | undefined): string => (t ? new Date(t).toISOString() : "");
const toMs = (t: Date | string | undefined): number | undefined => (t ? new Date(t).getTime() : undefined);

/**
 * A pod's seconds to Ready (to a tenth), or undefined while it is not Ready. A follower's run from
 * its release (when it was scheduled): its gated wait is the leader's download, not its own start.
 * Any other pod's run from its admission.
 */
export function readySeconds(p: k8s.V1Pod): number | undefined {
  const condition = (type: string): k8s.V1PodCondition | undefined =>
    p.status?.conditions?.find((c) => c.type === type && c.status === "True");
  const from =
    p.metadata?.annotations?.[ANN_ROLE] === "follower"
      ? condition("PodScheduled")?.lastTransitionTime
      : p.metadata?.creationTimestamp;
  const start = toMs(from);
  const end = toMs(condition("Ready")?.lastTransitionTime);
  if (end === undefined || start === undefined) return undefined;
  return Math.max(0, Math.round((end - start) / 100) / 10);
}

function podStartup(e: StartupRecord | undefined): PodStartup | null {
  if (!e) return null;
  const seconds: PodStartup["seconds"] = {};
  for (const k of [...ENGINE_PHASES, "ready"] as const)
    if (typeof e.seconds[k] === "number") seconds[k] = e.seconds[k];
  return { engine: e.engine, seconds, compileCache: e.compileCache, cause: e.cause ?? null };
}

export function podRow(p: k8s.V1Pod, startups: ReadonlyMap<string, StartupRecord> = new Map()): PodRow {
  return {
    namespace: p.metadata?.namespace ?? "",
    name: p.metadata?.name ?? "",
    hash: p.metadata?.labels?.[LABEL_HASH] ?? "",
    role: p.metadata?.annotations?.[ANN_ROLE] ?? "",
    phase: p.status?.phase ?? "",
    ready: p.status?.conditions?.find((c) => c.type === "Ready")?.status === "True",
    readySeconds: readySeconds(p) ?? null,
    node: p.spec?.nodeName ?? "",
    startup: podStartup(startups.get(p.metadata?.uid ?? "")),
    waitsFor: null,
  };
}

/** What a follower that has not started yet waits for (null for any other pod). */
function waitsFor(p: k8s.V1Pod, caches: ReadonlyMap<string, ModelCacheObject>): WaitsFor | null {
  if (p.metadata?.annotations?.[ANN_ROLE] !== "follower" || p.metadata.deletionTimestamp) return null;
  const gated = (p.spec?.schedulingGates ?? []).some((g) => g.name === SCHEDULING_GATE);
  const waiting = isWaitingFollower(p) && !seedOutcome(p);
  if (!gated && !waiting) return null;
  const short = p.metadata.labels?.[LABEL_HASH] ?? "";
  const c = caches.get(short);
  const leader = c?.spec.leader;
  const until = waiting ? waitUntilOf(p) : undefined;
  return {
    cache: short,
    leader: leader?.name ? `${leader.namespace}/${leader.name}` : (leader?.namespace ?? ""),
    phase: c?.status?.phase ?? PHASE.Electing,
    gated,
    until: until !== undefined ? new Date(until).toISOString() : null,
  };
}

/** Mean seconds per phase over some starts (a phase no start reported is left out). */
function meanPhases(entries: StartupRecord[]): Partial<Record<EnginePhase, number>> | null {
  if (!entries.length) return null;
  const out: Partial<Record<EnginePhase, number>> = {};
  for (const k of [...ENGINE_PHASES, "ready"] as const) {
    const xs = entries.map((e) => e.seconds[k]).filter((x): x is number => typeof x === "number");
    if (xs.length) out[k] = Math.round((xs.reduce((a, b) => a + b, 0) / xs.length) * 100) / 100;
  }
  return out;
}

const mean = (xs: number[]): number | null => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);

/** Pure: turn the cluster's objects into the operators' rows, with the benefit of each cache. */
export function buildSnapshot(
  caches: ModelCacheObject[],
  leases: k8s.V1Lease[],
  pods: k8s.V1Pod[],
  storeLeases: k8s.V1Lease[] = [],
): Snapshot {
  const startups = new Map(caches.flatMap((c) => (c.status?.startups ?? []).map((e) => [e.uid, e] as const)));
  const byName = new Map(caches.map((c) => [c.metadata.name ?? "", c]));
  const podRows = pods.map((p) => ({ ...podRow(p, startups), waitsFor: waitsFor(p, byName) }));
  // The benefit of each cache is what its record counted as its restores turned Ready, so it
  // outlives the pods; live pods only fill in a leader time the record lacks.
  const cacheRows = caches.map((c): CacheRow => {
    const short = c.metadata.name ?? "";
    const s = c.status ?? {};
    const num = (v: unknown): number | null => (typeof v === "number" && Number.isFinite(v) ? v : null);
    const leaderReady =
      num(s.leaderReadySeconds) ??
      mean(
        podRows
          .filter((p) => p.hash === short && p.role === "leader" && p.readySeconds !== null)
          .map((p) => p.readySeconds!),
      );
    const restores = num(s.restores) ?? 0;
    const total = num(s.restoredReadySecondsTotal);
    return {
      hash: short,
      // Records are written redacted; a record from before that must not show a credential either.
      model: redactUrlCredentials(c.spec.model ?? ""),
      phase: s.phase ?? PHASE.Electing,
      reason: s.reason ?? "",
      backend: s.backend ?? "",
      sizeBytes: Number(s.sizeBytes ?? 0),
      files: Number(s.files ?? 0),
      namespaces: s.namespaces ?? [],
      leaderReadySeconds: leaderReady,
      restores,
      restoredReadySeconds: restores && total !== null ? Math.round((total / restores) * 10) / 10 : null,
      savedSeconds: num(s.savedSeconds) ?? 0,
      savedBytes: num(s.savedBytes) ?? 0,
      failedCaptures: num(s.failedCaptures) ?? 0,
      node: s.node ?? "",
      copies: Object.entries(s.replicas ?? {})
        .filter(([, r]) => !r.filling)
        .map(([n]) => n)
        .sort(),
      // A stale filling entry (its agent died mid-fill) is no fill any more.
      filling: liveReplicas(c, Date.now())
        .flatMap(([node, r]) =>
          r.filling
            ? [{ node, percent: Math.floor((100 * r.filling.doneBytes) / Math.max(1, r.filling.totalBytes)) }]
            : [],
        )
        .sort((a, b) => a.node.localeCompare(b.node)),
      leaderStart: meanPhases((s.startups ?? []).filter((e) => e.role === "leader").slice(-1)),
      restoredStart: meanPhases((s.startups ?? []).filter((e) => e.role !== "leader")),
      compileCache: {
        hits: (s.startups ?? []).filter((e) => e.role !== "leader" && e.compileCache === "hit").length,
        misses: (s.startups ?? []).filter((e) => e.role !== "leader" && e.compileCache === "miss").length,
      },
      lastRestoredAt: s.lastRestoredAt ?? "",
      age: iso(c.metadata.creationTimestamp),
    };
  });
  const elections = leases.map((l): ElectionRow => {
    const short = l.metadata?.labels?.[LABEL_HASH] ?? "";
    return {
      hash: short,
      holder: l.spec?.holderIdentity ?? "",
      leaderNamespace: l.metadata?.annotations?.[ANN_LEADER_NAMESPACE] ?? "",
      acquired: iso(l.spec?.acquireTime),
      deadline: l.metadata?.annotations?.[ANN_DEADLINE] ?? "",
      followers: podRows.filter((p) => p.hash === short && p.role === "follower" && !p.ready && !p.node)
        .length,
    };
  });
  const stores = storeLeases
    .filter((l) => l.metadata?.labels?.[LABEL_STORE])
    .map((l): StoreRow => ({
      node: l.metadata?.annotations?.[ANN_STORE_NODE] ?? l.spec?.holderIdentity ?? "",
      usedBytes: Number(l.metadata?.annotations?.[ANN_STORE_USED] ?? 0),
      budgetBytes: Number(l.metadata?.annotations?.[ANN_STORE_BUDGET] ?? 0),
      caches: (l.metadata?.annotations?.[ANN_STORE_CACHES] ?? "").split(",").filter(Boolean),
      updated: iso(l.spec?.renewTime),
    }))
    .sort((a, b) => (a.node < b.node ? -1 : 1));
  return {
    caches: cacheRows,
    stores,
    elections,
    pods: podRows,
    totals: {
      savedSeconds: cacheRows.reduce((a, c) => a + c.savedSeconds, 0),
      savedBytes: cacheRows.reduce((a, c) => a + c.savedBytes, 0),
      restores: cacheRows.reduce((a, c) => a + c.restores, 0),
      caches: cacheRows.filter((c) => c.phase === PHASE.Ready).length,
    },
  };
}

/**
 * What the API publishes: the snapshot without each election's holder id. The holder is the
 * leader pod's identity; whoever knows it can make a pod of their own look like the leader.
 */
type PublishedSnapshot = Omit<Snapshot, "elections"> & { elections: Omit<ElectionRow, "holder">[] };

export function published(s: Snapshot): PublishedSnapshot {
  return { ...s, elections: s.elections.map(({ holder: _holder, ...rest }) => rest) };
}

/** For one-shot commands (`warmstart caches`): four LISTs. Long-running servers read their caches. */
export async function fetchSnapshot(kc: k8s.KubeConfig, systemNamespace: string): Promise<Snapshot> {
  const core = kc.makeApiClient(k8s.CoreV1Api);
  const coordination = kc.makeApiClient(k8s.CoordinationV1Api);
  const custom = kc.makeApiClient(k8s.CustomObjectsApi);
  const [caches, leases, pods, stores] = await Promise.all([
    custom.listClusterCustomObject({
      group: MODELCACHE.group,
      version: MODELCACHE.version,
      plural: MODELCACHE.plural,
    }) as Promise<{ items: ModelCacheObject[] }>,
    coordination.listNamespacedLease({ namespace: systemNamespace, labelSelector: LABEL_HASH }),
    core.listPodForAllNamespaces({ labelSelector: LABEL_HASH }),
    coordination.listNamespacedLease({ namespace: systemNamespace, labelSelector: LABEL_STORE }),
  ]);
  return buildSnapshot(caches.items, leases.items, pods.items, stores.items);
}
