/**
 * One prewarm reader (a worker thread, so P readers really read at once instead of queueing on
 * libuv's four-thread pool). Read tasks (prewarm-plan.ts: what is not in the page cache yet) are
 * claimed from a shared counter, in the order the list gives. A range of a megabyte or more is
 * brought in through a mapping (native-map.ts: populated, nothing copied to the reader, which
 * measured 38% of a cold prewarm's CPU when every byte went through a buffer); the rest is read
 * into one reused buffer and the data dropped: only the page cache keeps it. The native helpers
 * are loaded only when a task needs them, so a reader of small files starts on node:fs alone.
 */
import { closeSync, constants as fsc, openSync, readSync } from "node:fs";
import { parentPort, workerData } from "node:worker_threads";
import { bytesToRead, SLOTS, taskAt, type PackedTasks } from "./prewarm-slots.js";

export interface PrewarmWork {
  /** Int32 slots (SLOTS): the next small and big task to claim, readers in a file now, most
   * readers in a file at once, big files being read now. */
  shared: SharedArrayBuffer;
  chunkBytes: number;
  /** Test hook: hold each open file this long, so overlap between readers can be observed. */
  holdMs: number;
  /** Read every range into the buffer, never through a mapping (tests of that path). */
  noPopulate: boolean;
  /** What counts as a big file to read (BIG_TASK; tests use less). */
  bigBytes: number;
}

export interface PrewarmReport {
  /** Files read (whole or in part), and the bytes read from them. */
  files: number;
  bytes: number;
  /** Of `bytes`, those brought in through a mapping rather than read into a buffer. */
  mappedBytes: number;
  errorCount: number;
  /** The first few errors, in the order they happened. */
  errors: { path: string; message: string }[];
}

const S = SLOTS;
const KEPT_ERRORS = 5;
/** Ranges this long or longer are populated through a mapping where that works. */
export const POPULATE_MIN = 1 << 20;
type Populate = (fd: number, offset: number, len: number) => number | undefined;
let populate: Populate | undefined;

const work = workerData as PrewarmWork;
const slots = new Int32Array(work.shared);
const buf = Buffer.allocUnsafe(work.chunkBytes);
const report: PrewarmReport = { files: 0, bytes: 0, mappedBytes: 0, errorCount: 0, errors: [] };

/** Raises the counter at `slot` to `now` if it is lower. */
function raise(slot: number, now: number): void {
  for (let peak = Atomics.load(slots, slot); now > peak; peak = Atomics.load(slots, slot)) {
    if (Atomics.compareExchange(slots, slot, peak, now) === peak) break;
  }
}

function enter(): void {
  raise(S.peak, Atomics.add(slots, S.inFile, 1) + 1);
}

/** Reads [pos, end) of `fd` (less when the file is shorter); the bytes read. A long range is
 * populated through a mapping where that works, and read where it does not. */
function readRange(fd: number, pos: number, end: number): number {
  let done = 0;
  if (populate && Number.isFinite(end) && end - pos >= POPULATE_MIN) {
    const mapped = populate(fd, pos, end - pos);
    if (mapped !== undefined) {
      report.mappedBytes += mapped;
      done = mapped;
    }
  }
  while (pos + done < end) {
    const n = readSync(fd, buf, 0, Math.min(buf.length, end - pos - done), pos + done);
    if (n === 0) break;
    done += n;
  }
  return done;
}

/** Big files (PrewarmWork.bigBytes to read, 64 MiB by default) are read by at most BIG_STREAMS
 * readers at a time, in their order, while the others read the small files: measured on a
 * virtual disk, four sequential readers of four big files took 2 to 3 times as long as one or
 * two. */
const BIG_STREAMS = 2;
/** The next task of this reader: a big one when a stream is free, else a small one; undefined
 * when nothing is left that it may take. */
function claim(big: number[], small: number[]): { task: number; big: boolean } | undefined {
  for (;;) {
    const active = Atomics.load(slots, S.bigActive);
    if (Atomics.load(slots, S.nextBig) < big.length && active < BIG_STREAMS) {
      if (Atomics.compareExchange(slots, S.bigActive, active, active + 1) !== active) continue;
      const i = Atomics.add(slots, S.nextBig, 1);
      if (i < big.length) {
        raise(S.peakBig, active + 1);
        return { task: big[i] as number, big: true };
      }
      endStream();
      continue;
    }
    const j = Atomics.add(slots, S.nextSmall, 1);
    if (j < small.length) return { task: small[j] as number, big: false };
    if (Atomics.load(slots, S.nextBig) >= big.length) return undefined;
    // Only big files are left and both streams are busy: wait for one to end.
    Atomics.wait(slots, S.bigActive, active, 100);
  }
}

function endStream(): void {
  Atomics.sub(slots, S.bigActive, 1);
  Atomics.notify(slots, S.bigActive);
}

function readAll(packed: PackedTasks): void {
  const ranges = new Map(packed.ranges);
  const big: number[] = [];
  const small: number[] = [];
  for (let i = 0; i < packed.sizes.length; i++)
    (bytesToRead(packed, ranges, i) >= work.bigBytes ? big : small).push(i);
  for (let c = claim(big, small); c; c = claim(big, small)) {
    const task = taskAt(packed, ranges, c.task);
    enter();
    try {
      const fd = openSync(task.path, fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK);
      try {
        // A whole file: to its end, wherever that is now (populated up to the size it had).
        const whole: [number, number][] =
          populate && task.size >= POPULATE_MIN
            ? [
                [0, task.size],
                [task.size, Infinity],
              ]
            : [[0, Infinity]];
        for (const [start, end] of task.ranges ?? whole) report.bytes += readRange(fd, start, end);
        if (work.holdMs > 0) Atomics.wait(slots, S.hold, 0, work.holdMs);
        report.files += 1;
      } finally {
        closeSync(fd);
      }
    } catch (err) {
      report.errorCount += 1;
      if (report.errors.length < KEPT_ERRORS)
        report.errors.push({ path: task.path, message: (err as Error).message });
    } finally {
      Atomics.sub(slots, S.inFile, 1);
      if (c.big) endStream();
    }
  }
}

// The tasks come as a message once the tree is listed and looked up.
parentPort?.once("message", (tasks: PackedTasks) => {
  void (async () => {
    if (!work.noPopulate && tasks.sizes.some((size) => size >= POPULATE_MIN)) {
      populate = await import("./native-map.js").then(
        (m) => m.populateRange,
        () => undefined,
      );
    }
    readAll(tasks);
    parentPort?.postMessage(report);
    parentPort?.close();
  })();
});
