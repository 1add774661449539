/**
 * One capture copier (a worker thread). It asks for batches of files, and for each file makes
 * direct, synchronous system calls on descriptors: find the source below the tree's root
 * descriptor with no symlink anywhere on the way, check it is the regular file the walk saw
 * (device and inode) before opening it for reading, non-blocking (beneath.ts); create its copy
 * by name in its staging folder, held open; copy and digest it, then copy its user.* extended
 * attributes (xattr.ts) and set owner, mode and nanosecond times (fchown, fchmod, futimens). A big file is read once, digested from that buffer and
 * written with O_DIRECT, past the page cache, holes left as holes (copyRanges); a small one is
 * copied by the kernel (FICLONE where the filesystem shares extents, else copy_file_range) and
 * digested from the same descriptor. A libuv thread-pool round trip per call would cost more
 * than the calls themselves on small files, and workers keep the digest off the main thread.
 */
import {
  chmodSync,
  closeSync,
  copyFileSync,
  fsyncSync,
  ftruncateSync,
  fchmodSync,
  fchownSync,
  constants as fsc,
  linkSync,
  lchownSync,
  lstatSync,
  openSync,
  readSync,
  writeSync,
} from "node:fs";
import { createRequire } from "node:module";
import { parentPort, workerData } from "node:worker_threads";
import {
  at,
  bytes,
  closeFd,
  O_PATH,
  openBeneath,
  openScannedFile,
  skipReasonOf,
  specialReason,
  statFd,
  type SkipReason,
} from "./beneath.js";
import {
  COUNTERS,
  type CopiedFile,
  type CopyMember,
  type CopyTask,
  type CopyWorkerData,
  type FromWorker,
} from "./copy-protocol.js";
import { createDigest } from "./digest.js";
import { alignedBuffer, DIRECT_ALIGN, nextDataRange } from "./native-direct.js";
import {
  kernelCopyAvailable,
  kernelCopyFd,
  setFdTimesNs,
  setTimesNsSync,
  startWriteback,
  StoppedError,
} from "./native.js";
import { KEPT_MODE_BITS } from "./beneath.js";
import { copyUserXattrs } from "./xattr.js";
import { closeRawFd, createAtRaw, disableOpenat2, type FileStat } from "./native-file.js";

const data = workerData as CopyWorkerData;
if (data.noOpenat2) disableOpenat2();
const filesDone = new Int32Array(data.counters, COUNTERS.files, 1);
const stopFlag = new Int32Array(data.counters, COUNTERS.stop, 1);
const hookDone = new Int32Array(data.hook);
const bytesRead = new BigInt64Array(data.counters, COUNTERS.bytes, 1);
const buf = Buffer.allocUnsafe(data.chunkBytes);
const root = process.getuid?.() === 0;
const myUid = BigInt(process.getuid?.() ?? -1);
const myGid = BigInt(process.getgid?.() ?? -1);

/** Files at least this big are written with O_DIRECT (copyRanges). Below it, a file is a few
 * synchronous disk writes at most, cheaper through the page cache. */
const DIRECT_MIN = 1 << 20;
/** copyRanges' read and write size: measured on the bench's four 512 MiB shards (read and
 * O_DIRECT write alone), 1 MiB cost 30% more CPU and 16% more time than 4 MiB, and 8 or 16 MiB
 * no less than 4. */
const RANGE_CHUNK = 4 << 20;
// copyRanges' buffer, aligned for O_DIRECT where it can be; allocated on first use.
let rangeBuf: Buffer | undefined;
// False once this filesystem refused O_DIRECT: no copier asks again.
let directWorks = data.direct;
let zeros: Buffer | undefined;
let directBytes = 0;

const stopped = (): boolean => Atomics.load(stopFlag, 0) !== 0;
const dstPath = (rel: string): Buffer => bytes(`${data.staging}/${rel}`);

/** Lets a test change the tree at exactly this point: the main thread runs its hook, then answers. */
function beforeOpen(rel: string): void {
  if (!data.askBeforeOpen) return;
  Atomics.store(hookDone, 0, 0);
  parentPort?.postMessage({ kind: "beforeOpen", rel } satisfies FromWorker);
  while (Atomics.wait(hookDone, 0, 0, 1000) === "timed-out") if (stopped()) throw new StoppedError();
  if (stopped()) throw new StoppedError();
}

interface Done {
  size: number;
  digest: string;
  digestMs: number;
}

/**
 * Copies and digests one file; a skip reason when it is gone or no longer the file the walk saw.
 * Everything after the open goes through the one descriptor, so a name swapped since is never
 * followed. A file rewritten while it is copied is copied again.
 */
function copyOne(m: CopyMember): Done | SkipReason {
  for (let attempt = 1; ; attempt++) {
    beforeOpen(m.rel);
    const o = openScannedFile(data.rootFd, m.rel, m);
    if (o.skip) return o.skip;
    try {
      const r = kernelCopyAvailable() ? copyByFd(o.fd, o.st, m) : copyByPath(o.fd, o.st, m, dstPath(m.rel));
      if (r) return r;
      if (attempt >= 3) throw new Error(`${m.rel} kept changing while it was copied`);
    } finally {
      closeFd(o.fd);
    }
  }
}

/** BLAKE3 of a whole buffer in one call, for files that fit the read buffer: no hasher object
 * per file (measured: 40% less CPU than hasher, update and digest on 30 KB files). Only when the
 * digest is BLAKE3, whose binding has loaded then. */
const blake3Once =
  data.digest === "blake3"
    ? (createRequire(import.meta.url)("@napi-rs/blake-hash") as { blake3: (b: Uint8Array) => Buffer }).blake3
    : undefined;

/** Hashes [0, size) of `fd`; `sink` also gets each chunk (the plain-copy fallback). */
function hash(fd: number, size: number, sink?: (chunk: Buffer) => void): Done {
  if (blake3Once && size <= buf.length) {
    if (stopped()) throw new StoppedError();
    let n = 0;
    for (let r = 1; n < size && r > 0; n += r) r = readSync(fd, buf, n, size - n, n);
    const chunk = buf.subarray(0, n);
    const t = performance.now();
    const digest = blake3Once(chunk).toString("hex");
    const digestMs = performance.now() - t;
    sink?.(chunk);
    Atomics.add(bytesRead, 0, BigInt(n));
    return { size: n, digest, digestMs };
  }
  const h = createDigest(data.digest);
  let pos = 0;
  let digestMs = 0;
  while (pos < size) {
    if (stopped()) throw new StoppedError();
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
  return { size: pos, digest: h.hex(), digestMs };
}

/** Same size and mtime before and after, and every byte there: the copy holds what was hashed. */
const unchanged = (fd: number, before: FileStat, copied: number, hashed: number): boolean => {
  const after = statFd(fd);
  const size = Number(before.size);
  return after.mtimeNs === before.mtimeNs && after.size === before.size && copied === size && hashed === size;
};

/** Unchanged since the walk: the walk's times (reading it, ours included, may have moved its
 * atime since). Changed: the times of the content that was copied. */
const timesFor = (before: FileStat, m: CopyMember): [bigint, bigint] =>
  before.mtimeNs === m.mtimeNs && before.size === m.size
    ? [m.atimeNs, m.mtimeNs]
    : [before.atimeNs, before.mtimeNs];

// The staging folder of the last copy created, held open (staging is this capture's own): the
// next copy in that folder, as most of a batch is, is created by one name, not a whole path.
const dstDir = { rel: "", fd: -1 };

/** Creates (or empties) the copy of `rel` in staging, write-only, with `flags` added; close it with
 * closeRawFd. Only with the native helpers. */
function createCopy(rel: string, flags: number): number {
  const slash = rel.lastIndexOf("/");
  const dir = rel.slice(0, slash + 1);
  if (dstDir.fd < 0 || dir !== dstDir.rel) {
    if (dstDir.fd >= 0) closeSync(dstDir.fd);
    dstDir.fd = -1;
    dstDir.fd = openSync(dir ? dstPath(dir) : bytes(data.staging), O_PATH | fsc.O_DIRECTORY);
    dstDir.rel = dir;
  }
  const fd = createAtRaw(
    dstDir.fd,
    rel.slice(slash + 1),
    fsc.O_WRONLY | fsc.O_CREAT | fsc.O_TRUNC | flags,
    0o600,
  );
  if (fd === undefined) throw new Error("creating a copy by descriptor needs the native helpers");
  return fd;
}

/** The destination opened for O_DIRECT writes, or undefined when this filesystem refuses them
 * (tmpfs before Linux 6.6, some FUSE filesystems) or no aligned buffer can be had. */
function openDirect(rel: string): number | undefined {
  if (!directWorks) return undefined;
  try {
    rangeBuf ??= alignedBuffer(RANGE_CHUNK);
    if (rangeBuf) return createCopy(rel, fsc.O_DIRECT);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EINVAL") throw err;
  }
  directWorks = false;
  return undefined;
}

const alignUp = (n: number): number => Math.ceil(n / DIRECT_ALIGN) * DIRECT_ALIGN;
const alignDown = (n: number): number => Math.floor(n / DIRECT_ALIGN) * DIRECT_ALIGN;

interface Ranged {
  copied: number;
  done: Done;
  /** Data bytes written (holes are not). */
  wrote: number;
}

/**
 * Copies [0, size) of `fd` into `out` and digests it from the same buffer, each byte read once.
 * Only the ranges that hold data are read and written (SEEK_DATA, SEEK_HOLE), so holes stay
 * holes; the digest takes holes as zeros, as a reader sees them. With `direct` (`out` opened
 * O_DIRECT) the bytes go straight to the disk, with no page-cache copy to allocate, dirty and
 * write back later: the bench's whole capture took about a third of the CPU it took with
 * copy_file_range and a second read for the digest. Ranges are widened to whole aligned blocks, the last block is written padded, and
 * the file is cut back to its size. Returns the bytes copied (short of `size` if the file shrank
 * meanwhile), or undefined when the first O_DIRECT write is refused (the filesystem took the
 * open but not this alignment): nothing was written, and the caller copies another way.
 */
function copyRanges(fd: number, out: number, size: number, direct: boolean): Ranged | undefined {
  const b = (rangeBuf ??= alignedBuffer(RANGE_CHUNK) ?? Buffer.allocUnsafeSlow(RANGE_CHUNK));
  const h = createDigest(data.digest);
  let hashed = 0;
  let digestMs = 0;
  const feed = (chunk: Buffer): void => {
    const t = performance.now();
    h.update(chunk);
    digestMs += performance.now() - t;
    hashed += chunk.length;
    Atomics.add(bytesRead, 0, BigInt(chunk.length));
  };
  const holeTo = (end: number): void => {
    zeros ??= Buffer.alloc(RANGE_CHUNK);
    while (hashed < end) feed(zeros.subarray(0, Math.min(zeros.length, end - hashed)));
  };
  let wrote = 0;
  const finish = (): Ranged => ({
    copied: hashed,
    done: { size: hashed, digest: h.hex(), digestMs },
    wrote,
  });
  for (let r = nextDataRange(fd, 0, size); r; r = nextDataRange(fd, hashed, size)) {
    // A widened range takes in part of a hole, copied as the zeros it reads as.
    let pos = Math.max(hashed, alignDown(r[0]));
    const end = Math.min(size, alignUp(r[1]));
    holeTo(pos);
    while (pos < end) {
      if (stopped()) throw new StoppedError();
      const want = Math.min(b.length, end - pos);
      const n = readSync(fd, b, 0, want, pos);
      if (n === 0) return finish();
      feed(b.subarray(0, n));
      const len = direct ? alignUp(n) : n;
      b.fill(0, n, len);
      try {
        for (let off = 0; off < len;) off += writeSync(out, b, off, len - off, pos + off);
      } catch (err) {
        if (direct && wrote === 0 && (err as NodeJS.ErrnoException).code === "EINVAL") {
          directWorks = false;
          return undefined;
        }
        throw err;
      }
      wrote += n;
      pos += n;
      // A short read: the file ends early (it shrank). What follows would be out of alignment.
      if (n < want) return finish();
    }
  }
  holeTo(size);
  ftruncateSync(out, size);
  return finish();
}

/** The usual path: a handful of calls, all on descriptors (O_DIRECT writes of what was read,
 * or clone or copy_file_range and pread; flistxattr, fgetxattr and fsetxattr, fchown, fchmod,
 * futimens). A file with holes is copied range by range, so they stay holes, through the page
 * cache if O_DIRECT cannot be had (a reflink shares the holes as they are). */
function copyByFd(fd: number, before: FileStat, m: CopyMember): Done | undefined {
  const size = Number(before.size);
  const sparse = before.blocks * 512n < before.size;
  if (!data.clone && (size >= DIRECT_MIN || sparse)) {
    const direct = openDirect(m.rel);
    if (direct !== undefined) {
      try {
        const r = copyRanges(fd, direct, size, true);
        if (r) {
          const d = finishFile(fd, direct, before, m, r.copied, r.done);
          if (d) directBytes += r.wrote;
          return d;
        }
      } finally {
        closeRawFd(direct);
      }
    }
  }
  // O_TRUNC: a refused O_DIRECT attempt may have left an empty file here.
  const out = createCopy(m.rel, 0);
  try {
    let copied = 0;
    let d: Done;
    if (sparse && !data.clone) {
      // O_DIRECT cannot be had here: range by range through the page cache, the holes kept.
      ({ copied, done: d } = copyRanges(fd, out, size, false) as Ranged);
    } else {
      const kernel = kernelCopyFd(fd, out, size, data.clone, stopped);
      if (kernel === undefined) {
        // The kernel will not copy between these two files: copy the bytes as they are hashed.
        d = hash(fd, size, (chunk) => {
          for (let off = 0; off < chunk.length;)
            off += writeSync(out, chunk, off, chunk.length - off, copied + off);
          copied += chunk.length;
        });
      } else {
        copied = kernel;
        d = hash(fd, size);
      }
    }
    if (data.durable) startWriteback(out);
    return finishFile(fd, out, before, m, copied, d);
  } finally {
    closeRawFd(out);
  }
}

/** A file's copy checked against its source (undefined: it changed, copy again), then given the
 * source's attributes, owner, mode and times. */
function finishFile(
  fd: number,
  out: number,
  before: FileStat,
  m: CopyMember,
  copied: number,
  d: Done,
): Done | undefined {
  if (!unchanged(fd, before, copied, d.size)) return undefined;
  // While the copy is still ours and writable (a user attribute needs write permission).
  copyUserXattrs(fd, out);
  if (root && (before.uid !== myUid || before.gid !== myGid))
    fchownSync(out, Number(before.uid), Number(before.gid));
  // After chown (which clears set-id bits), and exactly: open's mode went through the umask.
  fchmodSync(out, Number(before.mode) & KEPT_MODE_BITS);
  const [atime, mtime] = timesFor(before, m);
  setFdTimesNs(out, atime, mtime, m.rel);
  return d;
}

/** Without the native helpers: libuv's copyFile (reflink, copy_file_range or sendfile) from the
 * open descriptor (through /proc/self/fd), then times by path at microsecond precision. */
function copyByPath(fd: number, before: FileStat, m: CopyMember, dst: Buffer): Done | undefined {
  copyFileSync(at(fd), dst, data.clone ? fsc.COPYFILE_FICLONE : 0);
  const d = hash(fd, Number(before.size));
  if (!unchanged(fd, before, Number(lstatSync(dst).size), d.size)) return undefined;
  if (root && (before.uid !== myUid || before.gid !== myGid)) {
    lchownSync(dst, Number(before.uid), Number(before.gid));
    chmodSync(dst, Number(before.mode) & KEPT_MODE_BITS);
  }
  const [atime, mtime] = timesFor(before, m);
  setTimesNsSync(dst, atime, mtime, false);
  if (data.durable) {
    // No syncfs without the native helpers: each file is flushed on its own instead.
    const out = openSync(dst, fsc.O_RDONLY);
    try {
      fsyncSync(out);
    } finally {
      closeSync(out);
    }
  }
  return d;
}

const files: CopiedFile[] = [];
const skipped: { path: string; reason: SkipReason }[] = [];
let digestMs = 0;

/** Whether `rel` is still a name of the inode just copied (a second hard link). */
function stillLinked(m: CopyMember): SkipReason | undefined {
  let fd: number;
  try {
    fd = openBeneath(data.rootFd, m.rel, O_PATH);
  } catch (err) {
    const reason = skipReasonOf(err);
    if (reason) return reason;
    throw err;
  }
  try {
    const st = statFd(fd);
    if (!st.isFile()) return specialReason(st);
    return st.dev === m.dev && st.ino === m.ino ? undefined : "replaced";
  } finally {
    closeFd(fd);
  }
}

function runTask(task: CopyTask): void {
  let primary: CopiedFile | undefined;
  for (const m of task) {
    if (stopped()) throw new StoppedError();
    Atomics.add(filesDone, 0, 1);
    if (!primary) {
      const r = copyOne(m);
      if (typeof r === "string") {
        skipped.push({ path: m.rel, reason: r });
        continue;
      }
      digestMs += r.digestMs;
      primary = { path: m.rel, size: r.size, digest: r.digest };
      files.push(primary);
      continue;
    }
    // A name removed or replaced since the walk is not recreated.
    const gone = stillLinked(m);
    if (gone) {
      skipped.push({ path: m.rel, reason: gone });
      continue;
    }
    linkSync(dstPath(primary.path), dstPath(m.rel));
    files.push({ ...primary, path: m.rel, linkTo: primary.path });
  }
}

// The main thread hands out batches: a message with tasks, or null when there is no more work.
parentPort?.on("message", (batch: CopyTask[] | null) => {
  if (batch === null) {
    parentPort?.postMessage({ kind: "done", files, skipped, digestMs, directBytes } satisfies FromWorker);
    parentPort?.close();
    return;
  }
  try {
    for (const task of batch) runTask(task);
    parentPort?.postMessage({ kind: "more" } satisfies FromWorker);
  } catch (err) {
    if (err instanceof StoppedError) parentPort?.postMessage({ kind: "stopped" } satisfies FromWorker);
    else parentPort?.postMessage({ kind: "error", message: (err as Error).message } satisfies FromWorker);
  }
});
