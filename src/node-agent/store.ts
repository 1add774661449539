/**
 * The node's cache store: one committed tree per cache, at `<store>/<short>`. A tree that carries
 * its ready marker and a manifest naming the same full hash is the proof that the capture is done,
 * which survives an agent restart.
 */
import { randomBytes } from "node:crypto";
import { mkdir, readdir, rename, rm } from "node:fs/promises";
import { join } from "node:path";
import { readManifest, type Manifest } from "../datapath/manifest.js";
import { isReady } from "../datapath/ready.js";
import { shortHash } from "../core/contract.js";

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

  /**
   * Removes a committed tree that must not be used. Renamed first, into the staging pattern
   * capture cleans up, so a crash halfway never leaves something that looks committed.
   */
  async discard(hash: string): Promise<void> {
    const dir = this.treeDir(hash);
    const trash = `${dir}.tmp-${process.pid}-${randomBytes(6).toString("hex")}`;
    try {
      await rename(dir, trash);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "ENOENT") return;
      throw err;
    }
    await rm(trash, { recursive: true, force: true });
  }
}

/** Where the kubelet keeps a pod's emptyDir volume. */
export function emptyDirPath(kubeletRoot: string, podUid: string, volume: string): string {
  return join(kubeletRoot, "pods", podUid, "volumes", "kubernetes.io~empty-dir", volume);
}
