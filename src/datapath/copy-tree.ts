/**
 * Copies a scanned tree into staging: directories first, then the files (copy-files.ts), then
 * symlinks, and directory metadata last, deepest first, so nothing created later moves a time.
 * Files and directories keep their user.* extended attributes (xattr.ts); symlinks have none.
 */
import {
  chmodSync,
  closeSync,
  constants as fsc,
  fstatSync,
  lchownSync,
  mkdirSync,
  openSync,
  symlinkSync,
} from "node:fs";
import { bytes, closeFd, openBeneath, openScannedFile, toBin } from "./beneath.js";
import type { CopiedFile, CopyMember, CopyTask } from "./copy-protocol.js";
import { copyFiles, type CopyOptions } from "./copy-files.js";
import { probeCopyMethod, setTimesNsSync, type CopyMethod } from "./native.js";
import { yieldNow, type Scan, type Skipped, type TreeEntry } from "./tree.js";
import { KEPT_MODE_BITS } from "./beneath.js";
import { copyUserXattrs, xattrsAvailable } from "./xattr.js";

/** A file this big is a batch of its own (copy-files.ts). */
const BIG = 8n << 20n;

export const isRoot = (): boolean => process.getuid?.() === 0;

export interface Copied {
  files: CopiedFile[];
  /** Byte strings. */
  symlinks: { path: string; target: string }[];
  dirs: number;
  skipped: Skipped[];
  method: CopyMethod;
  digestMs: number;
  /** Bytes written with O_DIRECT (big files), past the page cache. */
  directBytes: number;
}

export async function copyTree(
  rootFd: number,
  stagingPath: string,
  scan: Scan,
  o: CopyOptions,
): Promise<Copied> {
  const staging = toBin(stagingPath);
  const at = (rel: string): Buffer => bytes(`${staging}/${rel}`);
  const dirs = scan.entries.filter((e) => e.kind === "dir");
  const links = scan.entries.filter((e) => e.kind === "symlink");
  // Files sharing an inode in the tree are one copy plus hard links to it.
  const groups = new Map<string, CopyTask>();
  for (const e of scan.entries) {
    if (e.kind !== "file") continue;
    const key = e.stat.nlink > 1n ? `${e.stat.dev}:${e.stat.ino}` : e.rel;
    const m: CopyMember = {
      rel: e.rel,
      atimeNs: e.stat.atimeNs,
      mtimeNs: e.stat.mtimeNs,
      size: e.stat.size,
      dev: e.stat.dev,
      ino: e.stat.ino,
    };
    const g = groups.get(key);
    if (g) g.push(m);
    else groups.set(key, [m]);
  }
  // Big files first, largest first, so one does not start last and run alone. Then the small
  // ones by path, so that a batch (copy-files.ts) is mostly one directory and two copiers
  // create their files in different directories: creating a file takes its directory's lock,
  // and a copier waiting on a lock the other holds spins on it.
  const size = (t: CopyTask): bigint => (t[0] as CopyMember).size;
  const rel = (t: CopyTask): string => (t[0] as CopyMember).rel;
  const tasks = [...groups.values()].sort((a, b) => {
    const [sa, sb] = [size(a), size(b)];
    if (sa >= BIG || sb >= BIG) return sb > sa ? 1 : sb < sa ? -1 : 0;
    return rel(a) < rel(b) ? -1 : rel(a) > rel(b) ? 1 : 0;
  });

  let n = 0;
  for (const d of dirs) {
    if (d.rel !== "") mkdirSync(at(d.rel), { mode: 0o700 });
    if (++n % 256 === 0) await yieldNow();
  }

  const method = await probeMethod(rootFd, tasks, stagingPath);
  const copied = await copyFiles(rootFd, staging, tasks, method === "reflink", o);

  const symlinks: Copied["symlinks"] = [];
  for (const e of links) {
    const dst = at(e.rel);
    symlinkSync(bytes(e.target as string), dst);
    if (isRoot()) lchownSync(dst, Number(e.stat.uid), Number(e.stat.gid));
    setTimesNsSync(dst, e.stat.atimeNs, e.stat.mtimeNs, true);
    symlinks.push({ path: e.rel, target: e.target as string });
    if (++n % 256 === 0) await yieldNow();
  }

  // Directory times last, deepest first: creating anything inside a directory moves its mtime.
  const byDepth = dirs.filter((d) => d.rel !== "").sort((a, b) => depth(b.rel) - depth(a.rel));
  for (const d of byDepth) {
    copyDirXattrs(rootFd, d, at(d.rel));
    applyMeta(at(d.rel), d);
    if (++n % 256 === 0) await yieldNow();
  }
  // The root's owner, mode and times are the caller's to set (capture.ts); its attributes here,
  // while staging is still ours.
  const root = dirs.find((d) => d.rel === "");
  if (root) copyDirXattrs(rootFd, root, bytes(staging));

  const byPath = (a: { path: string }, b: { path: string }): number =>
    a.path < b.path ? -1 : a.path > b.path ? 1 : 0;
  return {
    files: copied.files.sort(byPath),
    symlinks,
    dirs: dirs.length,
    skipped: copied.skipped.sort(byPath),
    method,
    digestMs: copied.digestMs,
    directBytes: copied.directBytes,
  };
}

/** The kernel primitive the copy will use, tried on the first non-empty file that is still the
 * one the walk saw (opened like any other: by descriptor, checked, non-blocking). */
async function probeMethod(rootFd: number, tasks: CopyTask[], staging: string): Promise<CopyMethod> {
  for (const t of tasks) {
    const m = t[0] as CopyMember;
    if (m.size === 0n) break;
    const o = openScannedFile(rootFd, m.rel, m);
    if (o.skip) continue;
    try {
      return await probeCopyMethod(o.fd, staging);
    } finally {
      closeFd(o.fd);
    }
  }
  return "copy";
}

const depth = (rel: string): number => rel.split("/").length;

/**
 * The user.* extended attributes of a scanned directory onto its copy `dst` (in staging, ours),
 * read through a descriptor opened below the root with no symlink on the way, if it is still the
 * directory the walk saw. One gone, replaced or unreadable since keeps none: never an error.
 */
function copyDirXattrs(rootFd: number, e: TreeEntry, dst: Buffer): void {
  if (!xattrsAvailable()) return;
  try {
    const src = e.rel === "" ? rootFd : openBeneath(rootFd, e.rel, fsc.O_RDONLY | fsc.O_DIRECTORY);
    try {
      const st = fstatSync(src, { bigint: true });
      if (!st.isDirectory() || st.dev !== e.stat.dev || st.ino !== e.stat.ino) return;
      const out = openSync(dst, fsc.O_RDONLY | fsc.O_DIRECTORY | fsc.O_NOFOLLOW);
      try {
        copyUserXattrs(src, out);
      } finally {
        closeSync(out);
      }
    } finally {
      if (src !== rootFd) closeFd(src);
    }
  } catch {
    // Gone (ENOENT), replaced (ELOOP, ENOTDIR, EXDEV) or not readable (EACCES): no attributes.
  }
}

/** Mode, owner (when we may) and nanosecond times of a directory. */
function applyMeta(path: string | Buffer, e: TreeEntry): void {
  if (isRoot()) lchownSync(path, Number(e.stat.uid), Number(e.stat.gid));
  chmodSync(path, Number(e.stat.mode) & KEPT_MODE_BITS);
  setTimesNsSync(path, e.stat.atimeNs, e.stat.mtimeNs, false);
}
