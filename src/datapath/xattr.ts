/**
 * The `user.*` extended attributes of a captured file or directory, copied from the source's open
 * descriptor to the copy's: flistxattr, fgetxattr and fsetxattr reached through koffi, like the
 * calls in native.ts. No name is looked up again, so a path the pod swaps mid-capture is never
 * followed.
 *
 * Only the user namespace travels. security.* (LSM labels, file capabilities), trusted.* and
 * system.* (ACLs) are privilege- or kernel-managed, and never move from a pod's volume into a
 * tree other pods start from. The pod controls the attributes, so a copy is bounded: the first
 * MAX_XATTRS user names the kernel lists, each copied only while the values copied so far stay
 * within MAX_XATTR_BYTES; the rest are dropped. Nothing here fails a capture: a filesystem that
 * keeps no extended attributes (ENOTSUP) on either side, or any other refusal, only means fewer
 * attributes are copied.
 */
import { constants as osConstants } from "node:os";

type Flistxattr = (fd: number, list: Buffer, size: number) => number | bigint;
type Fgetxattr = (fd: number, name: Buffer, value: Buffer, size: number) => number | bigint;
type Fsetxattr = (fd: number, name: Buffer, value: Buffer, size: number, flags: number) => number;

interface XattrCalls {
  flistxattr: Flistxattr;
  fgetxattr: Fgetxattr;
  fsetxattr: Fsetxattr;
  errno: () => number;
}

async function loadCalls(): Promise<XattrCalls | null> {
  if (process.platform !== "linux" || process.env.WARMSTART_NO_NATIVE === "1") return null;
  try {
    const koffi = await import("koffi");
    // The process's own symbols: libc is already linked into node, whichever libc it is.
    const lib = koffi.load(null);
    return {
      // Names go as NUL-terminated bytes: a name need not be valid UTF-8.
      flistxattr: lib.func("intptr_t flistxattr(int, void *, size_t)") as Flistxattr,
      fgetxattr: lib.func("intptr_t fgetxattr(int, const void *, void *, size_t)") as Fgetxattr,
      fsetxattr: lib.func("int fsetxattr(int, const void *, const void *, size_t, int)") as Fsetxattr,
      errno: () => koffi.errno(),
    };
  } catch {
    return null;
  }
}

const calls = await loadCalls();

/** At most this many user attributes of one file are copied. */
export const MAX_XATTRS = 64;
/** At most this many bytes of attribute values of one file are copied. */
export const MAX_XATTR_BYTES = 64 << 10;
/** The kernel never lists more than this (XATTR_LIST_MAX); a longer list fails with E2BIG. */
const LIST_MAX = 64 << 10;
const USER = Buffer.from("user.");
const NUL = Buffer.from([0]);

// Reused by every copy of a thread (copiers are worker threads; each has its own).
let listBuf: Buffer | undefined;
let valueBuf: Buffer | undefined;

/** Whether extended attributes can be copied here (koffi loaded). */
export const xattrsAvailable = (): boolean => calls !== null;

export interface XattrCopy {
  copied: number;
  /** User attributes left out: over the bounds, unreadable, or refused by the copy's side. */
  dropped: number;
}

/** The attribute names of the open file `fd`, raw bytes; empty when there are none or they
 * cannot be listed (ENOTSUP: a filesystem that keeps none; E2BIG: a list over the kernel's
 * maximum). */
function listNames(fd: number): Buffer[] {
  if (!calls) return [];
  listBuf ??= Buffer.alloc(LIST_MAX);
  const n = Number(calls.flistxattr(fd, listBuf, LIST_MAX));
  const names: Buffer[] = [];
  for (let start = 0; start < n;) {
    const nul = listBuf.indexOf(0, start);
    const end = nul < 0 || nul > n ? n : nul;
    if (end > start) names.push(Buffer.from(listBuf.subarray(start, end)));
    start = end + 1;
  }
  return names;
}

const isUser = (name: Buffer): boolean =>
  name.length > USER.length && name.subarray(0, USER.length).equals(USER);

/**
 * Copies the `user.*` attributes of the open file (or directory) `srcFd` onto `dstFd`, within
 * MAX_XATTRS names and MAX_XATTR_BYTES of values; never throws for an attribute. Call it while the
 * copy is still its creator's and writable (before fchown and fchmod: setting a user attribute
 * needs write permission on the inode), and before its times are set.
 */
export function copyUserXattrs(srcFd: number, dstFd: number): XattrCopy {
  const out: XattrCopy = { copied: 0, dropped: 0 };
  if (!calls) return out;
  const names = listNames(srcFd).filter(isUser);
  valueBuf ??= Buffer.alloc(MAX_XATTR_BYTES);
  let used = 0;
  for (const [i, name] of names.entries()) {
    if (i >= MAX_XATTRS) {
      out.dropped += names.length - i;
      break;
    }
    const cName = Buffer.concat([name, NUL]);
    const room = MAX_XATTR_BYTES - used;
    // ERANGE: more than the room left; ENODATA: removed since the listing. With no room left,
    // size 0 asks for the value's length only: then only an empty value fits.
    const n = Number(calls.fgetxattr(srcFd, cName, valueBuf, room));
    if (n < 0 || n > room) {
      out.dropped += 1;
      continue;
    }
    if (calls.fsetxattr(dstFd, cName, valueBuf, n, 0) !== 0) {
      // A copy on a filesystem that keeps none: nothing more will go there either.
      if (calls.errno() === osConstants.errno.EOPNOTSUPP) {
        out.dropped += names.length - i;
        break;
      }
      out.dropped += 1;
      continue;
    }
    used += n;
    out.copied += 1;
  }
  return out;
}

/** Every attribute name of the open file `fd` (any namespace), as byte strings (one character
 * per byte). */
export const listXattrs = (fd: number): string[] => listNames(fd).map((b) => b.toString("latin1"));

/** The value of attribute `name` (a byte string) of the open file `fd`; undefined when it has no
 * such attribute or it cannot be read. */
export function getXattr(fd: number, name: string): Buffer | undefined {
  if (!calls) return undefined;
  const cName = Buffer.concat([Buffer.from(name, "latin1"), NUL]);
  const size = Number(calls.fgetxattr(fd, cName, Buffer.alloc(0), 0));
  if (size < 0) return undefined;
  const value = Buffer.alloc(size);
  const n = Number(calls.fgetxattr(fd, cName, value, size));
  return n < 0 ? undefined : value.subarray(0, n);
}

/** Sets attribute `name` (a byte string) of the open file `fd`; throws with the errno's code
 * (ENOTSUP where the filesystem keeps none, EPERM for a namespace this process may not write). */
export function setXattr(fd: number, name: string, value: Buffer): void {
  if (!calls) throw new Error("fsetxattr needs the native helpers");
  const cName = Buffer.concat([Buffer.from(name, "latin1"), NUL]);
  if (calls.fsetxattr(fd, cName, value, value.length, 0) !== 0) {
    const errno = calls.errno();
    const code = Object.entries(osConstants.errno).find(([, v]) => v === errno)?.[0] ?? `E${errno}`;
    const err: NodeJS.ErrnoException = new Error(`${code}: fsetxattr ${name} failed (errno ${errno})`);
    err.code = code;
    err.errno = errno;
    throw err;
  }
}
