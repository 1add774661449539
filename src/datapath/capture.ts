/**
 * Capture: copy a warmed cache root into the cache store, faithfully and atomically, while the
 * pod that owns the root keeps running and may change it under us.
 *
 * The tree is walked through descriptors (tree.ts, beneath.ts): nothing is ever opened through a
 * symlink, and links that lead out of the tree, FIFOs, sockets and devices are left out and
 * listed in the manifest. It is copied into a staging directory beside the destination, flushed,
 * renamed into place, and only then marked ready. File data moves inside the kernel (a reflink
 * where the filesystem shares extents, copy_file_range otherwise) on worker threads, each of
 * which checks a file is the one the walk saw before reading it, then digests it from the same
 * descriptor with a 1 MiB buffer, so nothing is ever held whole in memory. A deadline or the
 * caller's signal ends a capture cleanly at any point before the commit: the copiers stop, the
 * staging directory goes, and nothing is committed.
 */
import { randomBytes } from "node:crypto";
import { chmodSync, closeSync, lchownSync, mkdirSync, symlinkSync, constants as fsc } from "node:fs";
import { lstat, mkdir, open, readdir, realpath, rename, rm, writeFile } from "node:fs/promises";
import { Worker } from "node:worker_threads";
import { availableParallelism } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import type { Logger } from "../common/log.js";
import { MANIFEST_FILE, READY_MARKER } from "../core/contract.js";
import { bytes, openDirNoFollow, openScannedFile, requireProcFd, toBin } from "./beneath.js";
import { DEFAULT_DIGEST, type DigestAlgorithm } from "./digest.js";
import { areaOf, MANIFEST_VERSION, nameFields, readManifest, type Manifest } from "./manifest.js";
import {
  COUNTERS,
  type CopiedFile,
  type CopyMember,
  type CopyTask,
  type CopyWorkerData,
  type FromWorker,
} from "./copy-protocol.js";
import {
  disableOpenat2,
  exactTimes,
  probeCopyMethod,
  setTimesNs,
  setTimesNsSync,
  syncFilesystem,
  type CopyMethod,
} from "./native.js";
import { Progress, type ProgressSink } from "./progress.js";
import { fsyncDir, isReady, writeReadyMarker } from "./ready.js";
import { isMissing, scanTree, yieldNow, type Scan, type Skipped, type TreeEntry } from "./tree.js";

export interface CaptureHooks {
  /** After the walk, before anything is copied (tests change the tree here). */
  afterScan?: (scan: Scan) => void | Promise<void>;
  /** On the main thread, just before a copier looks up the source file `rel` (a byte string);
   * the copier waits until it returns. Tests use it to change the tree mid-copy. */
  beforeOpen?: (rel: string) => void | Promise<void>;
  /** With the staging tree complete and flushed, just before the rename that commits it. */
  beforeCommit?: (staging: string) => void | Promise<void>;
}

export interface CaptureOptions {
  /** The warmed cache root (with `model/` and `cache/` below it). */
  src: string;
  /** Where the committed tree lands; must not exist yet, or be an empty directory. */
  dest: string;
  hash?: string;
  model?: string;
  /** Most files copied at once (default 8); the copiers are worker threads, no more of them
   * than the machine has CPUs (at least 2). */
  parallel?: number;
  /** Where progress is drawn when it is a TTY (default stderr); false: never. */
  progress?: ProgressSink | false;
  /** Flush the copy to disk before committing (default true), so a node crash after the ready
   * marker cannot leave files whose data never reached the disk. */
  durable?: boolean;
  /** Milliseconds the capture may take before it fails cleanly (default 30 min; 0: no limit). */
  deadlineMs?: number;
  /** Aborting it ends the capture as the deadline does (the leader went away, the agent stops). */
  signal?: AbortSignal;
  /** Digest of each file in the manifest (default BLAKE3 where its binding loads, else sha256). */
  digest?: DigestAlgorithm;
  /** Walk component by component even where openat2 exists (tests of that path). */
  noOpenat2?: boolean;
  log?: Logger;
  hooks?: CaptureHooks;
}

/** The destination already holds a committed capture; it was left untouched. */
export class AlreadyCapturedError extends Error {
  readonly code = "EALREADYCAPTURED";
  constructor(
    readonly dest: string,
    readonly manifest: Manifest | undefined,
  ) {
    super(`${dest} is already captured${manifest?.hash ? ` (hash ${manifest.hash})` : ""}; left as is`);
  }
}

/** The capture passed its deadline or was cancelled; nothing was committed. */
export class CaptureStoppedError extends Error {
  readonly code = "ECAPTURESTOPPED";
  constructor(
    readonly why: "deadline" | "aborted",
    message: string,
  ) {
    super(message);
  }
}

export const DEFAULT_CAPTURE_PARALLEL = 8;
/** Long enough for a few hundred GB from a local disk; short of the default election deadline
 * (60 min), so a stuck capture fails in time for a new election. */
export const DEFAULT_CAPTURE_DEADLINE_MS = 30 * 60_000;
const CHUNK = 1 << 20;
const BATCH_BYTES = 8n << 20n;
/** How long stopped copiers get to finish the call they are in before they are terminated. */
const STOP_GRACE_MS = 5_000;
// Workers hold a read buffer (outside the heap) and their share of the results: small heaps.
const WORKER_LIMITS = { maxYoungGenerationSizeMb: 4, maxOldGenerationSizeMb: 96 };
const isRoot = (): boolean => process.getuid?.() === 0;

/** Staging directories this process is writing now; anything else with our name pattern is stale. */
const active = new Set<string>();

export function checkParallel(n: number, what = "parallel"): number {
  if (!Number.isInteger(n) || n < 1 || n > 256)
    throw new Error(`${what} must be an integer from 1 to 256, got ${n}`);
  return n;
}

/** The deadline and the caller's signal as one: `check()` throws once either fired. */
class Stop {
  readonly signal: AbortSignal;
  private readonly ac = new AbortController();
  private why: "deadline" | "aborted" | undefined;
  private readonly timer: NodeJS.Timeout | undefined;
  private readonly onAbort = (): void => this.fire("aborted");

  constructor(
    private readonly what: string,
    private readonly deadlineMs: number,
    private readonly outer: AbortSignal | undefined,
  ) {
    this.signal = this.ac.signal;
    if (deadlineMs > 0)
      this.timer = setTimeout(() => this.fire("deadline"), Math.min(deadlineMs, 2 ** 31 - 1)).unref();
    if (outer?.aborted) this.fire("aborted");
    else outer?.addEventListener("abort", this.onAbort, { once: true });
  }

  private fire(why: "deadline" | "aborted"): void {
    if (this.why) return;
    this.why = why;
    this.ac.abort();
  }

  get fired(): boolean {
    return this.why !== undefined;
  }

  check(): void {
    if (!this.why) return;
    if (this.why === "deadline")
      throw new CaptureStoppedError(
        "deadline",
        `capture of ${this.what} passed its deadline (${Math.round(this.deadlineMs / 1000)} s); nothing was committed`,
      );
    const reason = this.outer?.reason as unknown;
    const detail =
      reason instanceof Error ? `: ${reason.message}` : typeof reason === "string" ? `: ${reason}` : "";
    throw new CaptureStoppedError(
      "aborted",
      `capture of ${this.what} was cancelled${detail}; nothing was committed`,
    );
  }

  dispose(): void {
    clearTimeout(this.timer);
    this.outer?.removeEventListener("abort", this.onAbort);
  }
}

export async function capture(opts: CaptureOptions): Promise<Manifest> {
  const t0 = performance.now();
  const parallel = checkParallel(opts.parallel ?? DEFAULT_CAPTURE_PARALLEL);
  const deadlineMs = opts.deadlineMs ?? DEFAULT_CAPTURE_DEADLINE_MS;
  if (!Number.isFinite(deadlineMs) || deadlineMs < 0)
    throw new Error(`deadlineMs must be 0 or more, got ${deadlineMs}`);
  const digest = opts.digest ?? DEFAULT_DIGEST;
  requireProcFd("capture");
  const src = await realpath(opts.src).catch((err: unknown) => {
    throw new Error(
      `cannot capture ${opts.src}: ${isMissing(err) ? "no such directory" : (err as Error).message}`,
    );
  });
  const destAbs = resolve(opts.dest);
  await mkdir(dirname(destAbs), { recursive: true });
  const parent = await realpath(dirname(destAbs));
  const dest = join(parent, basename(destAbs));
  if (dest === src || dest.startsWith(`${src}/`))
    throw new Error(`destination ${dest} is inside the source ${src}`);
  if (src.startsWith(`${dest}/`)) throw new Error(`source ${src} is inside the destination ${dest}`);

  await removeStaleStaging(parent, basename(dest));
  await prepareDest(dest);

  const rootFd = openDirNoFollow(src);
  const stop = new Stop(src, deadlineMs, opts.signal);
  const restoreOpenat2 = opts.noOpenat2 ? disableOpenat2() : undefined;
  const staging = `${dest}.tmp-${process.pid}-${randomBytes(6).toString("hex")}`;
  try {
    stop.check();
    const scan = await scanTree(rootFd, {
      reserved: [READY_MARKER, MANIFEST_FILE],
      checkpoint: () => stop.check(),
    });
    if (opts.hooks?.afterScan) await opts.hooks.afterScan(scan);
    stop.check();
    const tScan = performance.now();

    active.add(staging);
    await mkdir(staging, { mode: 0o700 });
    const durable = opts.durable ?? true;
    const copied = await copyTree(rootFd, staging, scan, {
      parallel,
      progressOut: opts.progress,
      digest,
      stop,
      noOpenat2: opts.noOpenat2 ?? false,
      beforeOpen: opts.hooks?.beforeOpen,
    });
    stop.check();
    const tCopy = performance.now();

    if (durable) await syncFilesystem(staging);
    stop.check();
    const tFlush = performance.now();

    const manifest = buildManifest(opts, digest, scan, copied, {
      scanMs: tScan - t0,
      copyMs: tCopy - tScan,
      digestMs: copied.digestMs,
      commitMs: tFlush - tCopy,
      totalMs: tFlush - t0,
    });
    await writeDurably(`${staging}/${MANIFEST_FILE}`, `${JSON.stringify(manifest, null, 1)}\n`);
    const root = scan.entries[0] as TreeEntry;
    // The root's owner now; its mode only once the marker is in (a root of mode 0555 would
    // refuse the marker to anyone but root).
    if (isRoot()) lchownSync(staging, Number(root.stat.uid), Number(root.stat.gid));
    await fsyncDir(staging);

    if (opts.hooks?.beforeCommit) await opts.hooks.beforeCommit(staging);
    // The last point a deadline or a cancel can stop the capture: past the rename it is done.
    stop.check();
    try {
      await rename(staging, dest);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      // Someone else committed first: theirs stands, ours goes.
      if (code === "ENOTEMPTY" || code === "EEXIST") {
        throw new AlreadyCapturedError(dest, await readManifest(dest).catch(() => undefined));
      }
      throw err;
    }
    active.delete(staging);
    await fsyncDir(parent);
    await writeReadyMarker(
      dest,
      `${JSON.stringify({ hash: manifest.hash, capturedAt: manifest.createdAt })}\n`,
    );
    // The captured mode, and the captured mtime back (the marker moved it), through a
    // descriptor opened first: a mode without read or write for its owner still lets it flush.
    const fh = await open(dest, fsc.O_RDONLY | fsc.O_DIRECTORY);
    try {
      await fh.chmod(Number(root.stat.mode) & 0o7777);
      await setTimesNs(dest, root.stat.atimeNs, root.stat.mtimeNs, false);
      await fh.sync();
    } finally {
      await fh.close();
    }
    opts.log?.info(
      {
        dest,
        files: manifest.fileCount,
        bytes: manifest.totalBytes,
        method: manifest.captureMethod,
        skipped: manifest.skipped.length,
      },
      "captured",
    );
    return manifest;
  } catch (err) {
    if (err instanceof CaptureStoppedError) opts.log?.warn({ src, dest, why: err.why }, "capture stopped");
    throw err;
  } finally {
    closeSync(rootFd);
    stop.dispose();
    restoreOpenat2?.();
    // Only the staging directory is ours to remove: never the destination, whoever made it.
    if (active.delete(staging)) await rm(staging, { recursive: true, force: true }).catch(() => undefined);
  }
}

/**
 * Removes `<base>.tmp-<pid>-<hex>` directories left by a run that died: their pid is gone, or is
 * ours (a restarted container gets the same pid) without the directory being one we are writing.
 */
async function removeStaleStaging(parent: string, base: string): Promise<void> {
  const prefix = `${base}.tmp-`;
  for (const name of await readdir(parent)) {
    if (!name.startsWith(prefix)) continue;
    const m = /^(\d+)-[0-9a-f]+$/.exec(name.slice(prefix.length));
    if (!m) continue;
    const pid = Number(m[1]);
    const path = join(parent, name);
    if (pid === process.pid ? active.has(path) : pidAlive(pid)) continue;
    await rm(path, { recursive: true, force: true });
  }
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Refuses to touch a committed capture or a directory that is not ours; clears our own leftovers. */
async function prepareDest(dest: string): Promise<void> {
  let st;
  try {
    st = await lstat(dest);
  } catch (err) {
    if (isMissing(err)) return;
    throw err;
  }
  if (!st.isDirectory()) throw new Error(`${dest} exists and is not a directory; refusing to overwrite it`);
  if (await isReady(dest))
    throw new AlreadyCapturedError(dest, await readManifest(dest).catch(() => undefined));
  const names = await readdir(dest);
  if (names.length === 0) return;
  if (!names.includes(MANIFEST_FILE)) {
    throw new Error(`${dest} exists and is not a capture; refusing to overwrite it`);
  }
  // Committed but never marked ready (the run died between rename and marker): not complete
  // as far as anyone can tell, so it is redone. Renamed first so a crash here leaves only a
  // staging name that the next run removes.
  const trash = `${dest}.tmp-${process.pid}-${randomBytes(6).toString("hex")}`;
  await rename(dest, trash);
  await rm(trash, { recursive: true, force: true });
}

interface Copied {
  files: CopiedFile[];
  /** Byte strings. */
  symlinks: { path: string; target: string }[];
  dirs: number;
  skipped: Skipped[];
  method: CopyMethod;
  digestMs: number;
}

interface CopyOptions {
  parallel: number;
  progressOut: ProgressSink | false | undefined;
  digest: DigestAlgorithm;
  stop: Stop;
  noOpenat2: boolean;
  beforeOpen: ((rel: string) => void | Promise<void>) | undefined;
}

async function copyTree(rootFd: number, stagingPath: string, scan: Scan, o: CopyOptions): Promise<Copied> {
  const staging = toBin(stagingPath);
  const at = (rel: string): Buffer => bytes(`${staging}/${rel}`);
  const dirs = scan.entries.filter((e) => e.kind === "dir");
  const links = scan.entries.filter((e) => e.kind === "symlink");
  // Files sharing an inode in the tree are one copy plus hard links to it.
  const groups = new Map<string, CopyTask>();
  for (const e of scan.entries) {
    if (e.kind !== "file") continue;
    const key = e.stat.nlink > 1n ? `${e.stat.dev}:${e.stat.ino}` : e.rel;
    const m: CopyMember = {
      rel: e.rel,
      atimeNs: e.stat.atimeNs,
      mtimeNs: e.stat.mtimeNs,
      size: e.stat.size,
      dev: e.stat.dev,
      ino: e.stat.ino,
    };
    const g = groups.get(key);
    if (g) g.push(m);
    else groups.set(key, [m]);
  }
  // Largest first, so one big file does not start last and run alone.
  const size = (t: CopyTask): bigint => (t[0] as CopyMember).size;
  const tasks = [...groups.values()].sort((a, b) => (size(b) > size(a) ? 1 : size(b) < size(a) ? -1 : 0));

  let n = 0;
  for (const d of dirs) {
    if (d.rel !== "") mkdirSync(at(d.rel), { mode: 0o700 });
    if (++n % 256 === 0) await yieldNow();
  }

  const method = await probeMethod(rootFd, tasks, stagingPath);
  const copied = await copyFiles(rootFd, staging, tasks, method === "reflink", o);

  const symlinks: Copied["symlinks"] = [];
  for (const e of links) {
    const dst = at(e.rel);
    symlinkSync(bytes(e.target as string), dst);
    if (isRoot()) lchownSync(dst, Number(e.stat.uid), Number(e.stat.gid));
    setTimesNsSync(dst, e.stat.atimeNs, e.stat.mtimeNs, true);
    symlinks.push({ path: e.rel, target: e.target as string });
    if (++n % 256 === 0) await yieldNow();
  }

  // Directory times last, deepest first: creating anything inside a directory moves its mtime.
  const byDepth = dirs.filter((d) => d.rel !== "").sort((a, b) => depth(b.rel) - depth(a.rel));
  for (const d of byDepth) {
    applyMeta(at(d.rel), d);
    if (++n % 256 === 0) await yieldNow();
  }

  const byPath = (a: { path: string }, b: { path: string }): number =>
    a.path < b.path ? -1 : a.path > b.path ? 1 : 0;
  return {
    files: copied.files.sort(byPath),
    symlinks,
    dirs: dirs.length,
    skipped: copied.skipped.sort(byPath),
    method,
    digestMs: copied.digestMs,
  };
}

/** The kernel primitive the copy will use, tried on the first non-empty file that is still the
 * one the walk saw (opened like any other: by descriptor, checked, non-blocking). */
async function probeMethod(rootFd: number, tasks: CopyTask[], staging: string): Promise<CopyMethod> {
  for (const t of tasks) {
    const m = t[0] as CopyMember;
    if (m.size === 0n) break;
    const o = openScannedFile(rootFd, m.rel, m);
    if (o.skip) continue;
    try {
      return await probeCopyMethod(o.fd, staging);
    } finally {
      closeSync(o.fd);
    }
  }
  return "copy";
}

const depth = (rel: string): number => rel.split("/").length;

/** Mode, owner (when we may) and nanosecond times of a directory. */
function applyMeta(path: string | Buffer, e: TreeEntry): void {
  if (isRoot()) lchownSync(path, Number(e.stat.uid), Number(e.stat.gid));
  chmodSync(path, Number(e.stat.mode) & 0o7777);
  setTimesNsSync(path, e.stat.atimeNs, e.stat.mtimeNs, false);
}

/**
 * Runs the file copies on worker threads, handing out batches (up to 64 files or 8 MiB, so one
 * batch never holds two big files). The first error, a deadline or a cancel stops the handing
 * out and tells the copiers to stop where they are; every copier is gone before this returns
 * (those that do not stop within a grace period are terminated), so nothing writes into staging
 * afterwards.
 */
async function copyFiles(
  rootFd: number,
  staging: string,
  tasks: CopyTask[],
  clone: boolean,
  o: CopyOptions,
): Promise<{ files: CopiedFile[]; skipped: Skipped[]; digestMs: number }> {
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

  let next = 0;
  let failure: Error | undefined;
  const batch = (): CopyTask[] | null => {
    if (failure || o.stop.fired || next >= tasks.length) return null;
    const out: CopyTask[] = [];
    let bytes = 0n;
    while (next < tasks.length && out.length < 64 && bytes < BATCH_BYTES) {
      const t = tasks[next++] as CopyTask;
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
      w.on("message", (m: FromWorker) => {
        if (m.kind === "done") result = m;
        else if (m.kind === "beforeOpen") {
          void Promise.resolve()
            .then(() => o.beforeOpen?.(m.rel))
            .catch((err: unknown) => void (failure ??= err as Error))
            .finally(() => answerHook(hookDone));
        } else {
          if (m.kind === "error") failure ??= new Error(m.message);
          w.postMessage(batch());
        }
      });
      w.once("error", (err) => (failure ??= err));
      w.once("exit", () => resolve(result));
      w.postMessage(batch());
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
  // the capture down), and at most `parallel`.
  const big = tasks.filter((t) => (t[0] as CopyMember).size >= BATCH_BYTES).length;
  const useful = Math.max(big + 1, Math.ceil(tasks.length / 64));
  const count = Math.max(1, Math.min(o.parallel, useful, Math.max(2, availableParallelism())));
  try {
    const results = await Promise.all(Array.from({ length: count }, run));
    o.stop.check();
    if (failure) throw failure;
    const out = { files: [] as CopiedFile[], skipped: [] as Skipped[], digestMs: 0 };
    for (const r of results) {
      if (!r) throw new Error("a copy worker stopped without reporting");
      out.files.push(...r.files);
      out.skipped.push(...r.skipped);
      out.digestMs += r.digestMs;
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

async function writeDurably(path: string, body: string): Promise<void> {
  await writeFile(path, body, { mode: 0o444 });
  const fh = await open(path, fsc.O_RDONLY);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

function buildManifest(
  opts: CaptureOptions,
  digest: DigestAlgorithm,
  scan: Scan,
  c: Copied,
  timings: Manifest["timings"],
): Manifest {
  const split: Manifest["split"] = {
    model: { files: 0, bytes: 0 },
    cache: { files: 0, bytes: 0 },
    other: { files: 0, bytes: 0 },
  };
  let totalBytes = 0;
  for (const f of c.files) {
    const area = split[areaOf(f.path)];
    area.files += 1;
    if (f.linkTo === undefined) {
      area.bytes += f.size;
      totalBytes += f.size;
    }
  }
  const round = (ms: number): number => Math.round(ms * 10) / 10;
  const byPath = (a: Skipped, b: Skipped): number => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0);
  return {
    version: MANIFEST_VERSION,
    hash: opts.hash ?? "",
    model: opts.model ?? "",
    createdAt: new Date().toISOString(),
    captureMethod: c.method,
    exactTimes,
    digest,
    fileCount: c.files.length,
    totalBytes,
    dirCount: c.dirs,
    split,
    files: c.files.map((f) => ({
      ...nameFields(f.path, "path"),
      size: f.size,
      digest: f.digest,
      ...(f.linkTo === undefined ? {} : nameFields(f.linkTo, "linkTo")),
    })),
    symlinks: c.symlinks.map((l) => ({ ...nameFields(l.path, "path"), ...nameFields(l.target, "target") })),
    skipped: [...scan.skipped, ...c.skipped]
      .sort(byPath)
      .map((s) => ({ ...nameFields(s.path, "path"), reason: s.reason })),
    timings: {
      scanMs: round(timings.scanMs),
      copyMs: round(timings.copyMs),
      digestMs: round(timings.digestMs),
      commitMs: round(timings.commitMs),
      totalMs: round(timings.totalMs),
    },
  };
}
