/**
 * The file copies of a capture, on worker threads (copy-worker.ts), handed out in batches and
 * stopped together on the first error, a deadline or a cancel.
 */
import { Worker } from "node:worker_threads";
import { availableParallelism } from "node:os";
import type { CaptureStop } from "./capture-stop.js";
import {
  COUNTERS,
  type CopiedFile,
  type CopyMember,
  type CopyTask,
  type CopyWorkerData,
  type FromWorker,
} from "./copy-protocol.js";
import type { DigestAlgorithm } from "./digest.js";
import { Progress, type ProgressSink } from "./progress.js";
import type { Skipped } from "./tree.js";

const CHUNK = 1 << 20;
const BATCH_BYTES = 8n << 20n;
const isBig = (t: CopyTask): boolean => (t[0] as CopyMember).size >= BATCH_BYTES;
/** How long stopped copiers get to finish the call they are in before they are terminated. */
const STOP_GRACE_MS = 5_000;
// Workers hold a read buffer (outside the heap) and their share of the results: small heaps.
const WORKER_LIMITS = { maxYoungGenerationSizeMb: 4, maxOldGenerationSizeMb: 96 };

export interface CopyOptions {
  parallel: number;
  progressOut: ProgressSink | false | undefined;
  digest: DigestAlgorithm;
  /** See CopyWorkerData.durable. */
  durable: boolean;
  /** See CopyWorkerData.direct. */
  direct: boolean;
  stop: CaptureStop;
  noOpenat2: boolean;
  beforeOpen: ((rel: string) => void | Promise<void>) | undefined;
}

/**
 * Runs the file copies on worker threads, handing out batches (up to 64 files or 8 MiB, so one
 * batch never holds two big files). The first error, a deadline or a cancel stops the handing
 * out and tells the copiers to stop where they are; every copier is gone before this returns
 * (those that do not stop within a grace period are terminated), so nothing writes into staging
 * afterwards.
 */
export async function copyFiles(
  rootFd: number,
  staging: string,
  tasks: CopyTask[],
  clone: boolean,
  o: CopyOptions,
): Promise<{ files: CopiedFile[]; skipped: Skipped[]; digestMs: number; directBytes: number }> {
  const counters = new SharedArrayBuffer(COUNTERS.size);
  const filesDone = new Int32Array(counters, COUNTERS.files, 1);
  const stopFlag = new Int32Array(counters, COUNTERS.stop, 1);
  const bytesRead = new BigInt64Array(counters, COUNTERS.bytes, 1);
  const totalBytes = tasks.reduce((n, t) => n + Number((t[0] as CopyMember).size), 0);
  const fileCount = tasks.reduce((n, t) => n + t.length, 0);
  const progress = new Progress(
    "capture",
    fileCount,
    totalBytes,
    () => ({ files: Atomics.load(filesDone, 0), bytes: Number(Atomics.load(bytesRead, 0)) }),
    o.progressOut === false ? null : (o.progressOut ?? process.stderr),
  );

  let nextSmall = 0;
  let failure: Error | undefined;
  const bigTasks = tasks.filter(isBig);
  const smallTasks = tasks.filter((t) => !isBig(t));
  let nextBig = 0;
  let bigStreams = 0;
  /** The next batch for a copier; `copier.big` says whether it holds a big file. One copier
   * copies the big files, largest first, while the others copy the small ones; all take big
   * files once the small ones are done. A big file mostly waits for the disk (O_DIRECT), the
   * small ones for the CPU: measured on the bench tree with 2 CPUs, 0.6 s less than every copier
   * on the big files first. */
  const batch = (copier: { big: boolean }): CopyTask[] | null => {
    if (copier.big) bigStreams -= 1;
    copier.big = false;
    if (failure || o.stop.fired) return null;
    if (nextBig < bigTasks.length && (bigStreams === 0 || nextSmall >= smallTasks.length)) {
      bigStreams += 1;
      copier.big = true;
      return [bigTasks[nextBig++] as CopyTask];
    }
    if (nextSmall >= smallTasks.length) return null;
    const out: CopyTask[] = [];
    let bytes = 0n;
    while (nextSmall < smallTasks.length && out.length < 64 && bytes < BATCH_BYTES) {
      const t = smallTasks[nextSmall++] as CopyTask;
      out.push(t);
      bytes += (t[0] as CopyMember).size;
    }
    return out;
  };
  const workerData: Omit<CopyWorkerData, "hook"> = {
    rootFd,
    staging,
    chunkBytes: CHUNK,
    clone,
    digest: o.digest,
    durable: o.durable,
    direct: o.direct,
    noOpenat2: o.noOpenat2,
    askBeforeOpen: o.beforeOpen !== undefined,
    counters,
  };
  const workers: Worker[] = [];
  // Each copier waits on its own flag for the answer to its own question.
  const hookFlags: Int32Array[] = [];
  const answerHook = (flag: Int32Array): void => {
    Atomics.store(flag, 0, 1);
    Atomics.notify(flag, 0);
  };
  const run = (): Promise<Extract<FromWorker, { kind: "done" }> | undefined> =>
    new Promise((resolve) => {
      const hook = new SharedArrayBuffer(4);
      const hookDone = new Int32Array(hook);
      hookFlags.push(hookDone);
      const w = new Worker(new URL("./copy-worker.js", import.meta.url), {
        workerData: { ...workerData, hook } satisfies CopyWorkerData,
        execArgv: workerExecArgv(),
        resourceLimits: WORKER_LIMITS,
      });
      workers.push(w);
      let result: Extract<FromWorker, { kind: "done" }> | undefined;
      const copier = { big: false };
      w.on("message", (m: FromWorker) => {
        if (m.kind === "done") result = m;
        else if (m.kind === "beforeOpen") {
          void Promise.resolve()
            .then(() => o.beforeOpen?.(m.rel))
            .catch((err: unknown) => void (failure ??= err as Error))
            .finally(() => answerHook(hookDone));
        } else {
          if (m.kind === "error") failure ??= new Error(m.message);
          w.postMessage(batch(copier));
        }
      });
      w.once("error", (err) => (failure ??= err));
      w.once("exit", () => resolve(result));
      w.postMessage(batch(copier));
    });

  // A stop reaches the copiers through the shared flag, between two calls; a copier still busy
  // after the grace period (a call that does not return) is terminated.
  let graceTimer: NodeJS.Timeout | undefined;
  const onStop = (): void => {
    Atomics.store(stopFlag, 0, 1);
    hookFlags.forEach(answerHook);
    graceTimer = setTimeout(() => workers.forEach((w) => void w.terminate()), STOP_GRACE_MS);
  };
  if (o.stop.fired) onStop();
  else o.stop.signal.addEventListener("abort", onStop, { once: true });

  // A worker costs tens of milliseconds and ~10 MB to start: no more of them than the work can
  // use (one per big file, one per 64 small ones) or the CPUs can run (copying and hashing from
  // the page cache keep a CPU busy; measured on 2 CPUs, a third and fourth worker only slowed
  // the capture down), plus the one that copies big files with O_DIRECT (it waits for the disk
  // most of the time), and at most `parallel`.
  const useful = Math.max(bigTasks.length + 1, Math.ceil(tasks.length / 64));
  const cpus = Math.max(2, availableParallelism()) + (o.direct && !clone && bigTasks.length > 0 ? 1 : 0);
  const count = Math.max(1, Math.min(o.parallel, useful, cpus));
  try {
    const results = await Promise.all(Array.from({ length: count }, run));
    o.stop.check();
    if (failure) throw failure;
    const out = { files: [] as CopiedFile[], skipped: [] as Skipped[], digestMs: 0, directBytes: 0 };
    for (const r of results) {
      if (!r) throw new Error("a copy worker stopped without reporting");
      out.files.push(...r.files);
      out.skipped.push(...r.skipped);
      out.digestMs += r.digestMs;
      out.directBytes += r.directBytes;
    }
    return out;
  } finally {
    clearTimeout(graceTimer);
    o.stop.signal.removeEventListener("abort", onStop);
    progress.stop();
  }
}

/** The parent's node flags, less those that only make sense for a main script. */
export const workerExecArgv = (): string[] => process.execArgv.filter((a) => !a.startsWith("--input-type"));
