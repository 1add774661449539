/**
 * One capture copier (a worker thread). It asks for batches of files, and for each file makes
 * direct, synchronous system calls: open the source once (never following a symlink), let the
 * kernel copy it through that descriptor (copyFile with COPYFILE_FICLONE: reflink, else
 * copy_file_range), hash it from the same descriptor, then set owner, mode and nanosecond times.
 * A libuv thread-pool round trip per call costs more than the calls themselves on small files,
 * and a worker keeps hashing off the main thread.
 */
import { createHash } from "node:crypto";
import {
  chmodSync,
  closeSync,
  copyFileSync,
  existsSync,
  constants as fsc,
  fstatSync,
  linkSync,
  lchownSync,
  lstatSync,
  openSync,
  readSync,
} from "node:fs";
import { parentPort, workerData } from "node:worker_threads";
import { setTimesNsSync } from "./native.js";

export interface CopyMember {
  rel: string;
  atimeNs: bigint;
  mtimeNs: bigint;
  size: bigint;
}

/** One inode: the first name is copied, the others become hard links to it. */
export type CopyTask = CopyMember[];

export interface CopyWorkerData {
  src: string;
  staging: string;
  chunkBytes: number;
  /** COPYFILE_FICLONE where the probe found reflinks; 0 skips a clone attempt bound to fail
   * (copy_file_range is then the first thing tried). */
  copyFlags: number;
  /** Int32 [files done] then BigInt64 [bytes read], for the progress line. */
  counters: SharedArrayBuffer;
}

export interface CopiedFile {
  path: string;
  size: number;
  sha256: string;
  linkTo?: string;
}

export type FromWorker =
  | { kind: "more" }
  | { kind: "done"; files: CopiedFile[]; vanished: string[]; digestMs: number }
  | { kind: "error"; message: string };

const data = workerData as CopyWorkerData;
const filesDone = new Int32Array(data.counters, 0, 1);
const bytesRead = new BigInt64Array(data.counters, 8, 1);
const buf = Buffer.allocUnsafe(data.chunkBytes);
const root = process.getuid?.() === 0;
const myUid = BigInt(process.getuid?.() ?? -1);
const myGid = BigInt(process.getgid?.() ?? -1);
const viaProc = existsSync("/proc/self/fd");

const missing = (err: unknown): boolean => {
  const code = (err as NodeJS.ErrnoException).code;
  return code === "ENOENT" || code === "ENOTDIR" || code === "ELOOP";
};

function openSource(path: string): number {
  const flags = fsc.O_RDONLY | fsc.O_NOFOLLOW;
  try {
    // O_NOATIME leaves the source's atime alone; only its owner and root may ask for it.
    return openSync(path, flags | fsc.O_NOATIME);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EPERM") throw err;
    return openSync(path, flags);
  }
}

/** Copies and hashes one file; undefined when it vanished. A file rewritten meanwhile is redone. */
function copyOne(m: CopyMember, dst: string): { size: number; sha256: string; digestMs: number } | undefined {
  const srcPath = `${data.src}/${m.rel}`;
  for (let attempt = 1; ; attempt++) {
    let fd: number;
    try {
      fd = openSource(srcPath);
    } catch (err) {
      if (missing(err)) return undefined;
      throw err;
    }
    try {
      const before = fstatSync(fd, { bigint: true });
      if (!before.isFile()) return undefined;
      // Through the descriptor: a name swapped for a symlink since the walk is never followed.
      copyFileSync(viaProc ? `/proc/self/fd/${fd}` : srcPath, dst, data.copyFlags);
      const h = createHash("sha256");
      let pos = 0;
      let digestMs = 0;
      for (let n = readSync(fd, buf, 0, buf.length, 0); n > 0; n = readSync(fd, buf, 0, buf.length, pos)) {
        const t = performance.now();
        h.update(buf.subarray(0, n));
        digestMs += performance.now() - t;
        pos += n;
        Atomics.add(bytesRead, 0, BigInt(n));
      }
      // Same size and mtime before and after both reads: the copy holds what was hashed.
      const after = fstatSync(fd, { bigint: true });
      if (after.mtimeNs !== before.mtimeNs || after.size !== before.size || BigInt(pos) !== before.size) {
        if (attempt < 3) continue;
        throw new Error(`${srcPath} kept changing while it was copied`);
      }
      // copyFile already gave the copy the source's mode; chown clears set-id bits, so those
      // come back after it.
      if (root && (before.uid !== myUid || before.gid !== myGid)) {
        lchownSync(dst, Number(before.uid), Number(before.gid));
        if (before.mode & 0o6000n) chmodSync(dst, Number(before.mode) & 0o7777);
      }
      // Unchanged since the walk: the walk's times (reading it, ours included, may have moved
      // the atime since). Changed: the times of the content that was copied.
      const same = before.mtimeNs === m.mtimeNs && before.size === m.size;
      setTimesNsSync(dst, same ? m.atimeNs : before.atimeNs, same ? m.mtimeNs : before.mtimeNs, false);
      return { size: pos, sha256: h.digest("hex"), digestMs };
    } finally {
      closeSync(fd);
    }
  }
}

const files: CopiedFile[] = [];
const vanished: string[] = [];
let digestMs = 0;

function runTask(task: CopyTask): void {
  let primary: CopiedFile | undefined;
  for (const m of task) {
    const dst = `${data.staging}/${m.rel}`;
    Atomics.add(filesDone, 0, 1);
    if (!primary) {
      const r = copyOne(m, dst);
      if (!r) {
        vanished.push(m.rel);
        continue;
      }
      digestMs += r.digestMs;
      primary = { path: m.rel, size: r.size, sha256: r.sha256 };
      files.push(primary);
      continue;
    }
    // A name removed since the walk is not recreated.
    try {
      lstatSync(`${data.src}/${m.rel}`);
    } catch (err) {
      if (!missing(err)) throw err;
      vanished.push(m.rel);
      continue;
    }
    linkSync(`${data.staging}/${primary.path}`, dst);
    files.push({ ...primary, path: m.rel, linkTo: primary.path });
  }
}

// The main thread hands out batches: a message with tasks, or null when there is no more work.
parentPort?.on("message", (batch: CopyTask[] | null) => {
  if (batch === null) {
    parentPort?.postMessage({ kind: "done", files, vanished, digestMs } satisfies FromWorker);
    parentPort?.close();
    return;
  }
  try {
    for (const task of batch) runTask(task);
    parentPort?.postMessage({ kind: "more" } satisfies FromWorker);
  } catch (err) {
    parentPort?.postMessage({ kind: "error", message: (err as Error).message } satisfies FromWorker);
  }
});
