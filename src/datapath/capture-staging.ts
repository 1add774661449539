/**
 * The staging directory a capture writes into beside its destination: its name, the ones a dead
 * run left behind, and a destination that must be cleared (or refused) before a capture starts.
 */
import { randomBytes } from "node:crypto";
import { lstat, readdir, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { MANIFEST_FILE } from "../core/contract.js";
import { AlreadyCapturedError } from "./capture-errors.js";
import { readManifest } from "./manifest.js";
import { isReady } from "./ready.js";
import { isMissing } from "./tree.js";

/** Staging directories this process is writing now; anything else with our name pattern is stale. */
export const activeStaging = new Set<string>();

/** A staging name beside `dest`, `<dest>.tmp-<pid>-<hex>`, that a later run can tell is stale. */
export const stagingPath = (dest: string): string =>
  `${dest}.tmp-${process.pid}-${randomBytes(6).toString("hex")}`;

/**
 * Removes `<base>.tmp-<pid>-<hex>` directories left by a run that died: their pid is gone, or is
 * ours (a restarted container gets the same pid) without the directory being one we are writing.
 */
export async function removeStaleStaging(parent: string, base: string): Promise<void> {
  const prefix = `${base}.tmp-`;
  for (const name of await readdir(parent)) {
    if (!name.startsWith(prefix)) continue;
    const m = /^(\d+)-[0-9a-f]+$/.exec(name.slice(prefix.length));
    if (!m) continue;
    const pid = Number(m[1]);
    const path = join(parent, name);
    if (pid === process.pid ? activeStaging.has(path) : pidAlive(pid)) continue;
    await rm(path, { recursive: true, force: true });
  }
}

function pidAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Refuses to touch a committed capture or a directory that is not ours; clears our own leftovers. */
export async function prepareDest(dest: string): Promise<void> {
  let st;
  try {
    st = await lstat(dest);
  } catch (err) {
    if (isMissing(err)) return;
    throw err;
  }
  if (!st.isDirectory()) throw new Error(`${dest} exists and is not a directory; refusing to overwrite it`);
  if (await isReady(dest))
    throw new AlreadyCapturedError(dest, await readManifest(dest).catch(() => undefined));
  const names = await readdir(dest);
  if (names.length === 0) return;
  if (!names.includes(MANIFEST_FILE)) {
    throw new Error(`${dest} exists and is not a capture; refusing to overwrite it`);
  }
  // Committed but never marked ready (the run died between rename and marker): not complete
  // as far as anyone can tell, so it is redone. Renamed first so a crash here leaves only a
  // staging name that the next run removes.
  const trash = stagingPath(dest);
  await rename(dest, trash);
  await rm(trash, { recursive: true, force: true });
}
