/**
 * The cache reconciler (key: short hash): one level-based look at one cache as this node holds
 * it. A record being deleted (or gone) takes this node's tree with it once no pod mounts it; a
 * committed tree whose record's current election was captured here is promoted (after a capture
 * job, an agent restart, or at the next resync after a failed promote); a Ready cache promoted here gets its claim in
 * namespaces that gained pods since. A status left by an earlier election is never resumed for a
 * newer one.
 */
import type * as k8s from "@kubernetes/client-node";
import { PHASE } from "../api/names.js";
import { REASON } from "../api/reasons.js";
import type { ReconcileContext, ReconcileResult } from "../common/controller/controller.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import { STALE_FILLING_MS } from "../api/modelcache.js";
import { scopeOfInputs } from "../core/hash.js";
import { sourceOf, type CacheSource } from "../promote/source.js";
import type { AgentParts } from "./parts.js";
import type { PromoteContext, PromoteOutcome, Promoter } from "./promoter.js";
import type { PeerServing } from "./peers.js";
import type { StoredTree } from "./store.js";

export interface CacheReconcilerDeps {
  node: string;
  finalizer: string;
  /** When the last resync began: a promote that failed before it is tried again. */
  lastResync(): number;
  /** The record as the informer holds it. */
  record(short: string): ModelCacheObject | undefined;
  /** The record read afresh (before anything is removed on the informer's word). */
  readRecord(short: string): Promise<ModelCacheObject | undefined>;
  stored(short: string): Promise<StoredTree | undefined>;
  /** Whether a capture of this cache runs here now (it enqueues the cache when it ends). */
  capturing(short: string): boolean;
  pod(namespace: string, name: string): k8s.V1Pod | undefined;
  removeTree(short: string, why: string): Promise<void>;
  promote(hash: string, ctx: PromoteContext): Promise<PromoteOutcome>;
  keepClaims(short: string, scope: string, source: CacheSource): Promise<boolean>;
  /** Records this node's committed copy on the cache, for peers to fetch (when it serves them). */
  advertise?(cache: ModelCacheObject): Promise<void>;
  /** Takes this node's entry off the cache's replicas. */
  forget?(short: string): Promise<void>;
  now(): number;
}

export function cacheReconciler(
  d: CacheReconcilerDeps,
): (key: string, ctx: ReconcileContext) => Promise<ReconcileResult> {
  return async (short, { log, signal }) => {
    let cache = d.record(short);
    if (cache?.metadata.deletionTimestamp) {
      if (cache.metadata.finalizers?.includes(d.finalizer))
        await d.removeTree(short, "the cache is being deleted");
      return;
    }
    const tree = await d.stored(short);
    if (!tree) return forgetStaleFilling(d, short, cache);
    if (!cache) {
      cache = await d.readRecord(short);
      if (!cache || cache.metadata.deletionTimestamp) {
        await d.removeTree(short, cache ? "the cache is being deleted" : "the cache has no record");
        return;
      }
    }
    if (d.capturing(short)) return;
    await d.advertise?.(cache);
    const status = cache.status;
    if (status?.node !== d.node || !tree.manifest.hash) return;
    const election = cache.spec.electionId;
    const ours = Boolean(election) && status.electionId === election;

    if (status.phase === PHASE.Ready) {
      const source = sourceOf(cache);
      if (source) await d.keepClaims(short, scopeOfInputs(cache.spec.inputs), source);
      return;
    }
    if (!ours) return;
    const retry = status.phase === PHASE.Failed && status.reason === REASON.PromoteFailed;
    if (retry) {
      // Retried once per resync, never on the record change its own failure made.
      const at = typeof status.lastTransitionTime === "string" ? status.lastTransitionTime : "";
      if (Date.parse(at) >= d.lastResync()) return;
    } else if (status.phase !== PHASE.Capturing && status.phase !== PHASE.Promoting) return;

    log.info({ phase: status.phase, election }, "promoting the committed tree of the record's election");
    const leader = cache.spec.leader;
    const pod = leader?.namespace && leader.name ? d.pod(leader.namespace, leader.name) : undefined;
    const isLeader = pod && (!status.leaderUid || pod.metadata?.uid === status.leaderUid);
    await d.promote(tree.manifest.hash, {
      manifest: tree.manifest,
      election: election!,
      ...(isLeader ? { pod } : {}),
      // Only a retry may move a failed promote, and only a failure from before the last resync,
      // checked on the record as written: this look may predate a failure (the promote's own
      // writes queue the cache again while it runs).
      ...(retry ? { retryFailedBefore: d.lastResync() } : {}),
      signal,
    });
  };
}

/** The cache reconciler's needs, met by the agent's parts. */
export function cacheReconcilerDeps(
  p: AgentParts,
  o: Pick<CacheReconcilerDeps, "capturing" | "removeTree" | "lastResync"> & {
    promoter: Promoter;
    peers: PeerServing | undefined;
  },
): CacheReconcilerDeps {
  return {
    node: p.cfg.node,
    finalizer: p.finalizer,
    record: p.record,
    readRecord: (short) => p.records.get(short),
    stored: (short) => p.store.stored(short),
    pod: p.pod,
    promote: async (hash, ctx) => {
      try {
        return await o.promoter.promote(hash, ctx);
      } catch (err) {
        p.metrics.promotes.inc({ result: "failed" });
        throw err;
      }
    },
    keepClaims: (short, scope, source) => o.promoter.keepClaims(short, scope, source),
    capturing: o.capturing,
    removeTree: o.removeTree,
    lastResync: o.lastResync,
    now: () => p.clock.now(),
    ...(o.peers
      ? {
          advertise: (cache) => o.peers!.advertise(p.records, cache, p.store.treeDir(cache.metadata.name!)),
          forget: (short) => o.peers!.forget(p.records, short),
        }
      : {}),
  };
}

/**
 * This node's filling entry without a tree here: a live fill rewrites it every 20 s at most
 * (csi/fill.ts), so one older than STALE_FILLING_MS was left by a fill that died with its agent.
 * It goes (checked on a fresh read first); a younger one is looked at again when it would be stale.
 */
async function forgetStaleFilling(
  d: CacheReconcilerDeps,
  short: string,
  cache: ModelCacheObject | undefined,
): Promise<ReconcileResult> {
  const age = (c: ModelCacheObject | undefined): number | undefined => {
    const mine = c?.status?.replicas?.[d.node];
    return mine?.filling ? d.now() - Date.parse(mine.at) : undefined;
  };
  const seen = age(cache);
  if (seen === undefined || !d.forget) return;
  if (seen <= STALE_FILLING_MS) return { requeueAfterMs: STALE_FILLING_MS - seen + 1000 };
  if ((age(await d.readRecord(short)) ?? 0) > STALE_FILLING_MS) await d.forget(short);
}
