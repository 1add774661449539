/**
 * Fair use of a node's store by sharing scopes (SPEC 1.7 store budget, 1.9 trust): which trees
 * pods pin, and what a capture or a fill may evict to make room. Pure, so every rule has a unit
 * test; `budget.ts` gathers the inputs and carries the plan out.
 */
import type * as k8s from "@kubernetes/client-node";
import { formatBytes } from "../datapath/progress.js";
import { ANN_HASH, ANN_ROLE, RO_VOLUME, UNADMITTED_NAMESPACES, shortHash } from "../core/contract.js";

/**
 * The part of a full store one scope may grow into at other scopes' expense. Half: whichever
 * scope holds the most, the others together keep at least as much, and a scope under its share
 * may always take room back from the one over it. Free room, and a scope's own trees, are not
 * limited by it: a store with a single scope in it is all that scope's.
 */
export const DEFAULT_SCOPE_SHARE = 0.5;

/** A capture or fill cannot have the room it needs in the store, even after removing every unused cache it may. */
export class StoreFullError extends Error {}

/** The room is refused because the asking scope holds its fair share already and only others' caches could make it. */
export class ScopeOverShareError extends StoreFullError {
  constructor(
    readonly scope: string,
    message: string,
  ) {
    super(message);
  }
}

/** Where a cache's tree counts: its record's sharing scope and the node of its live tree. */
export interface CacheWhere {
  scope: string;
  node?: string;
}

/** The roles whose decoration mounts the cache's read-only claim as RO_VOLUME (the webhook wrote both). */
const PINNING_ROLES: ReadonlySet<string> = new Set(["restore", "follower"]);

/**
 * The cache whose tree this pod pins, if any: a restore or follower Warmstart admitted (the
 * role and hash are stamps only Warmstart writes, SPEC 1.3), through the read-only volume its
 * admission gave it. A pod that mounts `rox-<short>` by hand, under any volume name, or wears
 * stamps the webhook never saw (an unadmitted namespace) pins nothing.
 */
export function pinOf(pod: k8s.V1Pod): string | undefined {
  const meta = pod.metadata;
  if (!meta?.namespace || UNADMITTED_NAMESPACES.includes(meta.namespace)) return undefined;
  const role = meta.annotations?.[ANN_ROLE] ?? "";
  const hash = meta.annotations?.[ANN_HASH] ?? "";
  if (!PINNING_ROLES.has(role) || !/^[0-9a-f]{64}$/.test(hash)) return undefined;
  const claim = pod.spec?.volumes?.find((v) => v.name === RO_VOLUME)?.persistentVolumeClaim?.claimName;
  const short = /^rox-([0-9a-f]{16})$/.exec(claim ?? "")?.[1];
  // A follower restores its own hash; only a restore may name another (restore-from).
  if (!short || (role === "follower" && short !== shortHash(hash))) return undefined;
  return short;
}

/**
 * The caches whose trees in a store are pinned (never evicted). In a node's own store a pod pins
 * the tree on the node it runs on; on the node of a cache's live tree, whose eviction deletes the
 * whole cache, every pod of the cache pins, scheduled or not. A store on a claim that several
 * nodes mount (`node` undefined) is pinned by every pod, wherever it runs. A pod outside a
 * namespace scope's namespace never pins that scope's cache (its claim is not promote's).
 */
export function pinnedOn(
  pods: readonly k8s.V1Pod[],
  node: string | undefined,
  cache: (short: string) => CacheWhere | undefined,
): Set<string> {
  const out = new Set<string>();
  for (const pod of pods) {
    const short = pinOf(pod);
    if (!short || out.has(short)) continue;
    const where = cache(short);
    const ns = pod.metadata!.namespace!;
    if (where?.scope.startsWith("namespace:") && where.scope !== `namespace:${ns}`) continue;
    if (node === undefined || pod.spec?.nodeName === node || where?.node === node) out.add(short);
  }
  return out;
}

/** A committed tree in the store, as making room sees it. `scope` is undefined when no record holds it. */
export interface HeldTree {
  short: string;
  scope: string | undefined;
  bytes: number;
  /** When a pod last restored it (ms), for least recently restored first. */
  lastUsed: number;
  /** Not pinned, not being written, promoted, read or filled here. */
  evictable: boolean;
}

export interface RoomAsk {
  short: string;
  scope: string;
  needed: number;
  budget: number;
  /** Fraction of the budget (0..1]: DEFAULT_SCOPE_SHARE. */
  share: number;
  trees: readonly HeldTree[];
  /** Room held by captures and fills in progress; counted while their tree is not listed. */
  reserved: readonly { short: string; scope: string | undefined; bytes: number }[];
}

export type Eviction = HeldTree & {
  because: "no record" | "its own scope's" | "a scope over its share" | "least recently restored";
};

export type RoomPlan =
  { ok: true; evict: Eviction[] } | { ok: false; why: "scope-over-share" | "store-full"; message: string };

/**
 * What to evict so that `needed` more bytes fit, or why not; nothing is evicted on a refusal.
 * Free room is anyone's. Trees without a record go first (nobody restores them). A scope over
 * its share (what it holds, with this tree, past `share` of the budget; a scope that holds
 * nothing else is never over, so a tree larger than the share still fits) evicts only its own
 * unused trees, least recently restored first, and is refused once those are not enough. A
 * scope within its share takes room first from the unused trees of scopes over their share, then
 * from any unused tree, least recently restored first.
 */
export function planRoom(a: RoomAsk): RoomPlan {
  const held = new Map<string, number>();
  let used = 0;
  const count = (scope: string | undefined, bytes: number): void => {
    used += bytes;
    if (scope !== undefined) held.set(scope, (held.get(scope) ?? 0) + bytes);
  };
  const listed = new Set(a.trees.map((t) => t.short));
  for (const t of a.trees) count(t.scope, t.bytes);
  for (const r of a.reserved) if (!listed.has(r.short)) count(r.scope, r.bytes);
  if (used + a.needed <= a.budget) return { ok: true, evict: [] };

  const shareBytes = Math.floor(a.share * a.budget);
  const heldBy = (s: string | undefined): number => (s === undefined ? 0 : (held.get(s) ?? 0));
  const askOver = (): boolean => heldBy(a.scope) > 0 && heldBy(a.scope) + a.needed > shareBytes;
  const initial = { used, held: heldBy(a.scope) };
  let pool = a.trees.filter((t) => t.evictable && t.short !== a.short);
  const freeable = pool.reduce((n, t) => n + t.bytes, 0);
  const lru = (xs: HeldTree[]): HeldTree | undefined =>
    xs.sort((x, y) => x.lastUsed - y.lastUsed || (x.short < y.short ? -1 : 1))[0];
  const evict: Eviction[] = [];
  while (used + a.needed > a.budget) {
    let pick: Eviction | undefined;
    const take = (t: HeldTree | undefined, because: Eviction["because"]): boolean =>
      Boolean(t && (pick = { ...t, because }));
    if (!take(lru(pool.filter((t) => t.scope === undefined)), "no record")) {
      if (askOver()) take(lru(pool.filter((t) => t.scope === a.scope)), "its own scope's");
      else if (
        !take(
          lru(pool.filter((t) => t.scope !== a.scope && heldBy(t.scope) > shareBytes)),
          "a scope over its share",
        )
      )
        take(lru(pool), "least recently restored");
    }
    if (!pick) return refusal(a, { ...initial, shareBytes, freeable, pool, over: askOver() });
    const chosen = pick;
    pool = pool.filter((t) => t.short !== chosen.short);
    used -= chosen.bytes;
    if (chosen.scope !== undefined) held.set(chosen.scope, heldBy(chosen.scope) - chosen.bytes);
    evict.push(chosen);
  }
  return { ok: true, evict };
}

function refusal(
  a: RoomAsk,
  s: { used: number; held: number; shareBytes: number; freeable: number; pool: HeldTree[]; over: boolean },
): RoomPlan {
  const f = formatBytes;
  const others = s.pool.reduce((n, t) => n + t.bytes, 0);
  if (s.over && others > 0) {
    const own = a.trees
      .filter((t) => t.scope === a.scope && t.evictable && t.short !== a.short)
      .reduce((n, t) => n + t.bytes, 0);
    return {
      ok: false,
      why: "scope-over-share",
      message: `sharing scope ${a.scope} holds ${f(s.held)} of this node's store; with ${f(a.needed)} more it would pass its fair share (${Math.round(a.share * 100)}% of the ${f(a.budget)} budget, ${f(s.shareBytes)}), so it makes room only from its own unused caches, and those hold ${f(own)}; the ${f(others)} other scopes' unused caches hold are left to them`,
    };
  }
  const inUse = a.trees.filter((t) => !t.evictable && t.short !== a.short).length;
  return {
    ok: false,
    why: "store-full",
    message: `the store budget is ${f(a.budget)}: ${f(s.used)} held, ${inUse} cache(s) in use, ${f(a.needed)} needed and only ${f(s.freeable)} unused`,
  };
}
