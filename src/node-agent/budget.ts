/**
 * The store budget: a capture, or a fill from peers (csi/fill.ts), makes room for what it needs
 * before it copies. Caches no pod mounts go, least recently restored first; a cache in use is
 * never removed. They make room one at a time, each holding what it needs until its tree is
 * committed.
 */
import type * as k8s from "@kubernetes/client-node";
import { transition } from "../api/transitions.js";
import type { Logger } from "../common/log.js";
import { formatBytes } from "../datapath/progress.js";
import { deleteCachePass } from "../promote/rollback.js";
import type { AgentParts } from "./parts.js";
import { heldBytes } from "./store.js";

/** A capture cannot have the room it needs in the store, even after removing every unused cache. */
export class StoreFullError extends Error {}

export interface BudgetDeps {
  /** Whether a capture or a promote of this cache runs here now (its tree is not unused). */
  busy(short: string): boolean;
  /** Removes this node's tree of a cache and its finalizer. */
  removeTree(short: string, why: string): Promise<void>;
}

export class StoreBudget {
  /** Bytes held for captures and fills in progress (short hash → bytes), counted against the budget. */
  readonly reserved = new Map<string, number>();
  private making: Promise<void> = Promise.resolve();

  constructor(
    private readonly p: AgentParts,
    private readonly deps: BudgetDeps,
  ) {}

  /** Makes room for `needed` more bytes under the budget; one capture or fill at a time. */
  makeRoom(short: string, needed: number, log: Logger): Promise<void> {
    const run = this.making.then(() => this.doMakeRoom(short, needed, log));
    this.making = run.catch(() => undefined);
    return run;
  }

  /** The capture or fill of `short` committed or ended: its tree (if any) counts as stored from now on. */
  release(short: string): void {
    this.reserved.delete(short);
  }

  async doMakeRoom(short: string, needed: number, log: Logger): Promise<void> {
    const budget = this.p.cfg.storeBudget;
    if (!budget) return;
    const trees = await this.p.store.list();
    let used = heldBytes(trees, this.reserved);
    if (used + needed > budget) {
      const mounted = await mountedCaches(this.p.core);
      const candidates: { short: string; bytes: number; lastUsed: number }[] = [];
      for (const t of trees) {
        // A tree a capture still holds (committed, about to be promoted) is not unused.
        if (t.short === short || this.reserved.has(t.short)) continue;
        if (mounted.has(t.short) || this.deps.busy(t.short)) continue;
        const cache = this.p.record(t.short);
        const lastUsed =
          Date.parse(cache?.status?.lastRestoredAt ?? "") ||
          Date.parse(
            typeof cache?.status?.lastTransitionTime === "string" ? cache.status.lastTransitionTime : "",
          ) ||
          Date.parse(t.manifest.createdAt) ||
          0;
        candidates.push({ short: t.short, bytes: t.manifest.totalBytes, lastUsed });
      }
      candidates.sort((a, b) => a.lastUsed - b.lastUsed);
      const freeable = candidates.reduce((n, c) => n + c.bytes, 0);
      if (used - freeable + needed > budget) {
        throw new StoreFullError(
          `the store budget is ${formatBytes(budget)}: ${formatBytes(used)} held, ${trees.filter((x) => mounted.has(x.short)).length} cache(s) in use, ${formatBytes(needed)} needed and only ${formatBytes(freeable)} unused`,
        );
      }
      for (const c of candidates) {
        if (used + needed <= budget) break;
        log.info(
          { evict: c.short, bytes: c.bytes, lastUsed: new Date(c.lastUsed).toISOString() },
          "store budget: removing a cache no pod mounts (least recently restored first)",
        );
        if (!(await this.evict(c.short))) continue;
        used -= c.bytes;
        this.p.metrics.evictions.inc();
      }
      if (used + needed > budget)
        throw new StoreFullError(
          `the store budget is ${formatBytes(budget)}: caches became in use while room was made (${formatBytes(used)} held, ${formatBytes(needed)} needed)`,
        );
    }
    this.reserved.set(short, needed);
  }

  /**
   * Removes an unused cache from this node; false when a pod started to use it meanwhile. When
   * the cache's live tree is here the whole cache goes (its claims and PVs point here): it is
   * first marked unusable so no new restore is admitted, the mounts are looked at once more, and
   * only then is it deleted. Otherwise only this node's stale copy goes.
   */
  private async evict(short: string): Promise<boolean> {
    const { p } = this;
    const cache = await p.records.get(short);
    if (cache && !cache.metadata.deletionTimestamp && cache.status?.node === p.cfg.node) {
      const before = cache.status;
      const marked = await p.records.transition(short, (c) => {
        const phase = transition(c.status?.phase, "deleting", false);
        return c.metadata.resourceVersion === cache.metadata.resourceVersion && phase !== "ignore"
          ? {
              phase,
              reason: "Deleting",
              message: `removed from node ${p.cfg.node} to make room in its store`,
            }
          : undefined;
      });
      if (!marked?.written) return false;
      if ((await mountedCaches(p.core)).has(short)) {
        // A restore was admitted in between: the cache stays as it was.
        await p.records.transition(short, (c) =>
          c.status?.reason === "Deleting"
            ? {
                phase: before.phase ?? "Ready",
                reason: before.reason ?? "",
                message: before.message ?? "",
              }
            : undefined,
        );
        return false;
      }
      await deleteCachePass(p.clients, short, { log: p.log });
    }
    await this.deps.removeTree(short, "store budget");
    return true;
  }
}

/**
 * Short hashes of the caches some live pod mounts (claim `rox-<short>` in any namespace). Every
 * pod, not only stamped ones: a pod may mount a claim by hand. Called only when a tree is about
 * to go (rare), so it lists rather than keeping a cluster-wide pod cache in every node agent.
 */
export async function mountedCaches(core: k8s.CoreV1Api): Promise<Set<string>> {
  const pods = await core.listPodForAllNamespaces({
    fieldSelector: "status.phase!=Succeeded,status.phase!=Failed",
  });
  const out = new Set<string>();
  for (const p of pods.items)
    for (const v of p.spec?.volumes ?? []) {
      const m = /^rox-([0-9a-f]{16})$/.exec(v.persistentVolumeClaim?.claimName ?? "");
      if (m) out.add(m[1]!);
    }
  return out;
}

/**
 * Removes this node's tree of a cache and then its finalizer on the record; a capture of it in
 * progress here is stopped first. With `unlessMounted`, a tree some pod still reads stays (its
 * claim going changes the record, which brings the cache back to its reconciler).
 */
export async function removeTree(
  p: AgentParts,
  short: string,
  why: string,
  o: {
    unlessMounted?: boolean;
    stopCaptures(): Promise<void>;
    storeChanged(): Promise<void>;
    /** Called once the tree is gone (this node's replica entry goes with it). */
    removed?(): Promise<void>;
  },
): Promise<void> {
  if (o.unlessMounted && (await mountedCaches(p.core)).has(short)) {
    p.log.info({ hash: short, why }, "stored tree kept for now: a pod still mounts the cache");
    return;
  }
  await o.stopCaptures();
  const removed = await p.store.remove(short);
  p.log.info({ hash: short, why, removed }, "stored tree removed");
  await o.removed?.();
  await p.records.removeFinalizer(short, p.finalizer);
  await o.storeChanged().catch(() => undefined);
}
