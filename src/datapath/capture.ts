/**
 * Capture: copy a warmed cache root into the cache store, faithfully and atomically.
 *
 * The tree is walked first (and refused whole if a symlink leads out of it), copied into a
 * staging directory beside the destination, flushed, renamed into place, and only then marked
 * ready. File data moves inside the kernel (a reflink where the filesystem shares extents,
 * copy_file_range otherwise) on worker threads, each of which hashes the file it just copied
 * from the same open descriptor with a 1 MiB buffer, so nothing is ever held whole in memory.
 */
import { randomBytes } from "node:crypto";
import { chmodSync, constants as fsc, lchownSync, mkdirSync, symlinkSync } from "node:fs";
import { lstat, mkdir, open, readdir, realpath, rename, rm, writeFile } from "node:fs/promises";
import { Worker } from "node:worker_threads";
import { availableParallelism } from "node:os";
import { basename, dirname, join, resolve } from "node:path";
import type { Logger } from "../common/log.js";
import { MANIFEST_FILE, READY_MARKER } from "../core/contract.js";
import { areaOf, MANIFEST_VERSION, readManifest, type Manifest } from "./manifest.js";
import type { CopiedFile, CopyMember, CopyTask, CopyWorkerData, FromWorker } from "./copy-worker.js";
import {
  exactTimes,
  probeCopyMethod,
  setTimesNs,
  setTimesNsSync,
  syncFilesystem,
  type CopyMethod,
} from "./native.js";
import { Progress, type ProgressSink } from "./progress.js";
import { fsyncDir, isReady, writeReadyMarker } from "./ready.js";
import {
  isMissing,
  refuseEscapingLinks,
  scanTree,
  yieldNow,
  type Scan,
  type Skipped,
  type TreeEntry,
} from "./tree.js";

export interface CaptureHooks {
  /** After the walk, before anything is copied (tests remove files here to see them vanish). */
  afterScan?: (scan: Scan) => void | Promise<void>;
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

export const DEFAULT_CAPTURE_PARALLEL = 8;
const CHUNK = 1 << 20;
const BATCH_BYTES = 8n << 20n;
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

export async function capture(opts: CaptureOptions): Promise<Manifest> {
  const t0 = performance.now();
  const parallel = checkParallel(opts.parallel ?? DEFAULT_CAPTURE_PARALLEL);
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

  const scan = await scanTree(src, { reserved: [READY_MARKER, MANIFEST_FILE] });
  if (opts.hooks?.afterScan) await opts.hooks.afterScan(scan);
  refuseEscapingLinks(scan.entries, src);
  const tScan = performance.now();

  const staging = `${dest}.tmp-${process.pid}-${randomBytes(6).toString("hex")}`;
  active.add(staging);
  try {
    await mkdir(staging, { mode: 0o700 });
    const durable = opts.durable ?? true;
    const copied = await copyTree(src, staging, scan, parallel, opts.progress);
    const tCopy = performance.now();

    if (durable) await syncFilesystem(staging);
    const tFlush = performance.now();

    const manifest = buildManifest(opts, scan, copied, {
      scanMs: tScan - t0,
      copyMs: tCopy - tScan,
      digestMs: copied.digestMs,
      commitMs: tFlush - tCopy,
      totalMs: tFlush - t0,
    });
    await writeDurably(`${staging}/${MANIFEST_FILE}`, `${JSON.stringify(manifest, null, 1)}\n`);
    const root = scan.entries[0] as TreeEntry;
    applyMeta(staging, root);
    await fsyncDir(staging);

    if (opts.hooks?.beforeCommit) await opts.hooks.beforeCommit(staging);
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
    // The marker changed the root's mtime; put the captured one back.
    await setTimesNs(dest, root.stat.atimeNs, root.stat.mtimeNs, false);
    await fsyncDir(dest);
    opts.log?.info(
      { dest, files: manifest.fileCount, bytes: manifest.totalBytes, method: manifest.captureMethod },
      "captured",
    );
    return manifest;
  } finally {
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
  symlinks: { path: string; target: string }[];
  dirs: number;
  vanished: Skipped[];
  method: CopyMethod;
  digestMs: number;
}

async function copyTree(
  src: string,
  staging: string,
  scan: Scan,
  parallel: number,
  progressOut: ProgressSink | false | undefined,
): Promise<Copied> {
  const dirs = scan.entries.filter((e) => e.kind === "dir");
  const links = scan.entries.filter((e) => e.kind === "symlink");
  // Files sharing an inode in the tree are one copy plus hard links to it.
  const groups = new Map<string, CopyTask>();
  for (const e of scan.entries) {
    if (e.kind !== "file") continue;
    const key = e.stat.nlink > 1n ? `${e.stat.dev}:${e.stat.ino}` : e.rel;
    const m = { rel: e.rel, atimeNs: e.stat.atimeNs, mtimeNs: e.stat.mtimeNs, size: e.stat.size };
    const g = groups.get(key);
    if (g) g.push(m);
    else groups.set(key, [m]);
  }
  // Largest first, so one big file does not start last and run alone.
  const size = (t: CopyTask): bigint => (t[0] as CopyMember).size;
  const tasks = [...groups.values()].sort((a, b) => (size(b) > size(a) ? 1 : size(b) < size(a) ? -1 : 0));

  let n = 0;
  for (const d of dirs) {
    if (d.rel !== "") mkdirSync(`${staging}/${d.rel}`, { mode: 0o700 });
    if (++n % 256 === 0) await yieldNow();
  }

  const sample = tasks.find((t) => size(t) > 0n)?.[0];
  const method: CopyMethod = sample ? await probeCopyMethod(`${src}/${sample.rel}`, staging) : "copy";
  const copied = await copyFiles(src, staging, tasks, parallel, { clone: method === "reflink" }, progressOut);

  const symlinks: Copied["symlinks"] = [];
  for (const e of links) {
    const dst = `${staging}/${e.rel}`;
    symlinkSync(e.target as string, dst);
    if (isRoot()) lchownSync(dst, Number(e.stat.uid), Number(e.stat.gid));
    setTimesNsSync(dst, e.stat.atimeNs, e.stat.mtimeNs, true);
    symlinks.push({ path: e.rel, target: e.target as string });
    if (++n % 256 === 0) await yieldNow();
  }

  // Directory times last, deepest first: creating anything inside a directory moves its mtime.
  const byDepth = dirs.filter((d) => d.rel !== "").sort((a, b) => depth(b.rel) - depth(a.rel));
  for (const d of byDepth) {
    applyMeta(`${staging}/${d.rel}`, d);
    if (++n % 256 === 0) await yieldNow();
  }

  const byPath = (a: { path: string }, b: { path: string }): number =>
    a.path < b.path ? -1 : a.path > b.path ? 1 : 0;
  return {
    files: copied.files.sort(byPath),
    symlinks,
    dirs: dirs.length,
    vanished: copied.vanished.map((path): Skipped => ({ path, reason: "vanished" })).sort(byPath),
    method,
    digestMs: copied.digestMs,
  };
}

const depth = (rel: string): number => rel.split("/").length;

/** Mode, owner (when we may) and nanosecond times of a directory. */
function applyMeta(path: string, e: TreeEntry): void {
  if (isRoot()) lchownSync(path, Number(e.stat.uid), Number(e.stat.gid));
  chmodSync(path, Number(e.stat.mode) & 0o7777);
  setTimesNsSync(path, e.stat.atimeNs, e.stat.mtimeNs, false);
}

/**
 * Runs the file copies on `parallel` worker threads, handing out batches (up to 64 files or
 * 8 MiB, so one batch never holds two big files). The first error stops the handing out; every
 * worker finishes its batch before this returns, so nothing writes into staging afterwards.
 */
async function copyFiles(
  src: string,
  staging: string,
  tasks: CopyTask[],
  parallel: number,
  how: { clone: boolean },
  progressOut: ProgressSink | false | undefined,
): Promise<{ files: CopiedFile[]; vanished: string[]; digestMs: number }> {
  const counters = new SharedArrayBuffer(16);
  const filesDone = new Int32Array(counters, 0, 1);
  const bytesRead = new BigInt64Array(counters, 8, 1);
  const totalBytes = tasks.reduce((n, t) => n + Number((t[0] as CopyMember).size), 0);
  const fileCount = tasks.reduce((n, t) => n + t.length, 0);
  const progress = new Progress(
    "capture",
    fileCount,
    totalBytes,
    () => ({ files: Atomics.load(filesDone, 0), bytes: Number(Atomics.load(bytesRead, 0)) }),
    progressOut === false ? null : (progressOut ?? process.stderr),
  );

  let next = 0;
  let failure: Error | undefined;
  const batch = (): CopyTask[] | null => {
    if (failure || next >= tasks.length) return null;
    const out: CopyTask[] = [];
    let bytes = 0n;
    while (next < tasks.length && out.length < 64 && bytes < BATCH_BYTES) {
      const t = tasks[next++] as CopyTask;
      out.push(t);
      bytes += (t[0] as CopyMember).size;
    }
    return out;
  };
  const workerData: CopyWorkerData = { src, staging, chunkBytes: CHUNK, ...how, counters };
  const run = (): Promise<Extract<FromWorker, { kind: "done" }> | undefined> =>
    new Promise((resolve) => {
      const w = new Worker(new URL("./copy-worker.js", import.meta.url), {
        workerData,
        execArgv: workerExecArgv(),
        resourceLimits: WORKER_LIMITS,
      });
      let result: Extract<FromWorker, { kind: "done" }> | undefined;
      w.on("message", (m: FromWorker) => {
        if (m.kind === "done") result = m;
        else {
          if (m.kind === "error") failure ??= new Error(m.message);
          w.postMessage(batch());
        }
      });
      w.once("error", (err) => (failure ??= err));
      w.once("exit", () => resolve(result));
      w.postMessage(batch());
    });

  // A worker costs tens of milliseconds and ~10 MB to start: no more of them than the work can
  // use (one per big file, one per 64 small ones) or the CPUs can run (copying and hashing from
  // the page cache keep a CPU busy; measured on 2 CPUs, a third and fourth worker only slowed
  // the capture down), and at most `parallel`.
  const big = tasks.filter((t) => (t[0] as CopyMember).size >= BATCH_BYTES).length;
  const useful = Math.max(big + 1, Math.ceil(tasks.length / 64));
  const workers = Math.max(1, Math.min(parallel, useful, Math.max(2, availableParallelism())));
  try {
    const results = await Promise.all(Array.from({ length: workers }, run));
    if (failure) throw failure;
    const out = { files: [] as CopiedFile[], vanished: [] as string[], digestMs: 0 };
    for (const r of results) {
      if (!r) throw new Error("a copy worker stopped without reporting");
      out.files.push(...r.files);
      out.vanished.push(...r.vanished);
      out.digestMs += r.digestMs;
    }
    return out;
  } finally {
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

function buildManifest(opts: CaptureOptions, scan: Scan, c: Copied, timings: Manifest["timings"]): Manifest {
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
    fileCount: c.files.length,
    totalBytes,
    dirCount: c.dirs,
    split,
    files: c.files,
    symlinks: c.symlinks,
    skipped: [...scan.skipped, ...c.vanished].sort(byPath),
    timings: {
      scanMs: round(timings.scanMs),
      copyMs: round(timings.copyMs),
      digestMs: round(timings.digestMs),
      commitMs: round(timings.commitMs),
      totalMs: round(timings.totalMs),
    },
  };
}
