/**
 * Filling copies: a node that is still replicating a tree serves the chunks it already holds,
 * so nodes filling at the same time feed each other instead of all waiting on the origin. What
 * a filling copy holds travels as a bitmap over the plan's chunks (planTree: every data file's
 * chunks, in manifest order, for one chunk size) in the HAVE_HEADER of every answer about its
 * tree; a committed copy sends no such header: it holds every chunk. No I/O here.
 */
import { deflateRawSync, inflateRawSync } from "node:zlib";
import type { Manifest } from "../../datapath/manifest.js";
import { pickSource, type SourceLoad, type TreePlan } from "./plan.js";
import type { FillingTree } from "./server.js";

/** On a filling copy's answers: `<chunkBytes>:<held>:<fetching>`, each a bitmap (chunk i at bit
 * i % 8 of byte i / 8), deflated (raw) and in base64: the chunks it holds, and those it is fetching
 * now. Deflated because it rides on every answer: a 1 GiB tree in 64 KiB chunks has 2 KiB
 * bitmaps, 8% of each chunk's bytes in base64, and a filling copy's are mostly long runs. */
export const HAVE_HEADER = "x-warmstart-have";
/** The status a filling copy answers for a range it does not hold yet. */
export const NOT_HELD_STATUS = 425;

/** Which chunks of a tree this node holds, by plan index. */
export class HaveBits {
  readonly bits: Uint8Array;
  private count = 0;
  /** Bumped by every change, so an unchanged bitmap is not encoded again for the next answer. */
  private version = 0;
  private encoded?: { key: string; fetching?: HaveBits; value: string };

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
    this.version++;
  }

  get held(): number {
    return this.count;
  }

  header(chunkBytes: number, fetching?: HaveBits): string {
    const key = `${chunkBytes}:${this.version}:${fetching?.version ?? 0}`;
    if (this.encoded?.key !== key || this.encoded.fetching !== fetching) {
      const value = `${chunkBytes}:${pack(this.bits)}:${pack((fetching ?? new HaveBits(this.chunks)).bits)}`;
      this.encoded = { key, fetching, value };
    }
    return this.encoded.value;
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
  const size = Math.ceil(chunks / 8);
  const [have, fetching] = [unpack(m[2] as string, size), unpack(m[3] as string, size)];
  if (have?.length !== size || fetching?.length !== size) return undefined;
  return { have, fetching };
}

const pack = (bits: Uint8Array): string => deflateRawSync(bits, { level: 1 }).toString("base64");

/** A bitmap of `size` bytes from its header form; undefined when it is not one (a peer's header
 * is input: it may not inflate, or inflate past the plan's size, which stops it there). */
function unpack(text: string, size: number): Uint8Array | undefined {
  try {
    return new Uint8Array(
      inflateRawSync(Buffer.from(text, "base64"), { maxOutputLength: Math.max(1, size) }),
    );
  } catch {
    return undefined;
  }
}

/** What the scheduler knows of one source: its load, and which chunks it holds. */
export interface Holder extends SourceLoad {
  /** "all" for a committed copy; a bitmap over the plan's chunks for a filling one. */
  have: Uint8Array | "all";
  /** A filling copy's chunks in flight to it. */
  fetching?: Uint8Array;
}

const bit = (b: Uint8Array, i: number): boolean => ((b[i >> 3] ?? 0) & (1 << (i & 7))) !== 0;

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
  // The usual case: a worker woken by another's finished chunk while every source is at its limit.
  if (!open.includes(true)) return undefined;
  // Called for every chunk of a tree by every worker: bitmaps over plan chunks, a byte (eight
  // chunks) at a time, keep it linear in the queue, not queue times holders.
  let top = 0;
  for (const c of queue) if (c > top) top = c;
  const size = (top >> 3) + 1;
  const queued = new Uint8Array(size);
  for (const c of queue) queued[c >> 3] = (queued[c >> 3] as number) | (1 << (c & 7));
  // Chunks a filling copy that is open holds, or a live one is fetching: not the origin's job.
  const spread = new Uint8Array(size);
  holders.forEach((h, i) => {
    if (h.have === "all") return;
    if (open[i]) orInto(spread, h.have);
    if (h.alive && h.fetching) orInto(spread, h.fetching);
  });
  const forCommitted = queued.map((q, b) => q & ~(spread[b] as number));
  const committedUseful = forCommitted.some((x) => x !== 0);
  const useful = holders.map(
    (h, i) => (open[i] as boolean) && (h.have === "all" ? committedUseful : intersects(queued, h.have)),
  );
  const source = pickSource(holders.map((h, i) => ({ ...h, alive: useful[i] as boolean })));
  if (source === undefined) return undefined;
  const chosen = (holders[source] as Holder).have;
  const wanted = chosen === "all" ? forCommitted : queued.map((q, b) => q & (chosen[b] ?? 0));
  // Rarity: live filling copies holding or fetching each wanted chunk (every live committed copy
  // holds all of them, the same for each). The least, earliest in the queue among equals.
  const rarity = new Uint16Array(size * 8);
  for (const h of holders) {
    if (!h.alive || h.have === "all") continue;
    const { have, fetching = have } = h;
    for (let b = 0; b < size; b++) {
      let x = (wanted[b] as number) & ((have[b] ?? 0) | (fetching[b] ?? 0));
      for (; x !== 0; x &= x - 1) {
        const c = b * 8 + lowestBit(x);
        rarity[c] = (rarity[c] as number) + 1;
      }
    }
  }
  let best: number | undefined;
  let least = Infinity;
  for (let at = 0; at < queue.length; at++) {
    const c = queue[at] as number;
    if (bit(wanted, c) && (rarity[c] as number) < least) [best, least] = [at, rarity[c] as number];
  }
  return best === undefined ? undefined : { at: best, source };
}

/** The position of the lowest set bit of `x` (x & -x isolates it). */
const lowestBit = (x: number): number => 31 - Math.clz32(x & -x);

function orInto(into: Uint8Array, from: Uint8Array): void {
  const n = Math.min(into.length, from.length);
  for (let b = 0; b < n; b++) into[b] = (into[b] as number) | (from[b] as number);
}

function intersects(a: Uint8Array, b: Uint8Array): boolean {
  const n = Math.min(a.length, b.length);
  for (let k = 0; k < n; k++) if (((a[k] as number) & (b[k] as number)) !== 0) return true;
  return false;
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
