/**
 * The few system calls Node's fs module cannot make exactly, reached through koffi (a C FFI with
 * prebuilt binaries shipped in its npm package). Node's utimes/lutimes go through libuv, which
 * takes a double in seconds and truncates to microseconds, so nanosecond times need utimensat
 * itself (docs/adr/0003-nanosecond-times.md). When koffi cannot load (an unusual platform), the
 * fallbacks keep working at microsecond precision and `exactTimes` says so.
 */
import { constants as fsc, fstatSync, lutimesSync } from "node:fs";
import { copyFile, open, rm } from "node:fs/promises";
import { constants as osConstants } from "node:os";

type Utimensat = (dirfd: number, path: Buffer, times: Buffer, flags: number) => number;
type Futimens = (fd: number, times: Buffer) => number;
type Ioctl = (fd: number, request: number, argType: "int", arg: number) => number;
// koffi's `.async` runs the call on a thread of its own and hands back errno with the result.
type Syncfs = ((fd: number) => number) & {
  async: (fd: number, done: (err: unknown, result: number) => void) => void;
};
type SyncFileRange = (fd: number, offset: number, nbytes: number, flags: number) => number;
type Fadvise = (fd: number, offset: number, len: number, advice: number) => number;
// Addresses as integers (intptr_t): the same registers as a pointer on every Linux ABI, and
// no pointer objects to keep alive across calls.
type Addr = number | bigint;
type Mmap = (addr: number, len: number, prot: number, flags: number, fd: number, off: number) => Addr;
type Munmap = (addr: Addr, len: number) => number;
type Mincore = (addr: Addr, len: number, vec: Buffer) => number;
type Madvise = (addr: Addr, len: number, advice: number) => number;
type CopyFileRange = (
  fdIn: number,
  offIn: null,
  fdOut: number,
  offOut: null,
  len: number,
  flags: number,
) => number | bigint;

export interface Libc {
  utimensat: Utimensat;
  futimens: Futimens;
  ioctl: Ioctl;
  syncfs: Syncfs;
  syncFileRange: SyncFileRange;
  fadvise: Fadvise;
  mmap: Mmap;
  munmap: Munmap;
  mincore: Mincore;
  madvise: Madvise;
  lseek: (fd: number, off: number, whence: number) => number | bigint;
  pageSize: number;
  copyFileRange: CopyFileRange;
  syscall: (nr: number, ...typedArgs: unknown[]) => number | bigint;
  close: (fd: number) => number;
  openat: (dirFd: number, name: string, flags: number) => number;
  /** openat with a mode (O_CREAT): variadic, the mode's type given with it. */
  openatMode: (dirFd: number, name: Buffer, flags: number, modeType: "uint32_t", mode: number) => number;
  /** Absent from a libc before glibc 2.28 (native-file.ts). */
  statx?: (dirFd: number, name: Buffer, flags: number, mask: number, out: Buffer) => number;
  errno: () => number;
  /** The address of a buffer's first byte (koffi.address). */
  address: (b: Buffer) => bigint;
}

const AT_FDCWD = -100;
const FICLONE = 0x40049409; // _IOW(0x94, 9, int)
const AT_SYMLINK_NOFOLLOW = 0x100;
const NS = 1_000_000_000n;
const SC_PAGESIZE = 30; // glibc and musl alike

async function loadLibc(): Promise<Libc | null> {
  if (process.platform !== "linux" || process.env.WARMSTART_NO_NATIVE === "1") return null;
  try {
    const koffi = await import("koffi");
    // The process's own symbols: libc is already linked into node, whichever libc it is.
    const lib = koffi.load(null);
    return {
      // Paths go as NUL-terminated bytes: a name need not be valid UTF-8.
      utimensat: lib.func("int utimensat(int, const void *, const void *, int)") as Utimensat,
      futimens: lib.func("int futimens(int, const void *)") as Futimens,
      ioctl: lib.func("int ioctl(int, unsigned long, ...)") as Ioctl,
      syncfs: lib.func("int syncfs(int)") as Syncfs,
      syncFileRange: lib.func("int sync_file_range(int, int64_t, int64_t, unsigned int)") as SyncFileRange,
      fadvise: lib.func("int posix_fadvise(int, int64_t, int64_t, int)") as Fadvise,
      mmap: lib.func("intptr_t mmap(intptr_t, size_t, int, int, int, int64_t)") as Mmap,
      munmap: lib.func("int munmap(intptr_t, size_t)") as Munmap,
      mincore: lib.func("int mincore(intptr_t, size_t, void *)") as Mincore,
      madvise: lib.func("int madvise(intptr_t, size_t, int)") as Madvise,
      lseek: lib.func("int64_t lseek(int, int64_t, int)") as Libc["lseek"],
      pageSize: Number((lib.func("long sysconf(int)") as (n: number) => number | bigint)(SC_PAGESIZE)),
      copyFileRange: lib.func(
        "intptr_t copy_file_range(int, void *, int, void *, size_t, unsigned int)",
      ) as CopyFileRange,
      syscall: lib.func("long syscall(long, ...)") as Libc["syscall"],
      close: lib.func("int close(int)") as Libc["close"],
      openat: lib.func("int openat(int, const char *, int)") as Libc["openat"],
      openatMode: lib.func("int openat(int, const void *, int, ...)") as Libc["openatMode"],
      statx: optional(() =>
        lib.func("int statx(int, const void *, int, unsigned int, void *)"),
      ) as Libc["statx"],
      errno: () => koffi.errno(),
      address: (b) => koffi.address(b),
    };
  } catch {
    return null;
  }
}

/** A function only some libcs have: undefined where the symbol is missing. */
function optional(declare: () => unknown): unknown {
  try {
    return declare();
  } catch {
    return undefined;
  }
}

const libc = await loadLibc();

/** The loaded helpers, for the other native-* modules of this folder (null without koffi). */
export const nativeLibc = (): Libc | null => libc;

/** True when times are set to the nanosecond (utimensat reachable); false means microseconds. */
export const exactTimes = libc !== null;

const cString = (path: string | Buffer): Buffer =>
  Buffer.concat([typeof path === "string" ? Buffer.from(path) : path, Buffer.from([0])]);

export function errnoError(call: string, path: string, errno: number): NodeJS.ErrnoException {
  const code = Object.entries(osConstants.errno).find(([, n]) => n === errno)?.[0] ?? `E${errno}`;
  const err: NodeJS.ErrnoException = new Error(`${code}: ${call} failed on ${path} (errno ${errno})`);
  err.code = code;
  err.errno = errno;
  err.path = path;
  return err;
}

/**
 * Sets access and modification times to the nanosecond, on the link itself when `noFollow`
 * (symlinks). Times are nanoseconds since the epoch, as `stat(..., { bigint: true })` gives them.
 * Synchronous: one short system call, which also lets worker threads use it.
 */
export function setTimesNsSync(
  path: string | Buffer,
  atimeNs: bigint,
  mtimeNs: bigint,
  noFollow: boolean,
): void {
  if (libc) {
    const buf = Buffer.allocUnsafe(32);
    writeTimespec(buf, 0, atimeNs);
    writeTimespec(buf, 16, mtimeNs);
    if (libc.utimensat(AT_FDCWD, cString(path), buf, noFollow ? AT_SYMLINK_NOFOLLOW : 0) !== 0) {
      throw errnoError("utimensat", String(path), libc.errno());
    }
    return;
  }
  // Fallback: microseconds. lutimes works on files and directories as well as links.
  lutimesSync(path, Number(atimeNs) / 1e9, Number(mtimeNs) / 1e9);
}

/** setTimesNsSync with a promise, for async callers. */
export function setTimesNs(
  path: string | Buffer,
  atimeNs: bigint,
  mtimeNs: bigint,
  noFollow: boolean,
): Promise<void> {
  // A throw inside the executor becomes the rejection.
  return new Promise((resolve) => {
    setTimesNsSync(path, atimeNs, mtimeNs, noFollow);
    resolve();
  });
}

// Two struct timespec for futimens, reused by every call of a thread (the calls are synchronous).
const timesBuf = Buffer.alloc(32);

/** Like setTimesNsSync, on an open descriptor (futimens): no path lookup. */
export function setFdTimesNs(fd: number, atimeNs: bigint, mtimeNs: bigint, what: string): void {
  if (!libc) throw new Error("futimens needs the native helpers");
  writeTimespec(timesBuf, 0, atimeNs);
  writeTimespec(timesBuf, 16, mtimeNs);
  if (libc.futimens(fd, timesBuf) !== 0) throw errnoError("futimens", what, libc.errno());
}

/** Whether the descriptor-level copy helpers below are there (koffi loaded). */
export const kernelCopyAvailable = (): boolean => libc !== null;

/**
 * Copies `len` bytes from the current offset of `srcFd` to that of `dstFd` inside the kernel:
 * a reflink (FICLONE, whole file) when `clone`, else copy_file_range. Returns the bytes copied
 * (less than `len` if the source is shorter than it was), or undefined when the kernel refuses
 * the primitive here (EXDEV, EOPNOTSUPP, ENOSYS, EINVAL...), so the caller can copy another way.
 */
export function kernelCopyFd(
  srcFd: number,
  dstFd: number,
  len: number,
  clone: boolean,
  stopped?: () => boolean,
): number | undefined {
  if (!libc) return undefined;
  if (clone) return libc.ioctl(dstFd, FICLONE, "int", srcFd) === 0 ? len : undefined;
  let done = 0;
  while (done < len) {
    if (stopped?.()) throw new StoppedError();
    // 64 MiB a call: a worker asked to stop is never more than one such call away from it.
    const n = Number(libc.copyFileRange(srcFd, null, dstFd, null, Math.min(len - done, 1 << 26), 0));
    if (n < 0) {
      const errno = libc.errno();
      if (errno === osConstants.errno.EINTR) continue;
      if (done === 0) return undefined;
      throw errnoError("copy_file_range", `fd ${srcFd}`, errno);
    }
    if (n === 0) break;
    done += n;
  }
  return done;
}

function writeTimespec(buf: Buffer, offset: number, ns: bigint): void {
  // Floor division so times before the epoch still get 0 <= tv_nsec < 1e9.
  let sec = ns / NS;
  let nsec = ns % NS;
  if (nsec < 0n) {
    nsec += NS;
    sec -= 1n;
  }
  buf.writeBigInt64LE(sec, offset);
  buf.writeBigInt64LE(nsec, offset + 8);
}

/**
 * Flushes every dirty page of the filesystem holding `path` (syncfs). Falls back to fsync of the
 * path alone when syncfs is unreachable, which is weaker; callers also fsync what they commit.
 */
export async function syncFilesystem(path: string): Promise<void> {
  const fh = await open(path, fsc.O_RDONLY);
  try {
    if (libc) await syncfsFd(fh.fd, path);
    else await fh.sync();
  } finally {
    await fh.close();
  }
}

/**
 * syncfs(2) on a descriptor the caller opened, off the event loop (it can take seconds). Since
 * Linux 5.8 syncfs also fails when a page of the filesystem failed to be written back at any
 * time since the descriptor was opened, so a descriptor opened before a copy starts hears of
 * every write error of that copy, including those of writeback the kernel started on its own.
 */
export function syncfsFd(fd: number, what: string): Promise<void> {
  const lib = libc;
  if (!lib) return Promise.reject(new Error("syncfs needs the native helpers"));
  return new Promise((resolve, reject) => {
    lib.syncfs.async(fd, (err, r) => {
      if (err) reject(err instanceof Error ? err : new Error("syncfs call failed", { cause: err }));
      else if (r !== 0) reject(errnoError("syncfs", what, lib.errno()));
      else resolve();
    });
  });
}

/** Whether syncfsFd and startWriteback can be called (koffi loaded). */
export const syncfsAvailable = (): boolean => libc !== null;

const SYNC_FILE_RANGE_WRITE = 2;

/**
 * Starts writing back a file's dirty pages without waiting for them (sync_file_range with
 * SYNC_FILE_RANGE_WRITE alone): the disk works while the copy goes on, so the one syncfs at the
 * end has little left to wait for. It makes nothing durable by itself (no metadata, no cache
 * flush), and a failure here only means the final syncfs does all the work; so it is ignored.
 */
export function startWriteback(fd: number): void {
  libc?.syncFileRange(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
}

const POSIX_FADV_DONTNEED = 4; // the same on x86_64 and arm64

/** Asks the kernel to drop the clean pages of [offset, offset + len) of a file (len 0: to its
 * end) from the page cache; tests and benchmarks make a tree "cold" with it. False when it
 * cannot be asked. Dirty pages stay: flush them first. */
export function dropFromPageCache(fd: number, offset = 0, len = 0): boolean {
  return libc !== null && libc.fadvise(fd, offset, len, POSIX_FADV_DONTNEED) === 0;
}

export type ResidencyMethod = "cachestat" | "mincore";
const SYS_CACHESTAT = 451; // the same number on x86_64 and arm64 (Linux 6.5 and later)
export const PROT_READ = 1;
export const MAP_SHARED = 1;
/** mincore looks at a mapping of at most this much at a time (a byte per page of it). */
const MINCORE_WINDOW = 1 << 30;
let residency: ResidencyMethod | undefined | null =
  libc === null ? null : process.env.WARMSTART_NO_CACHESTAT === "1" ? "mincore" : undefined;

// cachestat's struct cachestat_range and struct cachestat, reused by every call of a thread.
const csRange = Buffer.alloc(16);
const csStat = Buffer.alloc(40);

/** How page-cache residency is looked up in this thread: undefined until the first lookup,
 * null when it cannot be (then a prewarm reads everything). */
export const residencyMethod = (): ResidencyMethod | null | undefined => residency;

/** Forces a residency method in this thread (tests of the fallbacks); returns a function that
 * puts back what was there. */
export function useResidency(m: ResidencyMethod | null): () => void {
  const was = residency;
  residency = libc === null ? null : m;
  return () => void (residency = was);
}

/**
 * How many pages of [offset, offset + len) of `fd` are not in the page cache, or undefined when
 * that cannot be known. `offset` must be a multiple of the page size. cachestat(2) (Linux 6.5)
 * answers in one call without touching the file; where it is missing (ENOSYS) or refused by a
 * seccomp profile (EPERM), mincore(2) over a read-only shared mapping, which reads nothing
 * either: a mapping only faults pages in when they are touched.
 */
export function missingPages(fd: number, offset: number, len: number): number | undefined {
  if (!libc || residency === null || len <= 0) return len <= 0 ? 0 : undefined;
  const ps = libc.pageSize;
  const pages = Math.ceil(len / ps);
  if (residency !== "mincore") {
    // Offsets and counts stay far below 2^53: plain numbers, split by hand, in reused buffers.
    csRange.writeUInt32LE(offset % 2 ** 32, 0);
    csRange.writeUInt32LE(Math.floor(offset / 2 ** 32), 4);
    csRange.writeUInt32LE(len % 2 ** 32, 8);
    csRange.writeUInt32LE(Math.floor(len / 2 ** 32), 12);
    const r = Number(libc.syscall(SYS_CACHESTAT, "int", fd, "void *", csRange, "void *", csStat, "int", 0));
    if (r === 0) {
      residency = "cachestat";
      const cached = csStat.readUInt32LE(0) + csStat.readUInt32LE(4) * 2 ** 32;
      return Math.max(0, pages - cached);
    }
    const errno = libc.errno();
    if (errno !== osConstants.errno.ENOSYS && errno !== osConstants.errno.EPERM) return undefined;
    residency = "mincore";
  }
  let missing = 0;
  for (let off = 0; off < len; off += MINCORE_WINDOW) {
    const n = Math.min(MINCORE_WINDOW, len - off);
    const addr = libc.mmap(0, n, PROT_READ, MAP_SHARED, fd, offset + off);
    if (Number(addr) === -1) return undefined;
    try {
      const vec = Buffer.alloc(Math.ceil(n / ps));
      if (libc.mincore(addr, n, vec) !== 0) {
        if (libc.errno() === osConstants.errno.ENOSYS) residency = null;
        return undefined;
      }
      for (const b of vec) if ((b & 1) === 0) missing += 1;
    } finally {
      libc.munmap(addr, n);
    }
  }
  return missing;
}

const SEEK_END = 2;
/** The size of the open file `fd` (lseek to its end: one call, no stat object built). */
export function fileSize(fd: number): number {
  if (!libc) return fstatSync(fd).size;
  const n = Number(libc.lseek(fd, 0, SEEK_END));
  if (n < 0) throw errnoError("lseek", `fd ${fd}`, libc.errno());
  return n;
}

/** The page size the residency counts are in (4096 where the native helpers are missing). */
export const pageSize = (): number => libc?.pageSize ?? 4096;

// ioprio_set(2) and ioprio_get(2), for one thread (IOPRIO_WHO_PROCESS with a thread id of 0).
const SYS_IOPRIO = { x64: [251, 252], arm64: [30, 31] }[process.arch as "x64" | "arm64"] as
  [number, number] | undefined;
const IOPRIO_WHO_PROCESS = 1;
const IOPRIO_BE_LOWEST = (2 << 13) | 7;

/**
 * Runs `fn` with the calling thread's I/O priority at best-effort level 7 (the default is 4),
 * then puts the old one back. Threads started inside `fn` (worker threads) keep the lower one,
 * which is how a prewarm's readers get it: their reads go behind other pods' reads on the same
 * disk, without the idle class's risk of never being served while a neighbour keeps it busy.
 * Returns whether the kernel took it; schedulers without priorities (none) simply ignore it.
 */
export function withLowIoPriority(fn: () => void): boolean {
  const nr = SYS_IOPRIO;
  const was = libc && nr ? Number(libc.syscall(nr[1], "int", IOPRIO_WHO_PROCESS, "int", 0)) : -1;
  const set = (v: number): boolean =>
    libc !== null &&
    nr !== undefined &&
    Number(libc.syscall(nr[0], "int", IOPRIO_WHO_PROCESS, "int", 0, "int", v)) === 0;
  const lowered = was >= 0 && set(IOPRIO_BE_LOWEST);
  try {
    fn();
  } finally {
    if (lowered) set(was);
  }
  return lowered;
}

export type CopyMethod = "reflink" | "copy_file_range" | "copy";

/**
 * Which primitive the kernel uses to copy the open file `srcFd` into `dir`: a reflink (FICLONE,
 * shared extents), copy_file_range (in-kernel copy), or a plain read/write copy. Node's copyFile
 * with COPYFILE_FICLONE tries them in that order, so the probe tries them in the same order on a
 * scratch file it removes afterwards. The source is a descriptor the caller already checked, so
 * the probe never opens anything of the tree by name.
 */
export async function probeCopyMethod(srcFd: number, dir: string): Promise<CopyMethod> {
  const probe = `${dir}/.warmstart-probe-${process.pid}`;
  try {
    await copyFile(`/proc/self/fd/${srcFd}`, probe, fsc.COPYFILE_FICLONE_FORCE);
    return "reflink";
  } catch {
    // no reflink here: try the in-kernel copy next
  } finally {
    await rm(probe, { force: true });
  }
  if (!libc) return "copy";
  const dst = await open(probe, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_TRUNC, 0o600);
  try {
    const n = libc.copyFileRange(srcFd, null, dst.fd, null, 1, 0);
    return Number(n) >= 0 ? "copy_file_range" : "copy";
  } finally {
    await dst.close();
    await rm(probe, { force: true });
  }
}

/** Thrown inside a copy that was asked to stop (deadline or cancel). */
export class StoppedError extends Error {
  constructor() {
    super("stopped");
  }
}
