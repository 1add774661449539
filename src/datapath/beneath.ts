/**
 * Opening files inside a tree that its owner keeps changing (a running pod's cache folder).
 *
 * Every open is relative to a directory descriptor and follows no symlink at any component:
 * openat2 with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS where the kernel has it, otherwise one
 * component at a time, each opened O_NOFOLLOW below the descriptor of the one before. Node's fs
 * has no *at calls, so "below this descriptor" is spelt `/proc/self/fd/<fd>/<name>`: the kernel
 * follows the descriptor's magic link to the directory it holds, then looks up one name in it.
 *
 * Names are byte strings here: each character of a `rel` is one byte of the name (latin1), so a
 * name that is not valid UTF-8 is carried exactly; `bytes()` turns one back into a Buffer path.
 */
import {
  closeSync,
  existsSync,
  constants as fsc,
  fstatSync,
  lstatSync,
  openSync,
  readdirSync,
  readlinkSync,
} from "node:fs";
import { closeRawFd, openAtRaw, openat2Beneath, statxAt, type FileStat } from "./native-file.js";

/** Open the name itself, not the file: no read, no side effect, never blocks (a FIFO, a device). */
export const O_PATH = 0o10000000; // the same value on x86-64 and arm64; Node does not export it
const PROC_FD = "/proc/self/fd";

/**
 * The mode bits a copy keeps: permissions and the sticky bit. Set-user-ID and set-group-ID never
 * travel from one pod's volume into a tree other teams start from.
 */
export const KEPT_MODE_BITS = 0o1777;

export type SkipReason =
  /** A credential file, by its path or its first bytes (credentials.ts). */
  | "credential"
  | "fifo"
  | "socket"
  | "char-device"
  | "block-device"
  | "vanished"
  | "reserved"
  /** A symlink whose target leads out of the tree (absolute, or up through `..`). */
  | "outside"
  /** Something else took the scanned entry's place (another file, a symlink, a directory). */
  | "replaced";

/** A UTF-8 string as a byte string (one character per byte). */
export const toBin = (s: string): string => Buffer.from(s, "utf8").toString("latin1");
/** The bytes of a byte string, as a path for fs calls. */
export const bytes = (bin: string): Buffer => Buffer.from(bin, "latin1");
/** `dir/name` of byte strings, "" being the root. */
export const joinRel = (dir: string, name: string): string => (dir === "" ? name : `${dir}/${name}`);

/** The kernel's path for "the name `name` in the directory held by `fd`" (or that file itself). */
export function at(fd: number, name?: string): Buffer {
  return bytes(name === undefined ? `${PROC_FD}/${fd}` : `${PROC_FD}/${fd}/${name}`);
}

/** Descriptor-relative opens need /proc (every Linux container has it). */
export function requireProcFd(what: string): void {
  if (!existsSync(PROC_FD)) throw new Error(`${what} needs ${PROC_FD} (Linux with /proc mounted)`);
}

export function specialReason(st: FileStat): SkipReason {
  if (st.isFIFO()) return "fifo";
  if (st.isSocket()) return "socket";
  if (st.isCharacterDevice()) return "char-device";
  if (st.isBlockDevice()) return "block-device";
  return "replaced";
}

/** ENOENT: it went away. ELOOP (a symlink), EXDEV (a way out), ENOTDIR (a component is no longer
 * a directory): something took its place. Anything else is a real error. */
export function skipReasonOf(err: unknown): SkipReason | undefined {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  if (code === "ENOENT") return "vanished";
  if (code === "ELOOP" || code === "EXDEV" || code === "ENOTDIR") return "replaced";
  return undefined;
}

/** Opens a directory given by a trusted path (the capture's source, a seed's target). */
export function openDirNoFollow(path: string): number {
  return openSync(path, fsc.O_RDONLY | fsc.O_DIRECTORY | fsc.O_NOFOLLOW);
}

/** Descriptors that openat2 made (not Node's fs): they are closed by closeFd with close(2). */
const rawFds = new Set<number>();

/** Closes a descriptor from openBeneath, whichever way it was opened. */
export function closeFd(fd: number): void {
  if (rawFds.delete(fd)) closeRawFd(fd);
  else closeSync(fd);
}

/**
 * Opens `rel` (a byte string; "" is the directory itself) below `dirFd`, following no symlink
 * anywhere: a symlink at any component fails with ELOOP or ENOTDIR, except a trailing one with
 * O_PATH, which is opened as the link itself (callers fstat what they get). Close what it
 * returns with closeFd.
 */
export function openBeneath(dirFd: number, rel: string, flags: number): number {
  const f = flags | fsc.O_NOFOLLOW;
  if (rel === "") return openSync(at(dirFd), flags);
  const viaKernel = openat2Beneath(dirFd, rel, f);
  if (viaKernel !== undefined) {
    rawFds.add(viaKernel);
    return viaKernel;
  }
  const parts = rel.split("/");
  const last = parts.pop() as string;
  let cur = dirFd;
  try {
    for (const name of parts) {
      const next = openSync(at(cur, name), O_PATH | fsc.O_DIRECTORY | fsc.O_NOFOLLOW);
      if (cur !== dirFd) closeSync(cur);
      cur = next;
    }
    return openSync(at(cur, last), f);
  } finally {
    if (cur !== dirFd) closeSync(cur);
  }
}

export type Opened =
  { fd: number; st: FileStat; skip?: undefined } | { fd?: undefined; st?: undefined; skip: SkipReason };

/** The stat of the open file `fd` (any kind, an O_PATH descriptor too). */
export const statFd = (fd: number): FileStat => statxAt(fd, "") ?? fstatSync(fd, { bigint: true });

// /proc/self/fd, held open by each thread that reopens descriptors through it (Node closes a
// worker's when the worker ends; the main thread's lives as long as the process).
let procFd: number | undefined;

/** Opens the file that the O_PATH descriptor `pathFd` holds, with `flags`: through its magic link
 * in /proc/self/fd, looked up in that directory held open (one name, not a path from the root).
 * Close what it returns with closeFd. */
function reopen(pathFd: number, flags: number): number {
  procFd ??= openSync(PROC_FD, fsc.O_RDONLY | fsc.O_DIRECTORY);
  const fd = openAtRaw(procFd, String(pathFd), flags);
  if (fd === undefined) return openSync(at(pathFd), flags);
  rawFds.add(fd);
  return fd;
}

/**
 * Opens for reading the regular file at `rel` below `dirFd`, if it is still the one that was
 * scanned (same device and inode). It is looked up as a name only (O_PATH: nothing is opened, so
 * a FIFO or a device swapped in is never read and cannot block), checked, and only then opened
 * through that same descriptor, non-blocking. Close the descriptor with closeFd.
 */
export function openScannedFile(dirFd: number, rel: string, want: { dev: bigint; ino: bigint }): Opened {
  let pathFd: number;
  try {
    pathFd = openBeneath(dirFd, rel, O_PATH);
  } catch (err) {
    const skip = skipReasonOf(err);
    if (skip) return { skip };
    throw err;
  }
  try {
    const st = statFd(pathFd);
    if (!st.isFile()) return { skip: specialReason(st) };
    if (st.dev !== want.dev || st.ino !== want.ino) return { skip: "replaced" };
    const flags = fsc.O_RDONLY | fsc.O_NONBLOCK | fsc.O_NOCTTY;
    let fd: number;
    try {
      // O_NOATIME leaves the source's atime alone; only its owner and root may ask for it.
      fd = reopen(pathFd, flags | fsc.O_NOATIME);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EPERM") throw err;
      fd = reopen(pathFd, flags);
    }
    return { fd, st };
  } finally {
    closeFd(pathFd);
  }
}

/** Names in the directory held by `dirFd`, as byte strings. */
export const listDir = (dirFd: number): string[] =>
  readdirSync(at(dirFd), { encoding: "buffer" }).map((b) => b.toString("latin1"));

/** lstat of one name in the directory held by `dirFd`. */
export const lstatAt = (dirFd: number, name: string): FileStat =>
  statxAt(dirFd, name) ?? lstatSync(at(dirFd, name), { bigint: true });

/**
 * The text of the symlink `name` in the directory held by `dirFd`, as a byte string; undefined
 * when the name is no longer a symlink (EINVAL: something else took its place since it was
 * lstat'ed).
 */
export function readlinkAt(dirFd: number, name: string): string | undefined {
  try {
    return readlinkSync(at(dirFd, name), { encoding: "buffer" }).toString("latin1");
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "EINVAL") return undefined;
    throw err;
  }
}
