/**
 * Walking a cache tree: one lstat per entry (bigint, so times keep their nanoseconds), taken
 * before the entry is read so the walk itself does not move the times it records; and the check
 * that a symlink stays inside the tree, done on the whole walk before anything is copied.
 */
import type { BigIntStats } from "node:fs";
import { lstatSync, readdirSync, readlinkSync } from "node:fs";
import { lstat } from "node:fs/promises";
import { posix } from "node:path";

export type EntryKind = "dir" | "file" | "symlink" | "special";
export type SkipReason = "fifo" | "socket" | "char-device" | "block-device" | "vanished" | "reserved";

export interface TreeEntry {
  /** Path relative to the root, `/`-separated; "" is the root itself. */
  rel: string;
  kind: EntryKind;
  stat: BigIntStats;
  /** Symlinks: the link text as stored (never resolved). */
  target?: string;
}

export interface Skipped {
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

function specialReason(st: BigIntStats): SkipReason {
  if (st.isFIFO()) return "fifo";
  if (st.isSocket()) return "socket";
  if (st.isCharacterDevice()) return "char-device";
  return "block-device";
}

const join = (dir: string, name: string): string => (dir === "" ? name : `${dir}/${name}`);

/** Lets other work run on the event loop between stretches of synchronous file-system calls. */
export const yieldNow = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/**
 * Lists every entry under `root` (which must be a directory). Entries that vanish during the walk
 * are recorded as skipped; `reserved` names the root-level files a walk must not take from the
 * source (the ready marker and manifest belong to the copy, never to what is copied).
 *
 * The calls are synchronous: a walk is tens of thousands of lstat calls, and a round trip through
 * libuv's thread pool costs more than the call itself. The loop yields every few hundred entries
 * so a server running it keeps answering.
 */
export async function scanTree(root: string, opts: { reserved?: readonly string[] } = {}): Promise<Scan> {
  const rootStat = await lstat(root, { bigint: true });
  if (!rootStat.isDirectory()) throw new Error(`${root} is not a directory`);
  const entries: TreeEntry[] = [{ rel: "", kind: "dir", stat: rootStat }];
  const skipped: Skipped[] = [];
  const reserved = new Set(opts.reserved ?? []);
  const gone = new Set<string>();
  const pending: string[] = [""];
  let sinceYield = 0;

  for (let dir = pending.pop(); dir !== undefined; dir = pending.pop()) {
    let names: string[];
    try {
      names = readdirSync(dir === "" ? root : `${root}/${dir}`);
    } catch (err) {
      if (!isMissing(err)) throw err;
      gone.add(dir);
      skipped.push({ path: dir, reason: "vanished" });
      continue;
    }
    for (const name of names) {
      const rel = join(dir, name);
      if (dir === "" && reserved.has(name)) {
        skipped.push({ path: rel, reason: "reserved" });
        continue;
      }
      const abs = `${root}/${rel}`;
      try {
        const st = lstatSync(abs, { bigint: true });
        if (st.isDirectory()) {
          entries.push({ rel, kind: "dir", stat: st });
          pending.push(rel);
        } else if (st.isFile()) {
          entries.push({ rel, kind: "file", stat: st });
        } else if (st.isSymbolicLink()) {
          entries.push({ rel, kind: "symlink", stat: st, target: readlinkSync(abs) });
        } else {
          skipped.push({ path: rel, reason: specialReason(st) });
        }
      } catch (err) {
        if (!isMissing(err)) throw err;
        skipped.push({ path: rel, reason: "vanished" });
      }
      if (++sinceYield >= 256) {
        sinceYield = 0;
        await yieldNow();
      }
    }
  }

  const cmp = (a: string, b: string): number => (a < b ? -1 : a > b ? 1 : 0);
  // A directory that vanished was listed by its parent before it went: drop it and its subtree.
  const under = (rel: string): boolean => [...gone].some((g) => rel === g || rel.startsWith(`${g}/`));
  return {
    entries: (gone.size ? entries.filter((e) => !under(e.rel)) : entries).sort((a, b) => cmp(a.rel, b.rel)),
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

/** Throws a one-line error naming the first symlink that leads outside the tree. */
export function refuseEscapingLinks(entries: readonly TreeEntry[], root: string): void {
  const links = new Map<string, string>();
  for (const e of entries) if (e.kind === "symlink" && e.target !== undefined) links.set(e.rel, e.target);
  const bad = [...links].filter(([rel, target]) => !staysInside(rel, target, links));
  const first = bad[0];
  if (!first) return;
  const more = bad.length > 1 ? ` (and ${bad.length - 1} more)` : "";
  throw new Error(
    `refusing to capture ${root}: symlink ${first[0]} -> ${first[1]} leads outside the tree${more}`,
  );
}
