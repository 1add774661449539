/**
 * Capture: copy a warmed cache root into the cache store, faithfully and atomically.
 *
 * The tree is walked first (and refused whole if a symlink leads out of it), copied into a
 * staging directory beside the destination, flushed, renamed into place, and only then marked
 * ready. Data moves through the kernel (copyFile with COPYFILE_FICLONE: a reflink where the
 * filesystem shares extents, copy_file_range otherwise) while the same open file is hashed in
 * parallel, so each byte is read once by user space and never held whole in memory.
 */
import { createHash, randomBytes } from "node:crypto";
import { constants as fsc } from "node:fs";
import {
  chmod,
  copyFile,
  lchown,
  link,
  lstat,
  mkdir,
  open,
  readdir,
  realpath,
  rename,
  rm,
  symlink,
  writeFile,
  type FileHandle,
} from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import type { Logger } from "../common/log.js";
import { MANIFEST_FILE, READY_MARKER } from "../core/contract.js";
import { areaOf, MANIFEST_VERSION, readManifest, type Manifest } from "./manifest.js";
import { exactTimes, probeCopyMethod, setTimesNs, syncFilesystem, type CopyMethod } from "./native.js";
import { runPool } from "./pool.js";
import { Progress, type ProgressSink } from "./progress.js";
import { fsyncDir, isReady, writeReadyMarker } from "./ready.js";
import { isMissing, refuseEscapingLinks, scanTree, type Scan, type Skipped, type TreeEntry } from "./tree.js";

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
  /** Files copied at once (default 8). */
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
const CHUNK = 2 << 20;
const isRoot = (): boolean => process.getuid?.() === 0;

/** Staging directories this process is writing now; anything else with our name pattern is stale. */
const active = new Set<string>();

export function checkParallel(n: number, what = "parallel"): number {
  if (!Number.isInteger(n) || n < 1 || n > 256) throw new Error(`${what} must be an integer from 1 to 256, got ${n}`);
  return n;
}

export async function capture(opts: CaptureOptions): Promise<Manifest> {
  const t0 = performance.now();
  const parallel = checkParallel(opts.parallel ?? DEFAULT_CAPTURE_PARALLEL);
  const src = await realpath(opts.src).catch((err: unknown) => {
    throw new Error(`cannot capture ${opts.src}: ${isMissing(err) ? "no such directory" : (err as Error).message}`);
  });
  const destAbs = resolve(opts.dest);
  await mkdir(dirname(destAbs), { recursive: true });
  const parent = await realpath(dirname(destAbs));
  const dest = join(parent, basename(destAbs));
  if (dest === src || dest.startsWith(`${src}/`)) throw new Error(`destination ${dest} is inside the source ${src}`);
  if (src.startsWith(`${dest}/`)) throw new Error(`source ${src} is inside the destination ${dest}`);

  await removeStaleStaging(parent, basename(dest));
  await prepareDest(dest);

  const scan = await scanTree(src, { parallel, reserved: [READY_MARKER, MANIFEST_FILE] });
  if (opts.hooks?.afterScan) await opts.hooks.afterScan(scan);
  refuseEscapingLinks(scan.entries, src);
  const tScan = performance.now();

  const staging = `${dest}.tmp-${process.pid}-${randomBytes(6).toString("hex")}`;
  active.add(staging);
  try {
    await mkdir(staging, { mode: 0o700 });
    const copied = await copyTree(src, staging, scan, parallel, opts.progress);
    const tCopy = performance.now();

    if (opts.durable ?? true) await syncFilesystem(staging);
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
    await applyMeta(staging, root);
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
    await writeReadyMarker(dest, `${JSON.stringify({ hash: manifest.hash, capturedAt: manifest.createdAt })}\n`);
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
  if (await isReady(dest)) throw new AlreadyCapturedError(dest, await readManifest(dest).catch(() => undefined));
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

interface CopiedFile {
  path: string;
  size: number;
  sha256: string;
  linkTo?: string;
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
  const groups = new Map<string, TreeEntry[]>();
  for (const e of scan.entries) {
    if (e.kind !== "file") continue;
    const key = e.stat.nlink > 1n ? `${e.stat.dev}:${e.stat.ino}` : e.rel;
    const g = groups.get(key);
    if (g) g.push(e);
    else groups.set(key, [e]);
  }
  // Largest first, so one big file does not start last and run alone.
  const tasks = [...groups.values()].sort((a, b) => Number((b[0] as TreeEntry).stat.size - (a[0] as TreeEntry).stat.size));
  const totalBytes = tasks.reduce((n, g) => n + Number((g[0] as TreeEntry).stat.size), 0);
  const fileCount = tasks.reduce((n, g) => n + g.length, 0);

  for (const d of dirs) if (d.rel !== "") await mkdir(`${staging}/${d.rel}`, { mode: 0o700 });

  const sample = tasks.find((g) => (g[0] as TreeEntry).stat.size > 0n)?.[0];
  const method: CopyMethod = sample ? await probeCopyMethod(`${src}/${sample.rel}`, staging) : "copy";

  const out: Copied = { files: [], symlinks: [], dirs: dirs.length, vanished: [], method, digestMs: 0 };
  const progress = new Progress("capture", fileCount, totalBytes, progressOut === false ? undefined : progressOut);
  const buffers = Array.from({ length: Math.min(parallel, tasks.length) }, () => Buffer.allocUnsafe(CHUNK));
  try {
    await runPool(tasks, parallel, async (group, worker) => {
      const buf = buffers[worker] as Buffer;
      let primary: CopiedFile | undefined;
      for (const e of group) {
        const dst = `${staging}/${e.rel}`;
        if (!primary) {
          const r = await copyFileWithDigest(`${src}/${e.rel}`, dst, e, buf, progress);
          progress.fileDone();
          if (!r) {
            out.vanished.push({ path: e.rel, reason: "vanished" });
            continue;
          }
          out.digestMs += r.digestMs;
          primary = { path: e.rel, size: r.size, sha256: r.sha256 };
          out.files.push(primary);
          continue;
        }
        progress.fileDone();
        // Still there under this name? A name removed since the walk is not recreated.
        if (!(await lstat(`${src}/${e.rel}`).catch(() => undefined))) {
          out.vanished.push({ path: e.rel, reason: "vanished" });
          continue;
        }
        await link(`${staging}/${primary.path}`, dst);
        out.files.push({ ...primary, path: e.rel, linkTo: primary.path });
      }
    });
  } finally {
    progress.stop();
  }

  for (const e of links) {
    const dst = `${staging}/${e.rel}`;
    await symlink(e.target as string, dst);
    if (isRoot()) await lchown(dst, Number(e.stat.uid), Number(e.stat.gid));
    await setTimesNs(dst, e.stat.atimeNs, e.stat.mtimeNs, true);
    out.symlinks.push({ path: e.rel, target: e.target as string });
  }

  // Directory times last, deepest first: creating anything inside a directory moves its mtime.
  const byDepth = dirs.filter((d) => d.rel !== "").sort((a, b) => depth(b.rel) - depth(a.rel));
  for (const d of byDepth) await applyMeta(`${staging}/${d.rel}`, d);

  const byPath = (a: { path: string }, b: { path: string }): number => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0);
  out.files.sort(byPath);
  out.vanished.sort(byPath);
  return out;
}

const depth = (rel: string): number => rel.split("/").length;

/** Mode, owner (when we may) and nanosecond times of a directory. */
async function applyMeta(path: string, e: TreeEntry): Promise<void> {
  if (isRoot()) await lchown(path, Number(e.stat.uid), Number(e.stat.gid));
  await chmod(path, Number(e.stat.mode) & 0o7777);
  await setTimesNs(path, e.stat.atimeNs, e.stat.mtimeNs, false);
}

/**
 * Copies one file and hashes it in the same pass over the same open file, then sets its owner,
 * mode and times. Returns undefined when the file vanished. The source is opened once with
 * O_NOFOLLOW, and the kernel copy reads it through /proc/self/fd, so a name swapped for a symlink
 * mid-capture is never followed. A file rewritten while it is copied is copied again.
 */
async function copyFileWithDigest(
  srcPath: string,
  dst: string,
  scanned: TreeEntry,
  buf: Buffer,
  progress: Progress,
): Promise<{ size: number; sha256: string; digestMs: number } | undefined> {
  for (let attempt = 1; ; attempt++) {
    let fh: FileHandle;
    try {
      fh = await openNoFollow(srcPath);
    } catch (err) {
      if (isMissing(err) || (err as NodeJS.ErrnoException).code === "ELOOP") return undefined;
      throw err;
    }
    try {
      const before = await fh.stat({ bigint: true });
      if (!before.isFile()) return undefined;
      const [, d] = await Promise.all([
        copyFile(`/proc/self/fd/${fh.fd}`, dst, fsc.COPYFILE_FICLONE).catch((err: unknown) =>
          isMissing(err) ? copyFile(srcPath, dst, fsc.COPYFILE_FICLONE) : Promise.reject(err),
        ),
        digest(fh, buf, progress),
      ]);
      const after = await fh.stat({ bigint: true });
      const copiedSize = (await lstat(dst, { bigint: true })).size;
      if (after.mtimeNs !== before.mtimeNs || after.size !== before.size || copiedSize !== BigInt(d.size)) {
        if (attempt < 3) continue;
        throw new Error(`${srcPath} kept changing while it was copied`);
      }
      if (isRoot()) {
        await lchown(dst, Number(before.uid), Number(before.gid));
        await chmod(dst, Number(before.mode) & 0o7777);
      }
      // Unchanged since the walk: the walk's times, since reading the file (ours included) may
      // have moved its atime since. Changed: the times of the content that was copied.
      const same = before.mtimeNs === scanned.stat.mtimeNs && before.size === scanned.stat.size;
      const times = same ? scanned.stat : before;
      await setTimesNs(dst, times.atimeNs, times.mtimeNs, false);
      return d;
    } finally {
      await fh.close();
    }
  }
}

async function openNoFollow(path: string): Promise<FileHandle> {
  const flags = fsc.O_RDONLY | fsc.O_NOFOLLOW;
  try {
    // O_NOATIME keeps the source's atime as it was; allowed for the owner and for root only.
    return await open(path, flags | fsc.O_NOATIME);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EPERM") throw err;
    return await open(path, flags);
  }
}

async function digest(
  fh: FileHandle,
  buf: Buffer,
  progress: Progress,
): Promise<{ size: number; sha256: string; digestMs: number }> {
  const h = createHash("sha256");
  let pos = 0;
  let digestMs = 0;
  for (;;) {
    const { bytesRead } = await fh.read(buf, 0, buf.length, pos);
    if (bytesRead === 0) break;
    const t = performance.now();
    h.update(buf.subarray(0, bytesRead));
    digestMs += performance.now() - t;
    pos += bytesRead;
    progress.addBytes(bytesRead);
  }
  return { size: pos, sha256: h.digest("hex"), digestMs };
}

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
