/**
 * The few system calls Node's fs module cannot make exactly, reached through koffi (a C FFI with
 * prebuilt binaries shipped in its npm package). Node's utimes/lutimes go through libuv, which
 * takes a double in seconds and truncates to microseconds, so nanosecond times need utimensat
 * itself (docs/adr/0003-nanosecond-times.md). When koffi cannot load (an unusual platform), the
 * fallbacks keep working at microsecond precision and `exactTimes` says so.
 */
import { constants as fsc, lutimesSync } from "node:fs";
import { copyFile, open, rm } from "node:fs/promises";
import { constants as osConstants } from "node:os";

type Utimensat = (dirfd: number, path: Buffer, times: Buffer, flags: number) => number;
type Futimens = (fd: number, times: Buffer) => number;
type Ioctl = (fd: number, request: number, argType: "int", arg: number) => number;
type Syncfs = (fd: number) => number;
type CopyFileRange = (
  fdIn: number,
  offIn: null,
  fdOut: number,
  offOut: null,
  len: number,
  flags: number,
) => number | bigint;

interface Libc {
  utimensat: Utimensat;
  futimens: Futimens;
  ioctl: Ioctl;
  syncfs: Syncfs;
  copyFileRange: CopyFileRange;
  syscall: (nr: number, ...typedArgs: unknown[]) => number | bigint;
  close: (fd: number) => number;
  errno: () => number;
}

const AT_FDCWD = -100;
const FICLONE = 0x40049409; // _IOW(0x94, 9, int)
const AT_SYMLINK_NOFOLLOW = 0x100;
const NS = 1_000_000_000n;

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
      copyFileRange: lib.func(
        "intptr_t copy_file_range(int, void *, int, void *, size_t, unsigned int)",
      ) as CopyFileRange,
      syscall: lib.func("long syscall(long, ...)") as Libc["syscall"],
      close: lib.func("int close(int)") as Libc["close"],
      errno: () => koffi.errno(),
    };
  } catch {
    return null;
  }
}

const libc = await loadLibc();

/** True when times are set to the nanosecond (utimensat reachable); false means microseconds. */
export const exactTimes = libc !== null;

const cString = (path: string | Buffer): Buffer =>
  Buffer.concat([typeof path === "string" ? Buffer.from(path) : path, Buffer.from([0])]);

function errnoError(call: string, path: string, errno: number): NodeJS.ErrnoException {
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

/** Like setTimesNsSync, on an open descriptor (futimens): no path lookup. */
export function setFdTimesNs(fd: number, atimeNs: bigint, mtimeNs: bigint, what: string): void {
  if (!libc) throw new Error("futimens needs the native helpers");
  const buf = Buffer.allocUnsafe(32);
  writeTimespec(buf, 0, atimeNs);
  writeTimespec(buf, 16, mtimeNs);
  if (libc.futimens(fd, buf) !== 0) throw errnoError("futimens", what, libc.errno());
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
    if (libc) {
      if (libc.syncfs(fh.fd) !== 0) throw errnoError("syncfs", path, libc.errno());
    } else {
      await fh.sync();
    }
  } finally {
    await fh.close();
  }
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

const SYS_OPENAT2 = 437; // the same number on every Linux architecture
const O_CLOEXEC = 0o2000000;
const RESOLVE_NO_SYMLINKS = 0x04;
const RESOLVE_BENEATH = 0x08;
let openat2Works = libc !== null && process.env.WARMSTART_NO_OPENAT2 !== "1";

/** Closes a descriptor openat2Beneath returned. Node's fs did not open it, so its closeSync
 * would warn (in a worker thread) about a descriptor it does not track. */
export function closeRawFd(fd: number): void {
  libc?.close(fd);
}

/** Turns openat2 off for this thread (tests of the component-by-component walk); returns a
 * function that puts back what was there. */
export function disableOpenat2(): () => void {
  const was = openat2Works;
  openat2Works = false;
  return () => void (openat2Works = was);
}

/**
 * openat2(dirFd, rel, flags) with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS: the kernel resolves
 * `rel` below `dirFd`, failing with ELOOP on a symlink at any component and EXDEV on any way out.
 * Returns undefined when openat2 is not there (no native helpers, a kernel before 5.6, a seccomp
 * profile that refuses it), so the caller can walk component by component instead.
 */
export function openat2Beneath(dirFd: number, rel: Buffer, flags: number): number | undefined {
  if (!libc || !openat2Works) return undefined;
  const how = Buffer.alloc(24);
  how.writeBigUInt64LE(BigInt(flags | O_CLOEXEC), 0);
  how.writeBigUInt64LE(BigInt(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS), 16);
  const path = cString(rel);
  for (let attempt = 1; ; attempt++) {
    const fd = Number(libc.syscall(SYS_OPENAT2, "int", dirFd, "void *", path, "void *", how, "size_t", 24));
    if (fd >= 0) return fd;
    const errno = libc.errno();
    // EAGAIN: a rename raced the lookup; the kernel asks for a retry.
    if ((errno === osConstants.errno.EINTR || errno === osConstants.errno.EAGAIN) && attempt < 16) continue;
    // ENOSYS: no openat2 here; EPERM: a seccomp profile refuses it (flags never hold O_NOATIME).
    if (errno === osConstants.errno.ENOSYS || errno === osConstants.errno.EPERM) {
      openat2Works = false;
      return undefined;
    }
    throw errnoError("openat2", rel.toString("latin1"), errno);
  }
}
