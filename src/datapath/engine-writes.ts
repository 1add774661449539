/**
 * What a restored pod's engine wrote into its caches: the files of its writable shadow (outside
 * `model/`) changed since its engine started. The seed copies the tree's files with the times the
 * leader's engine gave them, so a file this new is one the restored engine wrote: a kernel or a
 * graph the restored cache did not hold, compiled again. Locks are left out (engines take them
 * around lookups that hit).
 *
 * The shadow is the pod's own and may change as it is read: the walk holds directory descriptors
 * and follows no symlink (beneath.ts), and stops at a bound of entries and depth, saying nothing
 * (undefined) rather than a partial count.
 */
import { constants as fsc } from "node:fs";
import type { EngineWrites } from "../core/startup.js";
import { closeFd, joinRel, listDir, lstatAt, openBeneath, openDirNoFollow, toBin } from "./beneath.js";

const MAX_ENTRIES = 50_000;
const MAX_DEPTH = 24;
const MODEL_DIR = "model";

const isLock = (rel: string): boolean => rel.endsWith(".lock") || rel.split("/").includes("locks");

/** Files under `shadow` (a trusted path) modified at or after `sinceMs`; undefined past the bounds. */
export function engineWritesSince(
  shadow: string,
  sinceMs: number,
  bounds: { maxEntries?: number } = {},
): EngineWrites | undefined {
  const maxEntries = bounds.maxEntries ?? MAX_ENTRIES;
  const since = BigInt(Math.floor(sinceMs)) * 1_000_000n;
  const out: EngineWrites = { files: 0 };
  let entries = 0;
  const walk = (dirFd: number, rel: string, depth: number): boolean => {
    for (const name of listDir(dirFd)) {
      if (++entries > maxEntries) return false;
      const path = joinRel(rel, name);
      if (rel === "" && name === toBin(MODEL_DIR)) continue;
      let st: ReturnType<typeof lstatAt>;
      try {
        st = lstatAt(dirFd, name);
      } catch {
        continue; // gone since it was listed
      }
      if (st.isDirectory()) {
        if (depth >= MAX_DEPTH) return false;
        let fd: number;
        try {
          fd = openBeneath(dirFd, name, fsc.O_RDONLY | fsc.O_DIRECTORY);
        } catch {
          continue; // replaced by something else since it was listed
        }
        try {
          if (!walk(fd, path, depth + 1)) return false;
        } finally {
          closeFd(fd);
        }
      } else if (st.isFile() && st.mtimeNs >= since && !isLock(path)) {
        out.files++;
        out.example ??= Buffer.from(path, "latin1").toString("utf8").slice(0, 200);
      }
    }
    return true;
  };
  const root = openDirNoFollow(shadow);
  try {
    return walk(root, "", 0) ? out : undefined;
  } finally {
    closeFd(root);
  }
}
