/**
 * The store budget: a capture, or a fill from peers (csi/fill.ts), makes room for what it needs
 * before it copies. Caches no engine pins go, least recently restored first, within each sharing
 * scope's fair share (fair-share.ts); a cache in use is never removed. They make room one at a
 * time, each holding what it needs until its tree is committed.
 */
import { PHASE, REASON } from "../api/index.js";
import type * as k8s from "@kubernetes/client-node";
import { Counter, type Registry } from "prom-client";
import { transition } from "../api/transitions.js";
import type { Logger } from "../common/log.js";
import { scopeOfInputs } from "../core/hash.js";
import { deleteCachePass } from "../promote/rollback.js";
import {
  DEFAULT_SCOPE_SHARE,
  pinnedOn,
  planRoom,
  ScopeOverShareError,
  StoreFullError,
  type CacheWhere,
  type HeldTree,
} from "./fair-share.js";
import type { AgentParts } from "./parts.js";
import { heldBytes } from "./store.js";

export { ScopeOverShareError, StoreFullError } from "./fair-share.js";

export interface BudgetDeps {
  /** Whether a capture or a promote of this cache runs here now (its tree is not unused). */
  busy(short: string): boolean;
  /** Removes this node's tree of a cache and its finalizer. */
  removeTree(short: string, why: string): Promise<void>;
  /** The fair share of one sharing scope, a fraction of the budget (DEFAULT_SCOPE_SHARE). */
  scopeShare?: number;
}

export class StoreBudget {
  /** Bytes held for captures and fills in progress (short hash → bytes), counted against the budget. */
  readonly reserved = new Map<string, number>();
  private making: Promise<void> = Promise.resolve();
  private readonly refusals: Counter<"reason" | "scope">;

  constructor(
    private readonly p: AgentParts,
    private readonly deps: BudgetDeps,
  ) {
    this.refusals = refusalsCounter(p.metrics.registry);
  }

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
    const scope = this.scopeOf(short) ?? `cache:${short}`;
    // Trees already evicted or found in use while room was made: never planned for again.
    const tried = new Set<string>();
    for (;;) {
      const trees = await this.p.store.list();
      if (heldBytes(trees, this.reserved) + needed <= budget) break;
      const reserved = [...this.reserved].map(([s, bytes]) => ({ short: s, scope: this.scopeOf(s), bytes }));
      const pinned = await this.pinned();
      const held: HeldTree[] = trees.map((t) => ({
        short: t.short,
        scope: this.scopeOf(t.short),
        bytes: t.manifest.totalBytes,
        lastUsed: this.lastUsed(t.short, t.manifest.createdAt),
        // A tree a capture still holds (committed, about to be promoted) is not unused.
        evictable:
          !this.reserved.has(t.short) &&
          !pinned.has(t.short) &&
          !tried.has(t.short) &&
          !this.deps.busy(t.short),
      }));
      const share = this.deps.scopeShare ?? DEFAULT_SCOPE_SHARE;
      const plan = planRoom({ short, scope, needed, budget, share, trees: held, reserved });
      if (!plan.ok) {
        this.refusals.inc({ reason: plan.why, scope });
        log.info({ scope, reason: plan.why, why: plan.message }, "store budget: no room");
        throw plan.why === "scope-over-share"
          ? new ScopeOverShareError(scope, plan.message)
          : new StoreFullError(plan.message);
      }
      // Whatever goes, the store is looked at again: a cache that turned out in use is planned around.
      for (const c of plan.evict) {
        log.info(
          {
            evict: c.short,
            scope: c.scope,
            bytes: c.bytes,
            lastUsed: new Date(c.lastUsed).toISOString(),
            for: scope,
          },
          `store budget: removing a cache no engine uses (${c.because})`,
        );
        tried.add(c.short);
        if (!(await this.evict(c.short))) break;
        this.p.metrics.evictions.inc();
      }
    }
    this.reserved.set(short, needed);
  }

  /** The sharing scope of a cache's record; undefined when the informer holds none. */
  private scopeOf(short: string): string | undefined {
    const cache = this.p.record(short);
    return cache ? scopeOfInputs(cache.spec.inputs) : undefined;
  }

  private lastUsed(short: string, createdAt: string): number {
    const cache = this.p.record(short);
    return (
      Date.parse(cache?.status?.lastRestoredAt ?? "") ||
      Date.parse(
        typeof cache?.status?.lastTransitionTime === "string" ? cache.status.lastTransitionTime : "",
      ) ||
      Date.parse(createdAt) ||
      0
    );
  }

  /** The caches whose trees in this store some engine pod pins (fair-share.ts). */
  private async pinned(): Promise<Set<string>> {
    const { node, storeClaim } = this.p.cfg;
    // A store on a claim is the other nodes' too: their pods read it.
    const here = storeClaim ? undefined : node;
    return pinnedOn(await livePods(this.p.core), here, (short): CacheWhere | undefined => {
      const cache = this.p.record(short);
      if (!cache) return undefined;
      const node = cache.status?.node;
      return { scope: scopeOfInputs(cache.spec.inputs), ...(node ? { node } : {}) };
    });
  }

  /**
   * Removes an unused cache from this node; false when a pod started to use it meanwhile. When
   * the cache's live tree is here the whole cache goes (its claims and PVs point here): it is
   * first marked unusable so no new restore is admitted, the pins are looked at once more, and
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
              reason: REASON.Deleting,
              message: `removed from node ${p.cfg.node} to make room in its store`,
            }
          : undefined;
      });
      if (!marked?.written) return false;
      if ((await this.pinned()).has(short)) {
        // A restore was admitted in between: the cache stays as it was.
        await p.records.transition(short, (c) =>
          c.status?.reason === REASON.Deleting
            ? {
                phase: before.phase ?? PHASE.Ready,
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
 * Pods not in a final phase, in every namespace. Called only when a tree is about to go (rare),
 * so it lists rather than keeping a cluster-wide pod cache in every node agent.
 */
async function livePods(core: k8s.CoreV1Api): Promise<k8s.V1Pod[]> {
  return (
    await core.listPodForAllNamespaces({ fieldSelector: "status.phase!=Succeeded,status.phase!=Failed" })
  ).items;
}

/**
 * Short hashes of the caches some live pod mounts (claim `rox-<short>` in any namespace), by
 * hand or not: a tree is never removed from under a reader when its cache is deleted. Making
 * room asks only which trees engines pin (`pinnedOn`).
 */
export async function mountedCaches(core: k8s.CoreV1Api): Promise<Set<string>> {
  const out = new Set<string>();
  for (const p of await livePods(core))
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

const refusalCounters = new WeakMap<Registry, Counter<"reason" | "scope">>();

/** Room refused to a capture or fill, by reason (store-full, scope-over-share) and the asking scope. */
function refusalsCounter(registry: Registry): Counter<"reason" | "scope"> {
  let c = refusalCounters.get(registry);
  if (!c) {
    c = new Counter({
      name: "warmstart_node_agent_store_refusals_total",
      help: "Captures and fills refused room in the store, by reason (store-full: only caches in use left; scope-over-share: the asking sharing scope holds its fair share and only other scopes' caches could make room) and the asking scope",
      labelNames: ["reason", "scope"],
      registers: [registry],
    });
    refusalCounters.set(registry, c);
  }
  return c;
}
