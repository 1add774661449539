/**
 * Seed: build a pod's writable shadow of a read-only captured tree.
 *
 * Model files stay where they are: the shadow holds symlinks into the read-only tree, so a
 * multi-GB model costs nothing to seed. Compile caches (everything outside `model/`) are copied
 * with their nanosecond times, because engines write into them and rebuild what looks newer. The
 * hub's `.locks` and `refs` are copied too, since engines write there next to the model.
 * Directories are real and owned by whoever runs the seed, so new files can go anywhere. Nothing
 * here needs root or chown: a pod running as any UID can seed its own shadow.
 */
import { randomBytes } from "node:crypto";
import { constants as fsc } from "node:fs";
import { chmod, copyFile, lstat, mkdir, readlink, realpath, rename, rm, symlink } from "node:fs/promises";
import { resolve } from "node:path";
import type { Logger } from "../common/log.js";
import { MANIFEST_FILE, READY_MARKER } from "../core/contract.js";
import { checkParallel } from "./capture.js";
import { setTimesNs } from "./native.js";
import { runPool } from "./pool.js";
import { isReady } from "./ready.js";
import { isMissing, refuseEscapingLinks, scanTree, type TreeEntry } from "./tree.js";

export interface SeedOptions {
  /** The read-only captured tree (must carry the ready marker). */
  from: string;
  /** The writable shadow; created if missing. */
  to: string;
  /** Files copied at once (default 8). */
  parallel?: number;
  log?: Logger;
}

export interface SeedResult {
  /** Model files reached through a symlink into the read-only tree. */
  linked: number;
  /** Files copied (compile caches, `.locks`, `refs`). */
  copied: number;
  bytesCopied: number;
  dirs: number;
  /** The tree's own symlinks, recreated as they are. */
  symlinks: number;
  /** Entries already in the shadow from an earlier seed (or written by the engine since): kept. */
  kept: number;
}

/** Files under `model/` that are used in place; the rest of the tree is copied. */
export function usedInPlace(rel: string): boolean {
  if (!rel.startsWith("model/")) return false;
  const parts = rel.split("/");
  return !parts.includes(".locks") && !parts.includes("refs");
}

export async function seed(opts: SeedOptions): Promise<SeedResult> {
  const parallel = checkParallel(opts.parallel ?? 8);
  const from = await realpath(opts.from).catch((err: unknown) => {
    throw new Error(
      `cannot seed from ${opts.from}: ${isMissing(err) ? "no such directory" : (err as Error).message}`,
    );
  });
  if (!(await isReady(from))) {
    throw new Error(`${from} has no ${READY_MARKER}: the capture is not complete; refusing to seed from it`);
  }
  const toAbs = resolve(opts.to);
  await mkdir(toAbs, { recursive: true });
  const to = await realpath(toAbs);
  if (to === from || to.startsWith(`${from}/`) || from.startsWith(`${to}/`)) {
    throw new Error(`the shadow ${to} and the captured tree ${from} must not contain one another`);
  }

  const scan = await scanTree(from, { reserved: [READY_MARKER, MANIFEST_FILE] });
  refuseEscapingLinks(scan.entries, from);
  const res: SeedResult = { linked: 0, copied: 0, bytesCopied: 0, dirs: 0, symlinks: 0, kept: 0 };

  const dirs = scan.entries.filter((e) => e.kind === "dir" && e.rel !== "");
  for (const d of dirs) {
    await mkdir(`${to}/${d.rel}`, { recursive: true, mode: (Number(d.stat.mode) & 0o777) | 0o700 });
    res.dirs += 1;
  }

  const toCopy: TreeEntry[] = [];
  for (const e of scan.entries) {
    if (e.kind === "file" && !usedInPlace(e.rel)) toCopy.push(e);
    else if (e.kind === "file") {
      if (await placeLink(`${from}/${e.rel}`, `${to}/${e.rel}`)) res.linked += 1;
      else res.kept += 1;
    } else if (e.kind === "symlink") {
      if (await placeLink(e.target as string, `${to}/${e.rel}`)) {
        await setTimesNs(`${to}/${e.rel}`, e.stat.atimeNs, e.stat.mtimeNs, true);
        res.symlinks += 1;
      } else res.kept += 1;
    }
  }

  await runPool(toCopy, parallel, async (e) => {
    const dst = `${to}/${e.rel}`;
    if (await exists(dst)) {
      res.kept += 1;
      return;
    }
    // Copied beside and renamed in, so an interrupted seed never leaves a short file behind.
    const tmp = `${dst}.seed-${randomBytes(4).toString("hex")}`;
    try {
      await copyFile(`${from}/${e.rel}`, tmp, fsc.COPYFILE_FICLONE);
      await chmod(tmp, (Number(e.stat.mode) & 0o777) | 0o600);
      await setTimesNs(tmp, e.stat.atimeNs, e.stat.mtimeNs, false);
      await rename(tmp, dst);
    } catch (err) {
      await rm(tmp, { force: true });
      throw err;
    }
    res.copied += 1;
    res.bytesCopied += Number(e.stat.size);
  });

  // Directory times after their contents, deepest first (the root of the shadow is the pod's).
  dirs.sort((a, b) => b.rel.split("/").length - a.rel.split("/").length);
  for (const d of dirs) await setTimesNs(`${to}/${d.rel}`, d.stat.atimeNs, d.stat.mtimeNs, false);

  opts.log?.info({ from, to, ...res }, "seeded");
  return res;
}

async function exists(path: string): Promise<boolean> {
  try {
    await lstat(path);
    return true;
  } catch (err) {
    if (isMissing(err)) return false;
    throw err;
  }
}

/**
 * Makes `path` a symlink to `target`. Returns false when something is already there and kept: the
 * same link, or a file or directory (the engine's own). A link to elsewhere is replaced.
 */
async function placeLink(target: string, path: string): Promise<boolean> {
  let st;
  try {
    st = await lstat(path);
  } catch (err) {
    if (!isMissing(err)) throw err;
    await symlink(target, path);
    return true;
  }
  if (!st.isSymbolicLink() || (await readlink(path)) === target) return false;
  const tmp = `${path}.seed-${randomBytes(4).toString("hex")}`;
  await symlink(target, tmp);
  await rename(tmp, path);
  return true;
}
