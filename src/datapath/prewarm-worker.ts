/**
 * One prewarm reader (a worker thread, so P readers really read at once instead of queueing on
 * libuv's four-thread pool). Files are claimed from a shared counter; each is read start to end
 * into one reused buffer and the data dropped: only the page cache keeps it.
 */
import { closeSync, constants as fsc, openSync, readSync } from "node:fs";
import { parentPort, workerData } from "node:worker_threads";

export interface PrewarmWork {
  /** Int32 slots: [next index to claim, readers in a file now, most readers in a file at once]. */
  shared: SharedArrayBuffer;
  chunkBytes: number;
  /** Test hook: hold each open file this long, so overlap between readers can be observed. */
  holdMs: number;
}

export interface PrewarmReport {
  files: number;
  bytes: number;
  errorCount: number;
  /** The first few errors, in the order they happened. */
  errors: { path: string; message: string }[];
}

const KEPT_ERRORS = 5;

const work = workerData as PrewarmWork;
const slots = new Int32Array(work.shared);
const buf = Buffer.allocUnsafe(work.chunkBytes);
const report: PrewarmReport = { files: 0, bytes: 0, errorCount: 0, errors: [] };

function enter(): void {
  const now = Atomics.add(slots, 1, 1) + 1;
  for (let peak = Atomics.load(slots, 2); now > peak; peak = Atomics.load(slots, 2)) {
    if (Atomics.compareExchange(slots, 2, peak, now) === peak) break;
  }
}

function readAll(paths: string[]): void {
  for (let i = Atomics.add(slots, 0, 1); i < paths.length; i = Atomics.add(slots, 0, 1)) {
    const path = paths[i] as string;
    enter();
    try {
      const fd = openSync(path, fsc.O_RDONLY | fsc.O_NOFOLLOW);
      try {
        for (;;) {
          const n = readSync(fd, buf, 0, buf.length, null);
          if (n === 0) break;
          report.bytes += n;
        }
        if (work.holdMs > 0) Atomics.wait(slots, 3, 0, work.holdMs);
        report.files += 1;
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
}

// Started before the tree is listed, so start-up and listing overlap; the list comes as a message.
parentPort?.once("message", (paths: string[]) => {
  readAll(paths);
  parentPort?.postMessage(report);
  parentPort?.close();
});
