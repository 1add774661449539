/**
 * Capture: copy a warmed cache root into the cache store, faithfully and atomically, while the
 * pod that owns the root keeps running and may change it under us.
 *
 * The tree is walked through descriptors (tree.ts, beneath.ts): nothing is ever opened through a
 * symlink, and links that lead out of the tree, FIFOs, sockets and devices are left out and
 * listed in the manifest. It is copied into a staging directory beside the destination, flushed,
 * renamed into place, and only then marked ready. Files are copied on worker threads, each of
 * which checks a file is the one the walk saw before reading it: a big file is read once into a
 * 4 MiB buffer, digested from it and written with O_DIRECT (holes stay holes); a small one moves
 * inside the kernel (a reflink where the filesystem shares extents, copy_file_range otherwise)
 * and is digested from the same descriptor, so nothing is ever held whole in memory. A deadline
 * or the caller's signal ends a capture cleanly at any point before the commit: the copiers stop,
 * the staging directory goes, and nothing is committed.
 *
 * The staging directory is capture-staging.ts, the copy copy-tree.ts and copy-files.ts, the
 * manifest capture-manifest.ts and the deadline capture-stop.ts.
 */
import { closeSync, lchownSync, constants as fsc } from "node:fs";
import { mkdir, open, realpath, rename, rm, type FileHandle } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import type { Logger } from "../common/log.js";
import { MANIFEST_FILE, READY_MARKER } from "../core/contract.js";
import { openDirNoFollow, requireProcFd } from "./beneath.js";
import { AlreadyCapturedError, CaptureStoppedError } from "./capture-errors.js";
import { buildManifest, writeDurably } from "./capture-manifest.js";
import { activeStaging, prepareDest, removeStaleStaging, stagingPath } from "./capture-staging.js";
import { CaptureStop } from "./capture-stop.js";
import { copyTree, isRoot } from "./copy-tree.js";
import { DEFAULT_DIGEST, type DigestAlgorithm } from "./digest.js";
import { readManifest, type Manifest } from "./manifest.js";
import { setTimesNs, syncFilesystem, syncfsAvailable, syncfsFd } from "./native.js";
import { disableOpenat2 } from "./native-file.js";
import type { ProgressSink } from "./progress.js";
import { fsyncDir, writeReadyMarker } from "./ready.js";
import { isMissing, scanTree, type Scan, type TreeEntry } from "./tree.js";

export { AlreadyCapturedError, CaptureStoppedError } from "./capture-errors.js";
export { workerExecArgv } from "./copy-files.js";

export interface CaptureHooks {
  /** After the walk, before anything is copied (tests change the tree here). */
  afterScan?: (scan: Scan) => void | Promise<void>;
  /** On the main thread, just before a copier looks up the source file `rel` (a byte string);
   * the copier waits until it returns. Tests use it to change the tree mid-copy. */
  beforeOpen?: (rel: string) => void | Promise<void>;
  /** With the staging tree complete and flushed, just before the rename that commits it. */
  beforeCommit?: (staging: string) => void | Promise<void>;
  /** The tree's one flush, in place of syncfs(2) on `fd` (a descriptor of the staging folder
   * opened before the copy); tests wrap the real call to see when it happens and how often. */
  syncfs?: (fd: number, staging: string) => Promise<void>;
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
  /** Write big files with O_DIRECT, past the page cache (default true, where the filesystem
   * takes it): no second copy of the model in memory, about a third of the CPU on the bench
   * tree, and little left for the flush. False: through the page cache, so the copy stays in memory for restores on this
   * node. */
  directIo?: boolean;
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

export const DEFAULT_CAPTURE_PARALLEL = 8;
/** Long enough for a few hundred GB from a local disk; short of the default election deadline
 * (60 min), so a stuck capture fails in time for a new election. */
export const DEFAULT_CAPTURE_DEADLINE_MS = 30 * 60_000;

export function checkParallel(n: number, what = "parallel"): number {
  if (!Number.isInteger(n) || n < 1 || n > 256)
    throw new Error(`${what} must be an integer from 1 to 256, got ${n}`);
  return n;
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
  const stop = new CaptureStop(src, deadlineMs, opts.signal);
  const restoreOpenat2 = opts.noOpenat2 ? disableOpenat2() : undefined;
  const staging = stagingPath(dest);
  let flushFh: FileHandle | undefined;
  try {
    stop.check();
    const scan = await scanTree(rootFd, {
      reserved: [READY_MARKER, MANIFEST_FILE],
      checkpoint: () => stop.check(),
    });
    if (opts.hooks?.afterScan) await opts.hooks.afterScan(scan);
    stop.check();
    const tScan = performance.now();

    activeStaging.add(staging);
    await mkdir(staging, { mode: 0o700 });
    const durable = opts.durable ?? true;
    // Opened before anything is written: syncfs reports every write error of the filesystem
    // since its descriptor was opened, so this one hears of all the copy's pages, including
    // those the kernel wrote back during the copy.
    if (durable && syncfsAvailable()) flushFh = await open(staging, fsc.O_RDONLY | fsc.O_DIRECTORY);
    const copied = await copyTree(rootFd, staging, scan, {
      parallel,
      progressOut: opts.progress,
      digest,
      durable,
      direct: opts.directIo ?? true,
      stop,
      noOpenat2: opts.noOpenat2 ?? false,
      beforeOpen: opts.hooks?.beforeOpen,
    });
    stop.check();
    const tCopy = performance.now();

    // One flush for the whole tree, before anything says it is complete (ADR 0006): the copiers
    // started each file's writeback as they went, and syncfs waits for all of it, every inode
    // and directory included.
    if (flushFh) await (opts.hooks?.syncfs ?? syncfsFd)(flushFh.fd, staging);
    else if (durable) await syncFilesystem(staging);
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
    activeStaging.delete(staging);
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
    await flushFh?.close();
    stop.dispose();
    restoreOpenat2?.();
    // Only the staging directory is ours to remove: never the destination, whoever made it.
    if (activeStaging.delete(staging))
      await rm(staging, { recursive: true, force: true }).catch(() => undefined);
  }
}
