/**
 * The node's cache store: one committed tree per cache, at `<store>/<short>`. A tree that carries
 * its ready marker and a manifest naming the same full hash is the proof that the capture is done,
 * which survives an agent restart.
 *
 * A committed tree is read-only on disk (no write bit on any directory or file), so a restore
 * whose mount forgot `readOnly` still cannot change what every other restore reads; only the
 * agent, which owns the store, makes it writable again to remove it.
 */
import { randomBytes } from "node:crypto";
import type { Stats } from "node:fs";
import { chmod, lstat, mkdir, readdir, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { readManifest, type Manifest } from "../datapath/manifest.js";
import { isReady } from "../datapath/ready.js";
import { shortHash } from "../core/contract.js";

const WRITE_BITS = 0o222;

export class CacheStore {
  constructor(readonly dir: string) {}

  async init(): Promise<void> {
    await mkdir(this.dir, { recursive: true, mode: 0o755 });
  }

  treeDir(hashOrShort: string): string {
    return join(this.dir, shortHash(hashOrShort));
  }

  /** The manifest of the committed tree of this hash, or undefined when there is none. */
  async committed(hash: string): Promise<Manifest | undefined> {
    const dir = this.treeDir(hash);
    if (!(await isReady(dir))) return undefined;
    const m = await readManifest(dir);
    if (m.hash && m.hash !== hash) {
      throw new Error(`${dir} holds a capture of another hash (${m.hash}); refusing to use it for ${hash}`);
    }
    return m;
  }

  /** Every committed tree (name = short hash). */
  async list(): Promise<{ short: string; manifest: Manifest }[]> {
    let names: string[];
    try {
      names = await readdir(this.dir);
    } catch {
      return [];
    }
    const out: { short: string; manifest: Manifest }[] = [];
    for (const name of names.filter((n) => /^[0-9a-f]{16}$/.test(n)).sort()) {
      const dir = join(this.dir, name);
      if (!(await isReady(dir).catch(() => false))) continue;
      const manifest = await readManifest(dir).catch(() => undefined);
      if (manifest) out.push({ short: name, manifest });
    }
    return out;
  }

  /** Bytes of file data the committed trees hold (what the budget is measured against). */
  async usedBytes(): Promise<number> {
    return (await this.list()).reduce((n, t) => n + t.manifest.totalBytes, 0);
  }

  /** Takes the write bits off every directory and file of the committed tree (links have none). */
  async seal(hash: string): Promise<void> {
    await walk(this.treeDir(hash), async (path, st) => {
      if (st.mode & WRITE_BITS) await chmod(path, st.mode & ~WRITE_BITS & 0o7777);
      return st.isDirectory();
    });
  }

  /**
   * Removes a tree (committed or not). Renamed first, into the staging pattern capture cleans up,
   * so a crash halfway never leaves something that looks committed; its directories get their
   * owner's write bit back so the removal works without privileges.
   */
  async remove(hash: string): Promise<boolean> {
    const dir = this.treeDir(hash);
    const trash = `${dir}.tmp-${process.pid}-${randomBytes(6).toString("hex")}`;
    try {
      await rename(dir, trash);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return false;
      throw err;
    }
    await walk(trash, async (path, st) => {
      if (st.isDirectory() && !(st.mode & 0o200)) await chmod(path, (st.mode | 0o700) & 0o7777);
      return st.isDirectory();
    });
    await rm(trash, { recursive: true, force: true });
    return true;
  }

  /** A committed tree that must not be used (the pod went away while it was copied). */
  discard(hash: string): Promise<boolean> {
    return this.remove(hash);
  }
}

/**
 * Visits `root` and everything below it without following a symlink: `visit` gets each directory
 * and regular file with its stat and says whether to go into it. Names are handled as bytes.
 */
async function walk(root: string, visit: (path: Buffer, st: Stats) => Promise<boolean>): Promise<void> {
  const stack: Buffer[] = [Buffer.from(root)];
  while (stack.length) {
    const path = stack.pop()!;
    const st = await lstat(path).catch((err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT") return undefined;
      throw err;
    });
    if (!st || !(st.isDirectory() || st.isFile())) continue;
    if (!(await visit(path, st))) continue;
    const names = await readdir(path, { encoding: "buffer" }).catch((err: NodeJS.ErrnoException) => {
      if (err.code === "ENOENT") return [] as Buffer[];
      throw err;
    });
    for (const name of names) stack.push(Buffer.concat([path, Buffer.from("/"), name]));
  }
}

/** Bytes of regular-file data under `root`, links not followed (what a capture of it will need). */
export async function treeBytes(root: string): Promise<number> {
  let total = 0;
  await walk(root, (_path, st) => {
    if (st.isFile()) total += st.size;
    return Promise.resolve(st.isDirectory());
  });
  return total;
}

/** Where the kubelet keeps a pod's emptyDir volume. */
export function emptyDirPath(kubeletRoot: string, podUid: string, volume: string): string {
  return join(kubeletRoot, "pods", podUid, "volumes", "kubernetes.io~empty-dir", volume);
}
