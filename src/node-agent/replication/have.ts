/**
 * Filling copies: a node that is still replicating a tree serves the chunks it already holds,
 * so nodes filling at the same time feed each other instead of all waiting on the origin. What
 * a filling copy holds travels as a bitmap over the plan's chunks (planTree: every data file's
 * chunks, in manifest order, for one chunk size) in the HAVE_HEADER of every answer about its
 * tree; a committed copy sends no such header: it holds every chunk. No I/O here.
 */
import type { Manifest } from "../../datapath/manifest.js";
import { pickSource, type SourceLoad, type TreePlan } from "./plan.js";
import type { FillingTree } from "./server.js";

/** On a filling copy's answers: `<chunkBytes>:<held>:<fetching>`, each a base64 bitmap (chunk i at
 * bit i % 8 of byte i / 8): the chunks it holds, and those it is fetching now. */
export const HAVE_HEADER = "x-warmstart-have";
/** The status a filling copy answers for a range it does not hold yet. */
export const NOT_HELD_STATUS = 425;

/** Which chunks of a tree this node holds, by plan index. */
export class HaveBits {
  readonly bits: Uint8Array;
  private count = 0;

  constructor(readonly chunks: number) {
    this.bits = new Uint8Array(Math.ceil(chunks / 8));
  }

  has(i: number): boolean {
    return ((this.bits[i >> 3] as number) & (1 << (i & 7))) !== 0;
  }

  set(i: number, on: boolean): void {
    if (i < 0 || i >= this.chunks || this.has(i) === on) return;
    this.bits[i >> 3] = (this.bits[i >> 3] as number) ^ (1 << (i & 7));
    this.count += on ? 1 : -1;
  }

  get held(): number {
    return this.count;
  }

  header(chunkBytes: number, fetching?: HaveBits): string {
    const b64 = (b: Uint8Array): string => Buffer.from(b).toString("base64");
    return `${chunkBytes}:${b64(this.bits)}:${b64((fetching ?? new HaveBits(this.chunks)).bits)}`;
  }
}

/**
 * The bitmap a HAVE_HEADER carries, for a receiver whose plan has `chunks` chunks of
 * `chunkBytes`; undefined when it is malformed or was made for another chunk size or count
 * (such a copy is of no use to this receiver until it commits).
 */
export function parseHave(
  header: string,
  chunkBytes: number,
  chunks: number,
): { have: Uint8Array; fetching: Uint8Array } | undefined {
  const m = /^(\d+):([A-Za-z0-9+/]*={0,2}):([A-Za-z0-9+/]*={0,2})$/.exec(header.trim());
  if (!m || Number(m[1]) !== chunkBytes) return undefined;
  const [have, fetching] = [m[2], m[3]].map((x) => new Uint8Array(Buffer.from(x as string, "base64")));
  const size = Math.ceil(chunks / 8);
  if (have?.length !== size || fetching?.length !== size) return undefined;
  return { have, fetching };
}

/** What the scheduler knows of one source: its load, and which chunks it holds. */
export interface Holder extends SourceLoad {
  /** "all" for a committed copy; a bitmap over the plan's chunks for a filling one. */
  have: Uint8Array | "all";
  /** A filling copy's chunks in flight to it. */
  fetching?: Uint8Array;
}

const bit = (b: Uint8Array, i: number): boolean => ((b[i >> 3] ?? 0) & (1 << (i & 7))) !== 0;
export const holds = (h: Holder, chunk: number): boolean => h.have === "all" || bit(h.have, chunk);
const fetches = (h: Holder, chunk: number): boolean => h.fetching !== undefined && bit(h.fetching, chunk);

/**
 * The next chunk to fetch and where from. A filling copy is worth asking for any queued chunk it
 * holds; a committed copy (the origin, for one) only for a chunk no filling copy that could take
 * a request of ours now holds, nor any live filling copy is fetching, so the origin sends what
 * nobody else has or is getting, about once, and the copies spread the rest. Among the sources worth asking (fewer than `perSource` of our requests), the least
 * busy (pickSource); from it, the rarest of those chunks (fewest live holders), the earliest in
 * `queue` among equals, so receivers that start at different places fetch different chunks from
 * the origin. `queue` holds plan chunk indices. Returns positions in `queue` and `holders`, or
 * undefined when no source may be asked for anything now.
 */
export function pickWork(
  queue: readonly number[],
  holders: readonly Holder[],
  perSource: number,
): { at: number; source: number } | undefined {
  if (queue.length === 0) return undefined;
  const open = holders.map((h) => h.alive && h.inflight < perSource);
  // Per queued chunk: live holders, and whether a filling copy that is open holds it.
  const rarity = queue.map((c) => holders.filter((h) => h.alive && (holds(h, c) || fetches(h, c))).length);
  const spread = queue.map((c) =>
    holders.some((h, i) => h.have !== "all" && ((open[i] && holds(h, c)) || (h.alive && fetches(h, c)))),
  );
  const wanted = (h: Holder, at: number): boolean =>
    holds(h, queue[at] as number) && (h.have !== "all" || !spread[at]);
  const useful = holders.map((h, i) => (open[i] as boolean) && queue.some((_, at) => wanted(h, at)));
  const source = pickSource(holders.map((h, i) => ({ ...h, alive: useful[i] as boolean })));
  if (source === undefined) return undefined;
  const chosen = holders[source] as Holder;
  let best: number | undefined;
  for (let at = 0; at < queue.length; at++)
    if (wanted(chosen, at) && (best === undefined || (rarity[at] as number) < (rarity[best] as number)))
      best = at;
  return best === undefined ? undefined : { at: best, source };
}

/** Most of our requests one source gets: all of them when it is alone, fewer when there are
 * many, so chunks come from many copies at once. */
export function perSourceLimit(streams: number, alive: number): number {
  return Math.max(2, Math.ceil(streams / Math.max(1, alive)));
}

/** `n` chunk indices starting at `start` of the way through (0 to 1), wrapping round. */
export function rotatedOrder(n: number, start: number): number[] {
  const first = Math.min(n - 1, Math.max(0, Math.floor((start % 1) * n)));
  return Array.from({ length: n }, (_, i) => (first + i) % n);
}

/** What this node's peer server needs to serve the tree it is filling (server.ts FillingTree). */
export function fillingTree(
  plan: TreePlan,
  chunkBytes: number,
  own: HaveBits,
  fetching: HaveBits,
  parts: { raw: Buffer; manifest: Manifest; meta: Buffer; staging: string },
): FillingTree {
  const first = new Map<string, number>();
  for (const c of plan.chunks) {
    const rel = (plan.files[c.file] as TreePlan["files"][number]).rel;
    if (!first.has(rel)) first.set(rel, c.index);
  }
  return {
    ...parts,
    holds(rel, start, end) {
      const base = first.get(rel);
      if (base === undefined) return false;
      for (let k = Math.floor(start / chunkBytes); k <= Math.floor(end / chunkBytes); k++)
        if (!own.has(base + k)) return false;
      return true;
    },
    have: () => own.header(chunkBytes, fetching),
  };
}
