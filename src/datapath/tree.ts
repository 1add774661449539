/**
 * Walking a cache tree that its owner may be changing: every directory is opened below the
 * root's descriptor with no symlink at any component (beneath.ts), listed through that
 * descriptor, and each entry lstat'ed in it (bigint, so times keep their nanoseconds) before it
 * is read, so the walk itself does not move the times it records. Symlinks that lead out of the
 * tree are set aside with their reason, never followed, and so are credential files
 * (credentials.ts): by their path, or by the first bytes of a small file, read through a
 * descriptor of the very file that was lstat'ed.
 */
import { constants as fsc, readSync } from "node:fs";
import { posix } from "node:path";
import {
  closeFd,
  joinRel,
  listDir,
  lstatAt,
  O_PATH,
  openBeneath,
  openScannedFile,
  readlinkAt,
  skipReasonOf,
  specialReason,
  statFd,
  type Opened,
  type SkipReason,
} from "./beneath.js";
import { isCredentialFile, looksLikeCredential, SNIFF_BYTES, sniffable } from "./credentials.js";
import type { FileStat } from "./native-file.js";

export type EntryKind = "dir" | "file" | "symlink" | "special";

export interface TreeEntry {
  /** Path relative to the root as a byte string (beneath.ts), `/`-separated; "" is the root. */
  rel: string;
  kind: EntryKind;
  stat: FileStat;
  /** Symlinks: the link text as stored (never resolved), a byte string. */
  target?: string;
}

export interface Skipped {
  /** A byte string, like TreeEntry.rel. */
  path: string;
  reason: SkipReason;
}

export interface Scan {
  entries: TreeEntry[];
  skipped: Skipped[];
}

export const isMissing = (err: unknown): boolean => {
  const code = (err as NodeJS.ErrnoException | undefined)?.code;
  return code === "ENOENT" || code === "ENOTDIR";
};

/** Lets other work run on the event loop between stretches of synchronous file-system calls. */
export const yieldNow = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

export interface ScanOptions {
  /** Root-level names a walk must not take from the source (the ready marker and manifest
   * belong to the copy, never to what is copied). */
  reserved?: readonly string[];
  /** Checked between stretches of work: throw to stop the walk (a deadline, a cancel). */
  checkpoint?: () => void;
}

const sameInode = (a: FileStat, b: FileStat): boolean => a.dev === b.dev && a.ino === b.ino;
const inodeKey = (st: FileStat): string => `${st.dev}:${st.ino}`;

const sniffBuf = Buffer.alloc(SNIFF_BYTES);

/**
 * Why the regular file `name` (at `rel`, in the folder held by `dirFd`, among `names`) stays out
 * of the tree: "credential" by its path or its first bytes, or a skip reason when it is gone or
 * replaced since it was lstat'ed. Undefined: it is copied. A file that cannot be read is left to
 * the copy, which reports it.
 */
function credentialSkip(
  dirFd: number,
  name: string,
  rel: string,
  st: FileStat,
  names: readonly string[],
): SkipReason | undefined {
  if (isCredentialFile(rel, names)) return "credential";
  if (!sniffable(rel, st.size)) return undefined;
  let o: Opened;
  try {
    o = openScannedFile(dirFd, name, st);
  } catch {
    return undefined;
  }
  if (o.skip) return o.skip;
  try {
    const n = readSync(o.fd, sniffBuf, 0, SNIFF_BYTES, 0);
    const whole = n < SNIFF_BYTES || st.size === BigInt(SNIFF_BYTES);
    return looksLikeCredential(sniffBuf.subarray(0, n), whole) ? "credential" : undefined;
  } catch {
    return undefined;
  } finally {
    closeFd(o.fd);
  }
}

/**
 * Lists every entry below the directory held by `rootFd`. Entries that vanish or are replaced
 * during the walk are recorded as skipped, as are FIFOs, sockets, devices and symlinks that lead
 * out of the tree; none of them fails the walk.
 *
 * The calls are synchronous: a walk is tens of thousands of lstat calls, and a round trip through
 * libuv's thread pool costs more than the call itself. The loop yields every few hundred entries
 * so a server running it keeps answering.
 */
export async function scanTree(rootFd: number, opts: ScanOptions = {}): Promise<Scan> {
  const rootStat = statFd(rootFd);
  if (!rootStat.isDirectory()) throw new Error("the root of a scan must be a directory");
  const entries: TreeEntry[] = [{ rel: "", kind: "dir", stat: rootStat }];
  const skipped: Skipped[] = [];
  const reserved = new Set(opts.reserved ?? []);
  const gone = new Set<string>();
  // Inodes set aside as credentials: their other names (hard links) go too.
  const secret = new Set<string>();
  const pending: TreeEntry[] = [entries[0] as TreeEntry];
  let sinceYield = 0;

  for (let dir = pending.pop(); dir !== undefined; dir = pending.pop()) {
    const lost = (reason: SkipReason): void => {
      gone.add(dir.rel);
      skipped.push({ path: dir.rel, reason });
    };
    let dirFd: number;
    try {
      dirFd = dir.rel === "" ? rootFd : openBeneath(rootFd, dir.rel, O_PATH | fsc.O_DIRECTORY);
    } catch (err) {
      const reason = skipReasonOf(err);
      if (!reason) throw err;
      lost(reason);
      continue;
    }
    try {
      // The directory listed must be the one whose times were recorded.
      if (dirFd !== rootFd && !sameInode(statFd(dirFd), dir.stat)) {
        lost("replaced");
        continue;
      }
      let names: string[];
      try {
        names = listDir(dirFd);
      } catch (err) {
        const reason = skipReasonOf(err);
        if (!reason) throw err;
        lost(reason);
        continue;
      }
      for (const name of names) {
        const rel = joinRel(dir.rel, name);
        if (dir.rel === "" && reserved.has(name)) {
          skipped.push({ path: rel, reason: "reserved" });
          continue;
        }
        try {
          const st = lstatAt(dirFd, name);
          if (st.isDirectory()) {
            const e: TreeEntry = { rel, kind: "dir", stat: st };
            entries.push(e);
            pending.push(e);
          } else if (st.isFile()) {
            const skip = credentialSkip(dirFd, name, rel, st, names);
            if (skip === "credential") secret.add(inodeKey(st));
            if (skip) skipped.push({ path: rel, reason: skip });
            else entries.push({ rel, kind: "file", stat: st });
          } else if (st.isSymbolicLink()) {
            const target = readlinkAt(dirFd, name);
            if (target === undefined) skipped.push({ path: rel, reason: "replaced" });
            else entries.push({ rel, kind: "symlink", stat: st, target });
          } else {
            skipped.push({ path: rel, reason: specialReason(st) });
          }
        } catch (err) {
          const reason = skipReasonOf(err);
          if (!reason) throw err;
          skipped.push({ path: rel, reason: reason === "replaced" ? "vanished" : reason });
        }
        if (++sinceYield >= 256) {
          sinceYield = 0;
          opts.checkpoint?.();
          await yieldNow();
        }
      }
    } finally {
      if (dirFd !== rootFd) closeFd(dirFd);
    }
  }

  const cmp = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);
  // A directory that went was listed by its parent before it did: drop it and its subtree.
  const under = (rel: string): boolean => [...gone].some((g) => rel === g || rel.startsWith(`${g}/`));
  let kept = gone.size ? entries.filter((e) => !under(e.rel)) : entries;
  if (secret.size) {
    const linked = (e: TreeEntry): boolean => e.kind === "file" && secret.has(inodeKey(e.stat));
    for (const e of kept) if (linked(e)) skipped.push({ path: e.rel, reason: "credential" });
    kept = kept.filter((e) => !linked(e));
  }
  // Links out of the tree are set aside, judged against every link seen (see staysInside).
  const links = new Map<string, string>();
  for (const e of kept) if (e.kind === "symlink") links.set(e.rel, e.target as string);
  const outside = new Set([...links].filter(([rel, t]) => !staysInside(rel, t, links)).map(([rel]) => rel));
  if (outside.size) {
    kept = kept.filter((e) => !outside.has(e.rel));
    for (const rel of outside) skipped.push({ path: rel, reason: "outside" });
  }
  return {
    entries: kept.sort((a, b) => cmp(a.rel, b.rel)),
    skipped: skipped.sort((a, b) => cmp(a.path, b.path)),
  };
}

/**
 * Whether the symlink at `linkRel` with text `target` resolves inside the tree, following the
 * tree's own symlinks the way the kernel would (`links` maps each symlink's path to its text). A
 * lexical check alone is not enough: with `a -> ../..` deep in the tree, `b -> a/..` looks inside
 * but climbs out. Absolute targets always count as outside: they name the source's location,
 * which a restored tree does not share. Components that do not exist are taken lexically, which
 * can only refuse more, never less.
 */
export function staysInside(linkRel: string, target: string, links: ReadonlyMap<string, string>): boolean {
  if (posix.isAbsolute(target)) return false;
  const stack = linkRel.split("/").slice(0, -1);
  let pending = target.split("/");
  let hops = 0;
  while (pending.length > 0) {
    const c = pending[0] as string;
    pending = pending.slice(1);
    if (c === "" || c === ".") continue;
    if (c === "..") {
      if (stack.length === 0) return false;
      stack.pop();
      continue;
    }
    stack.push(c);
    const t = links.get(stack.join("/"));
    if (t === undefined) continue;
    // A cycle never resolves, so it cannot reach outside either.
    if (++hops > 40) return true;
    if (posix.isAbsolute(t)) return false;
    stack.pop();
    pending = [...t.split("/"), ...pending];
  }
  return true;
}
