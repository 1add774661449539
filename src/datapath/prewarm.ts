/**
 * Prewarm: read a tree once with P parallel readers so the page cache holds it before the engine
 * faults it in with small random mmap reads. Only what is missing is read: a file (or a range of
 * one) already in the page cache, as on a node where another replica just loaded the same tree,
 * is skipped after a lookup that reads nothing. Files go in the order the engine loads them
 * (prewarm-order.ts), so what it opens first is warm first. Best effort by design: a read error
 * is counted and reported, never thrown, because a slow start beats a pod that cannot start.
 */
import { lstatSync } from "node:fs";
import { Worker } from "node:worker_threads";
import { workerExecArgv } from "./copy-files.js";
import { IN_PLACE_ROOT, usedInPlace } from "./in-place.js";
import { useResidency, withLowIoPriority, type ResidencyMethod } from "./native.js";
import { listTree, loadOrder, type Listing } from "./prewarm-order.js";
import { planReads, type ReadPlan, type ReadTask } from "./prewarm-plan.js";
import { BIG_TASK, packTasks, SLOTS } from "./prewarm-slots.js";
import type { PrewarmReport, PrewarmWork } from "./prewarm-worker.js";

export const DEFAULT_PREWARM_PARALLEL = 6;
const MAX_ERRORS_SHOWN = 5;
// The same words the admission side reads in WARMSTART_PREWARM.
const OFF = ["0", "false", "no", "off"];
const ON = ["1", "true", "yes", "on"];

export interface PrewarmOptions {
  dir: string;
  /** Parallel readers (default 6). */
  parallel?: number;
  /** Skip outright (the --skip flag). */
  skip?: boolean;
  /** Name of an env var (e.g. WARMSTART_PREWARM) that turns the prewarm off ("0", "false", "no",
   * "off") or on ("1", "true", "yes", "on"); unset or anything else leaves `defaultOn` to decide. */
  respectEnv?: string;
  /** Whether to read when respectEnv says neither (default true). */
  defaultOn?: boolean;
  /** Where respectEnv is looked up (default process.env). */
  env?: NodeJS.ProcessEnv;
  /** Bytes per read (default 1 MiB): the kernel reads ahead of a sequential reader anyway, and
   * measured on a cold tree, larger reads were no faster. */
  chunkBytes?: number;
  /** Test hook: each reader holds each file open this long. */
  holdMs?: number;
  /** How to tell what is in the page cache: "auto" (default: cachestat, else mincore), one of
   * them, or "none" (read everything). */
  residency?: "auto" | ResidencyMethod | "none";
  /** Read at a lower I/O priority than other pods' reads (default true). */
  lowPriority?: boolean;
  /** Read every range into a buffer, never through a mapping (tests of that path). */
  noPopulate?: boolean;
  /** Files with this much or more to read are read two at a time, in order (default 64 MiB). */
  bigBytes?: number;
  /** `dir` is a captured tree that seed has just shadowed for this pod: only the files it left in
   * place are looked at (in-place.ts). The ones it copied were read by it a moment ago, and the
   * engine reads its own copies of them, so looking each one up again would be wasted. */
  seeded?: boolean;
}

export interface PrewarmResult {
  skipped: boolean;
  /** Why it was skipped. */
  reason?: string;
  /** Files read (whole or in part), and the bytes read. */
  files: number;
  bytes: number;
  /** Of `bytes`, those brought into the page cache through a mapping, with no copy to a reader. */
  mappedBytes: number;
  /** Files not read because they were wholly in the page cache, and the bytes not read because
   * they were (those files and the resident ranges of the others). */
  residentFiles: number;
  residentBytes: number;
  /** How residency was looked up, or null when it could not be (everything was read). */
  residency: ResidencyMethod | null;
  /** Only what seed left in place was looked at (the `seeded` option). */
  seeded: boolean;
  /** Whether the readers run at the lower I/O priority. */
  lowPriority: boolean;
  seconds: number;
  parallel: number;
  /** The most readers that were inside a file at the same moment, and inside a big one. */
  peakReaders: number;
  peakBigReaders: number;
  errorCount: number;
  /** The first few errors (path: message). */
  errors: string[];
}

export async function prewarm(opts: PrewarmOptions): Promise<PrewarmResult> {
  const parallel = opts.parallel ?? DEFAULT_PREWARM_PARALLEL;
  if (!Number.isInteger(parallel) || parallel < 1 || parallel > 256) {
    throw new Error(`parallel must be an integer from 1 to 256, got ${parallel}`);
  }
  const result: PrewarmResult = {
    skipped: false,
    files: 0,
    bytes: 0,
    mappedBytes: 0,
    residentFiles: 0,
    residentBytes: 0,
    residency: null,
    seeded: opts.seeded ?? false,
    lowPriority: false,
    seconds: 0,
    parallel,
    peakReaders: 0,
    peakBigReaders: 0,
    errorCount: 0,
    errors: [],
  };
  const env = opts.env ?? process.env;
  if (opts.skip) return { ...result, skipped: true, reason: "--skip given" };
  if (opts.respectEnv) {
    const raw = env[opts.respectEnv];
    const v = (raw ?? "").trim().toLowerCase();
    const off = OFF.includes(v) || (!ON.includes(v) && opts.defaultOn === false);
    if (off) {
      const why = raw === undefined ? `${opts.respectEnv} unset, default off` : `${opts.respectEnv}=${raw}`;
      return { ...result, skipped: true, reason: why };
    }
  }

  const start = performance.now();
  const errors: { path: string; message: string }[] = [];
  let errorCount = 0;
  const note = (path: string, err: unknown): void => {
    errorCount += 1;
    if (errors.length < MAX_ERRORS_SHOWN) errors.push({ path, message: (err as Error).message });
  };
  const chunkBytes = opts.chunkBytes ?? 1 << 20;
  let plan: ReadPlan = { tasks: [], residentFiles: 0, residentBytes: 0, residency: null };
  const mode = opts.residency ?? "auto";
  const restoreResidency = mode === "auto" ? undefined : useResidency(mode === "none" ? null : mode);
  try {
    const listing = opts.seeded ? listInPlace(opts.dir, note) : listTree(opts.dir, note);
    plan = planReads(loadOrder(listing), chunkBytes, note);
  } catch (err) {
    note(opts.dir, err);
  } finally {
    restoreResidency?.();
  }
  result.residentFiles = plan.residentFiles;
  result.residentBytes = plan.residentBytes;
  result.residency = plan.residency;

  // Readers only for what is missing: a tree already in memory starts none.
  const shared = new SharedArrayBuffer(SLOTS.count * Int32Array.BYTES_PER_ELEMENT);
  const work: PrewarmWork = {
    shared,
    chunkBytes,
    holdMs: opts.holdMs ?? 0,
    noPopulate: opts.noPopulate ?? false,
    bigBytes: opts.bigBytes ?? BIG_TASK,
  };
  let readers: ReturnType<typeof startReader>[] = [];
  // A cold tree gets every reader (small files on a cold disk are read at the disk's latency);
  // what is missing from a tree mostly in memory gets as many as it is worth.
  const count =
    plan.residentFiles + plan.residentBytes > 0
      ? readerCount(plan.tasks, parallel)
      : Math.min(parallel, plan.tasks.length);
  const startReaders = (): void => {
    readers = Array.from({ length: count }, () => startReader(work));
  };
  if (plan.tasks.length > 0) {
    if (opts.lowPriority ?? true) result.lowPriority = withLowIoPriority(startReaders);
    else startReaders();
  }
  const packed = readers.length > 0 ? packTasks(plan.tasks) : undefined;
  for (const r of readers) r.worker.postMessage(packed);
  const reports = await Promise.all(readers.map((r) => r.done));
  for (const r of reports) {
    result.files += r.files;
    result.bytes += r.bytes;
    result.mappedBytes += r.mappedBytes;
    errorCount += r.errorCount;
    for (const e of r.errors) if (errors.length < MAX_ERRORS_SHOWN) errors.push(e);
  }
  result.peakReaders = Atomics.load(new Int32Array(shared), SLOTS.peak);
  result.peakBigReaders = Atomics.load(new Int32Array(shared), SLOTS.peakBig);
  result.seconds = (performance.now() - start) / 1000;
  result.errorCount = errorCount;
  result.errors = errors.map((e) => `${e.path}: ${e.message}`);
  return result;
}

/** The files of `dir` that seed uses in place: its model folder, less what seed copies. A model
 * folder that is missing, or is not a folder, leaves nothing to read. */
function listInPlace(dir: string, note: (path: string, err: unknown) => void): Listing {
  const root = `${dir}/${IN_PLACE_ROOT}`;
  let isDir = false;
  try {
    isDir = lstatSync(root).isDirectory();
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "ENOENT") note(root, err);
  }
  if (!isDir) return { files: [], aliases: new Map() };
  const inPlace = (path: string): boolean => usedInPlace(IN_PLACE_ROOT + path.slice(root.length));
  const all = listTree(root, note);
  const files = all.files.filter(inPlace);
  const aliases = new Map([...all.aliases].filter(([link, file]) => inPlace(link) && inPlace(file)));
  return { files, aliases };
}

const EMPTY: PrewarmReport = { files: 0, bytes: 0, mappedBytes: 0, errorCount: 0, errors: [] };

/** Bytes, and files, that keep one more reader busy enough to be worth its start (tens of
 * milliseconds and a few MB each): a few files missing from a tree in memory get one reader. */
const BYTES_PER_READER = 32 << 20;
const FILES_PER_READER = 256;

/** How many readers the missing part of a tree is worth: at most `parallel`, at least one. */
export function readerCount(tasks: readonly ReadTask[], parallel: number): number {
  if (tasks.length === 0) return 0;
  let bytes = 0;
  for (const t of tasks) bytes += t.ranges ? t.ranges.reduce((n, [a, b]) => n + b - a, 0) : t.size;
  const worth = Math.max(Math.ceil(bytes / BYTES_PER_READER), Math.ceil(tasks.length / FILES_PER_READER));
  return Math.max(1, Math.min(parallel, tasks.length, worth));
}

function startReader(work: PrewarmWork): { worker: Worker; done: Promise<PrewarmReport> } {
  const worker = new Worker(new URL("./prewarm-worker.js", import.meta.url), {
    workerData: work,
    execArgv: workerExecArgv(),
  });
  const done = new Promise<PrewarmReport>((resolve) => {
    let report: PrewarmReport | undefined;
    worker.once("message", (r: PrewarmReport) => (report = r));
    // A reader that dies is one more error, not a failed prewarm.
    worker.once("error", (err) => {
      report = { ...EMPTY, errorCount: 1, errors: [{ path: "(reader)", message: err.message }] };
    });
    worker.once("exit", () => resolve(report ?? EMPTY));
  });
  return { worker, done };
}

/** The one-line summary the CLI prints: what was read, and what was not because it was in memory. */
export function describePrewarm(r: PrewarmResult): string {
  if (r.skipped) return `prewarm skipped (${r.reason ?? ""})`;
  const mb = r.bytes / 1e6;
  const rate = r.seconds > 0 ? mb / r.seconds : 0;
  const errs = r.errorCount ? `, ${r.errorCount} read errors (first: ${r.errors.join("; ")})` : ", 0 errors";
  const resident =
    r.residency === null
      ? "residency unknown, all read"
      : `${r.residentFiles} files and ${(r.residentBytes / 1e6).toFixed(1)} MB already in memory, not read (${r.residency})`;
  const scope = r.seeded ? "; only the model files used in place (seed read the rest)" : "";
  return (
    `prewarm: read ${r.files} files, ${mb.toFixed(1)} MB in ${r.seconds.toFixed(2)} s ` +
    `(${rate.toFixed(0)} MB/s, ${r.parallel} readers); ${resident}${errs}${scope}`
  );
}
