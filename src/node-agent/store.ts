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
import { closeSync, type Stats } from "node:fs";
import { chmod, lstat, mkdir, readdir, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { openDirNoFollow, requireProcFd, skipReasonOf } from "../datapath/beneath.js";
import { CaptureStoppedError } from "../datapath/capture.js";
import { readManifest, type Manifest } from "../datapath/manifest.js";
import { isReady } from "../datapath/ready.js";
import { scanTree } from "../datapath/tree.js";
import { shortHash } from "../core/contract.js";

const WRITE_BITS = 0o222;

export interface StoredTree {
  short: string;
  manifest: Manifest;
}

/** Bytes of file data these committed trees hold. */
export const bytesOf = (trees: readonly StoredTree[]): number =>
  trees.reduce((n, t) => n + t.manifest.totalBytes, 0);

/**
 * Bytes held against the store budget: the committed trees, plus what captures reserved before
 * they commit. A capture keeps its reservation until its pipeline ends, after its tree is
 * committed and listed, so a reservation counts only while its tree is not among `trees`.
 */
export function heldBytes(trees: readonly StoredTree[], reserved: ReadonlyMap<string, number>): number {
  const listed = new Set(trees.map((t) => t.short));
  let held = bytesOf(trees);
  for (const [short, bytes] of reserved) if (!listed.has(short)) held += bytes;
  return held;
}

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

  /** The committed tree of a short hash, whatever its full hash (undefined when there is none). */
  async stored(short: string): Promise<StoredTree | undefined> {
    const dir = this.treeDir(short);
    if (!(await isReady(dir).catch(() => false))) return undefined;
    const manifest = await readManifest(dir).catch(() => undefined);
    return manifest ? { short, manifest } : undefined;
  }

  /** Every committed tree (name = short hash). */
  async list(): Promise<StoredTree[]> {
    let names: string[];
    try {
      names = await readdir(this.dir);
    } catch {
      return [];
    }
    const out: StoredTree[] = [];
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
    return bytesOf(await this.list());
  }

  /**
   * Takes the write bits off every directory and file of the committed tree (links have none) and
   * gives every one read (and every directory search) to all: restores seed from it as any UID of
   * the scope, and engines write caches owner-only (vLLM's and Python's temp-file renames are
   * 0600), which no restore but root's could read.
   */
  async seal(hash: string): Promise<void> {
    await walk(this.treeDir(hash), async (path, st) => {
      const sealed = (st.mode | (st.isDirectory() ? 0o555 : 0o444)) & ~WRITE_BITS & 0o7777;
      if (sealed !== (st.mode & 0o7777)) await chmod(path, sealed);
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

export interface SizeOptions {
  /** Aborting it stops the sizing (the leader went away, the agent stops). */
  signal?: AbortSignal;
  /** Milliseconds the sizing may take (0 or absent: no limit). */
  deadlineMs?: number;
}

/**
 * Bytes of regular-file data under `root` (what a capture of it will need; hard links count
 * once). `root` is a live folder its pod keeps changing, so it is walked as a capture walks it
 * (tree.ts): every directory opened below the root's descriptor with no symlink at any
 * component, so a folder swapped for a symlink to elsewhere is never counted. A missing root
 * holds nothing. Stops with CaptureStoppedError when `signal` aborts or the deadline passes.
 */
export async function treeBytes(root: string, o: SizeOptions = {}): Promise<number> {
  requireProcFd("sizing a cache");
  const until = o.deadlineMs ? performance.now() + o.deadlineMs : Infinity;
  const checkpoint = (): void => {
    if (o.signal?.aborted)
      throw new CaptureStoppedError("aborted", `sizing ${root} was cancelled; nothing was captured`);
    if (performance.now() > until)
      throw new CaptureStoppedError(
        "deadline",
        `sizing ${root} passed the capture's deadline (${Math.round((o.deadlineMs ?? 0) / 1000)} s); nothing was captured`,
      );
  };
  checkpoint();
  let fd: number;
  try {
    fd = openDirNoFollow(root);
  } catch (err) {
    if (skipReasonOf(err)) return 0;
    throw err;
  }
  try {
    const { entries } = await scanTree(fd, { checkpoint });
    checkpoint();
    const inodes = new Set<string>();
    let total = 0;
    for (const e of entries) {
      if (e.kind !== "file") continue;
      if (e.stat.nlink > 1n) {
        const key = `${e.stat.dev}:${e.stat.ino}`;
        if (inodes.has(key)) continue;
        inodes.add(key);
      }
      total += Number(e.stat.size);
    }
    return total;
  } finally {
    closeSync(fd);
  }
}

/** Where the kubelet keeps a pod's emptyDir volume. */
export function emptyDirPath(kubeletRoot: string, podUid: string, volume: string): string {
  return join(kubeletRoot, "pods", podUid, "volumes", "kubernetes.io~empty-dir", volume);
}
