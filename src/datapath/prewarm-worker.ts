/**
 * One prewarm reader (a worker thread, so P readers really read at once instead of queueing on
 * libuv's four-thread pool). Files are claimed from a shared counter, in the order the list
 * gives. Each is first looked up in the page cache (native.ts: cachestat, else mincore): a file
 * already there is not read at all, one partly there is read only where it is missing, anything
 * else is read start to end into one reused buffer and the data dropped: only the page cache
 * keeps it.
 */
import { closeSync, constants as fsc, fstatSync, openSync, readSync } from "node:fs";
import { parentPort, workerData } from "node:worker_threads";
import {
  lowerIoPriority,
  missingPages,
  pageSize,
  residencyMethod,
  useResidency,
  type ResidencyMethod,
} from "./native.js";

export interface PrewarmWork {
  /** Int32 slots: [next index to claim, readers in a file now, most readers in a file at once]. */
  shared: SharedArrayBuffer;
  chunkBytes: number;
  /** Test hook: hold each open file this long, so overlap between readers can be observed. */
  holdMs: number;
  /** Residency lookup to use: "auto" (cachestat, else mincore), one of them, or none (read all). */
  residency: "auto" | ResidencyMethod | "none";
  /** Read at a lower I/O priority than the neighbours' default (ioprio_set). */
  lowPriority: boolean;
}

export interface PrewarmReport {
  /** Files read, whole or in part, and the bytes read from them. */
  files: number;
  bytes: number;
  /** Files not read at all, and bytes not read (whole files or ranges), because they were in
   * the page cache already. */
  residentFiles: number;
  residentBytes: number;
  /** How residency was looked up; null: it could not be, and everything was read. */
  residency: ResidencyMethod | null;
  lowPriority: boolean;
  errorCount: number;
  /** The first few errors, in the order they happened. */
  errors: { path: string; message: string }[];
}

const KEPT_ERRORS = 5;

const work = workerData as PrewarmWork;
if (work.residency !== "auto") useResidency(work.residency === "none" ? null : work.residency);
const slots = new Int32Array(work.shared);
const buf = Buffer.allocUnsafe(work.chunkBytes);
const report: PrewarmReport = {
  files: 0,
  bytes: 0,
  residentFiles: 0,
  residentBytes: 0,
  residency: null,
  lowPriority: work.lowPriority && lowerIoPriority(),
  errorCount: 0,
  errors: [],
};

function enter(): void {
  const now = Atomics.add(slots, 1, 1) + 1;
  for (let peak = Atomics.load(slots, 2); now > peak; peak = Atomics.load(slots, 2)) {
    if (Atomics.compareExchange(slots, 2, peak, now) === peak) break;
  }
}

/** Reads [pos, end) of `fd` (to the end of the file when it is shorter); the bytes read. */
function readRange(fd: number, pos: number, end: number): number {
  let done = 0;
  while (pos + done < end) {
    const n = readSync(fd, buf, 0, Math.min(buf.length, end - pos - done), pos + done);
    if (n === 0) break;
    done += n;
  }
  return done;
}

function warm(fd: number): void {
  const st = fstatSync(fd);
  // Swapped for something else since the listing: nothing to warm (and a device could be huge).
  if (!st.isFile()) throw new Error("no longer a regular file");
  const size = st.size;
  const missing = missingPages(fd, 0, size);
  if (missing === 0) {
    report.residentFiles += 1;
    report.residentBytes += size;
    return;
  }
  report.files += 1;
  // Nothing there, or no way to tell: one sequential read, which the kernel reads ahead of.
  if (missing === undefined || missing >= Math.ceil(size / pageSize())) {
    report.bytes += readRange(fd, 0, size);
    return;
  }
  // Partly there (a follower on a node where another replica read part of it): chunk by chunk,
  // every chunk looked up before any is read, so what the kernel reads ahead for us is not
  // taken for what was there before.
  const chunks = Math.ceil(size / buf.length);
  const there = new Uint8Array(chunks);
  for (let c = 0; c < chunks; c++) {
    const pos = c * buf.length;
    there[c] = missingPages(fd, pos, Math.min(buf.length, size - pos)) === 0 ? 1 : 0;
  }
  for (let c = 0; c < chunks; c++) {
    const pos = c * buf.length;
    const end = Math.min(size, pos + buf.length);
    if (there[c]) report.residentBytes += end - pos;
    else report.bytes += readRange(fd, pos, end);
  }
}

function readAll(paths: string[]): void {
  for (let i = Atomics.add(slots, 0, 1); i < paths.length; i = Atomics.add(slots, 0, 1)) {
    const path = paths[i] as string;
    enter();
    try {
      const fd = openSync(path, fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK);
      try {
        warm(fd);
        if (work.holdMs > 0) Atomics.wait(slots, 3, 0, work.holdMs);
      } finally {
        closeSync(fd);
      }
    } catch (err) {
      report.errorCount += 1;
      if (report.errors.length < KEPT_ERRORS) report.errors.push({ path, message: (err as Error).message });
    } finally {
      Atomics.sub(slots, 1, 1);
    }
  }
  report.residency = residencyMethod() ?? null;
}

// Started before the tree is listed, so start-up and listing overlap; the list comes as a message.
parentPort?.once("message", (paths: string[]) => {
  readAll(paths);
  parentPort?.postMessage(report);
  parentPort?.close();
});
