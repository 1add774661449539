/**
 * What a prewarm's main thread and its readers (prewarm-worker.ts) share: the counters, and the
 * read tasks packed so that a reader gets them as one string and two arrays (cloning 20,000 task
 * objects into each of six readers cost more CPU than looking the tree up). Kept apart from the
 * worker so that importing them never runs the worker's code.
 */
import type { ReadTask } from "./prewarm-plan.js";
/** Where each counter is in PrewarmWork.shared (hold: a slot only ever waited on). */
export const SLOTS = {
  nextSmall: 0,
  inFile: 1,
  peak: 2,
  hold: 3,
  nextBig: 4,
  bigActive: 5,
  peakBig: 6,
  count: 7,
} as const;

/** A file with this much to read is a big one (prewarm-worker.ts: read two at a time). */
export const BIG_TASK = 64 << 20;

export interface PackedTasks {
  /** Every path, one after the other; task i's is paths.slice(ends[i - 1] ?? 0, ends[i]). */
  paths: string;
  ends: Int32Array;
  sizes: Float64Array;
  /** The tasks that read only some ranges: [index, ranges]. */
  ranges: [number, [number, number][]][];
}

export function packTasks(tasks: readonly ReadTask[]): PackedTasks {
  const ends = new Int32Array(tasks.length);
  const sizes = new Float64Array(tasks.length);
  const ranges: PackedTasks["ranges"] = [];
  let end = 0;
  tasks.forEach((t, i) => {
    end += t.path.length;
    ends[i] = end;
    sizes[i] = t.size;
    if (t.ranges) ranges.push([i, t.ranges]);
  });
  return { paths: tasks.map((t) => t.path).join(""), ends, sizes, ranges };
}

/** Task `i` of a packed list; `ranges` is new Map(packed.ranges). */
export function taskAt(p: PackedTasks, ranges: Map<number, [number, number][]>, i: number): ReadTask {
  const r = ranges.get(i);
  const path = p.paths.slice(i === 0 ? 0 : p.ends[i - 1], p.ends[i]);
  return r ? { path, size: p.sizes[i] as number, ranges: r } : { path, size: p.sizes[i] as number };
}

/** The bytes task `i` has to read. */
export const bytesToRead = (p: PackedTasks, ranges: Map<number, [number, number][]>, i: number): number =>
  ranges.get(i)?.reduce((n, [a, b]) => n + b - a, 0) ?? (p.sizes[i] as number);
