/**
 * One capture copier (a worker thread). It asks for batches of files, and for each file makes
 * direct, synchronous system calls on descriptors: open the source once (never following a
 * symlink), let the kernel copy it (FICLONE where the filesystem shares extents, else
 * copy_file_range), hash it from the same descriptor, then set owner, mode and nanosecond times
 * (fchown, fchmod, futimens). A libuv thread-pool round trip per call would cost more than the
 * calls themselves on small files, and workers keep the hashing off the main thread.
 */
import { createHash } from "node:crypto";
import {
  chmodSync,
  closeSync,
  copyFileSync,
  existsSync,
  fchmodSync,
  fchownSync,
  constants as fsc,
  fstatSync,
  linkSync,
  lchownSync,
  lstatSync,
  openSync,
  readSync,
  writeSync,
  type BigIntStats,
} from "node:fs";
import { parentPort, workerData } from "node:worker_threads";
import { kernelCopyAvailable, kernelCopyFd, setFdTimesNs, setTimesNsSync } from "./native.js";

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
  /** Clone (reflink) where the probe found the filesystem shares extents; otherwise the clone
   * attempt is skipped, since it would fail on every file. */
  clone: boolean;
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

interface Done {
  size: number;
  sha256: string;
  digestMs: number;
}

/**
 * Copies and hashes one file; undefined when it vanished. The source is opened once, never
 * through a symlink, and everything else goes through that descriptor, so a name swapped since
 * the walk is never followed. A file rewritten while it is copied is copied again.
 */
function copyOne(m: CopyMember, dst: string): Done | undefined {
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
      const r = kernelCopyAvailable()
        ? copyByFd(fd, before, m, dst)
        : copyByPath(fd, before, m, srcPath, dst);
      if (r) return r;
      if (attempt >= 3) throw new Error(`${srcPath} kept changing while it was copied`);
    } finally {
      closeSync(fd);
    }
  }
}

/** Hashes [0, size) of `fd`; `sink` also gets each chunk (the plain-copy fallback). */
function hash(fd: number, size: number, sink?: (chunk: Buffer) => void): Done {
  const h = createHash("sha256");
  let pos = 0;
  let digestMs = 0;
  while (pos < size) {
    const n = readSync(fd, buf, 0, Math.min(buf.length, size - pos), pos);
    if (n === 0) break;
    const chunk = buf.subarray(0, n);
    const t = performance.now();
    h.update(chunk);
    digestMs += performance.now() - t;
    sink?.(chunk);
    pos += n;
    Atomics.add(bytesRead, 0, BigInt(n));
  }
  return { size: pos, sha256: h.digest("hex"), digestMs };
}

/** Same size and mtime before and after, and every byte there: the copy holds what was hashed. */
const unchanged = (fd: number, before: BigIntStats, copied: number, hashed: number): boolean => {
  const after = fstatSync(fd, { bigint: true });
  const size = Number(before.size);
  return after.mtimeNs === before.mtimeNs && after.size === before.size && copied === size && hashed === size;
};

/** Unchanged since the walk: the walk's times (reading it, ours included, may have moved its
 * atime since). Changed: the times of the content that was copied. */
const timesFor = (before: BigIntStats, m: CopyMember): [bigint, bigint] =>
  before.mtimeNs === m.mtimeNs && before.size === m.size
    ? [m.atimeNs, m.mtimeNs]
    : [before.atimeNs, before.mtimeNs];

/** The usual path: a handful of calls, all on descriptors (clone or copy_file_range, pread,
 * fchown, fchmod, futimens). */
function copyByFd(fd: number, before: BigIntStats, m: CopyMember, dst: string): Done | undefined {
  const out = openSync(dst, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_TRUNC, 0o600);
  try {
    const size = Number(before.size);
    const kernel = kernelCopyFd(fd, out, size, data.clone);
    let copied = kernel ?? 0;
    let d: Done;
    if (kernel === undefined) {
      // The kernel will not copy between these two files: copy the bytes as they are hashed.
      d = hash(fd, size, (chunk) => {
        for (let off = 0; off < chunk.length;)
          off += writeSync(out, chunk, off, chunk.length - off, copied + off);
        copied += chunk.length;
      });
    } else {
      d = hash(fd, size);
    }
    if (!unchanged(fd, before, copied, d.size)) return undefined;
    if (root && (before.uid !== myUid || before.gid !== myGid))
      fchownSync(out, Number(before.uid), Number(before.gid));
    // After chown (which clears set-id bits), and exactly: open's mode went through the umask.
    fchmodSync(out, Number(before.mode) & 0o7777);
    const [atime, mtime] = timesFor(before, m);
    setFdTimesNs(out, atime, mtime, dst);
    return d;
  } finally {
    closeSync(out);
  }
}

/** Without the native helpers: libuv's copyFile (reflink, copy_file_range or sendfile) through
 * /proc/self/fd, then times by path at microsecond precision. */
function copyByPath(
  fd: number,
  before: BigIntStats,
  m: CopyMember,
  srcPath: string,
  dst: string,
): Done | undefined {
  copyFileSync(viaProc ? `/proc/self/fd/${fd}` : srcPath, dst, data.clone ? fsc.COPYFILE_FICLONE : 0);
  const d = hash(fd, Number(before.size));
  if (!unchanged(fd, before, Number(lstatSync(dst).size), d.size)) return undefined;
  if (root && (before.uid !== myUid || before.gid !== myGid)) {
    lchownSync(dst, Number(before.uid), Number(before.gid));
    chmodSync(dst, Number(before.mode) & 0o7777);
  }
  const [atime, mtime] = timesFor(before, m);
  setTimesNsSync(dst, atime, mtime, false);
  return d;
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
