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
import type { ReadTask } from "./prewarm-plan.js";

export interface PrewarmWork {
  /** Int32 slots: [next index to claim, readers in a file now, most readers in a file at once]. */
  shared: SharedArrayBuffer;
  chunkBytes: number;
  /** Test hook: hold each open file this long, so overlap between readers can be observed. */
  holdMs: number;
  /** Read every range into the buffer, never through a mapping (tests of that path). */
  noPopulate: boolean;
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

const KEPT_ERRORS = 5;
/** Ranges this long or longer are populated through a mapping where that works. */
export const POPULATE_MIN = 1 << 20;
type Populate = (fd: number, offset: number, len: number) => number | undefined;
let populate: Populate | undefined;

const work = workerData as PrewarmWork;
const slots = new Int32Array(work.shared);
const buf = Buffer.allocUnsafe(work.chunkBytes);
const report: PrewarmReport = { files: 0, bytes: 0, mappedBytes: 0, errorCount: 0, errors: [] };

function enter(): void {
  const now = Atomics.add(slots, 1, 1) + 1;
  for (let peak = Atomics.load(slots, 2); now > peak; peak = Atomics.load(slots, 2)) {
    if (Atomics.compareExchange(slots, 2, peak, now) === peak) break;
  }
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

function readAll(tasks: ReadTask[]): void {
  for (let i = Atomics.add(slots, 0, 1); i < tasks.length; i = Atomics.add(slots, 0, 1)) {
    const task = tasks[i] as ReadTask;
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
        if (work.holdMs > 0) Atomics.wait(slots, 3, 0, work.holdMs);
        report.files += 1;
      } finally {
        closeSync(fd);
      }
    } catch (err) {
      report.errorCount += 1;
      if (report.errors.length < KEPT_ERRORS)
        report.errors.push({ path: task.path, message: (err as Error).message });
    } finally {
      Atomics.sub(slots, 1, 1);
    }
  }
}

// The tasks come as a message once the tree is listed and looked up.
parentPort?.once("message", (tasks: ReadTask[]) => {
  void (async () => {
    if (!work.noPopulate && tasks.some((t) => t.size >= POPULATE_MIN)) {
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
