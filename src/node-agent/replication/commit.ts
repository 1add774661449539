/**
 * The file-system half of a replication: the staging folder beside the tree's final place, its
 * skeleton before the data comes, the links and metadata after, and the commit, which is a
 * capture's commit (datapath/capture.ts): manifest in, flushed, renamed into place, ready
 * marker last, root mode and times after the marker. Every mode loses its write bits on the way
 * (the store keeps committed trees read-only, as CacheStore.seal does) and its set-ID bits.
 */
import { chmodSync, lchownSync, linkSync, mkdirSync, symlinkSync, type Stats } from "node:fs";
import { chmod, lstat, open, readdir, rename, rm } from "node:fs/promises";
import { dirname } from "node:path";
import { MANIFEST_FILE } from "../../core/contract.js";
import { bytes, KEPT_MODE_BITS, toBin } from "../../datapath/beneath.js";
import { AlreadyCapturedError } from "../../datapath/capture-errors.js";
import { writeDurably } from "../../datapath/capture-manifest.js";
import { isRoot } from "../../datapath/copy-tree.js";
import { createDigest, type DigestAlgorithm } from "../../datapath/digest.js";
import { readManifest } from "../../datapath/manifest.js";
import { setTimesNs, setTimesNsSync, syncFilesystem } from "../../datapath/native.js";
import { fsyncDir, writeReadyMarker } from "../../datapath/ready.js";
import { yieldNow } from "../../datapath/tree.js";
import type { EntryMeta, TreePlan } from "./plan.js";

const READ_ONLY_BITS = KEPT_MODE_BITS & ~0o222;

/** A byte-string path below the staging folder, as a Buffer for fs calls. */
export const stagedPath = (staging: string, rel: string): Buffer => bytes(`${toBin(staging)}/${rel}`);

function applyMeta(path: Buffer, meta: EntryMeta, link: boolean): void {
  if (isRoot()) lchownSync(path, meta.uid, meta.gid);
  if (!link) chmodSync(path, meta.mode & READ_ONLY_BITS);
  setTimesNsSync(path, meta.atimeNs, meta.mtimeNs, link);
}

/** The staging folder's directories and every data file, empty at its final size (sparse). */
export async function makeSkeleton(staging: string, plan: TreePlan): Promise<void> {
  mkdirSync(staging, { mode: 0o700 });
  let n = 0;
  for (const d of plan.dirs) {
    mkdirSync(stagedPath(staging, d.rel), { mode: 0o700 });
    if (++n % 256 === 0) await yieldNow();
  }
  for (const f of plan.files) {
    const fh = await open(stagedPath(staging, f.rel), "wx", 0o600);
    try {
      await fh.truncate(f.size);
    } finally {
      await fh.close();
    }
  }
}

/**
 * Links, symlinks and metadata once every file's data is in and verified: hard links to their
 * first name, symlinks as the manifest writes them, then files' and directories' mode, owner and
 * nanosecond times, directories deepest first so nothing made later moves a time.
 */
export async function finishTree(staging: string, plan: TreePlan): Promise<void> {
  let n = 0;
  const tick = async (): Promise<void> => {
    if (++n % 256 === 0) await yieldNow();
  };
  for (const l of plan.links) {
    linkSync(stagedPath(staging, l.to), stagedPath(staging, l.rel));
    await tick();
  }
  for (const s of plan.symlinks) {
    const path = stagedPath(staging, s.rel);
    symlinkSync(bytes(s.target), path);
    applyMeta(path, s.meta, true);
    await tick();
  }
  for (const f of plan.files) {
    applyMeta(stagedPath(staging, f.rel), f.meta, false);
    await tick();
  }
  const depth = (rel: string): number => rel.split("/").length;
  for (const d of [...plan.dirs].sort((a, b) => depth(b.rel) - depth(a.rel))) {
    applyMeta(stagedPath(staging, d.rel), d.meta, false);
    await tick();
  }
}

/**
 * Commits a finished staging folder as `dest`, exactly as a capture commits: the manifest's
 * bytes as fetched (so the tree's manifest digest is the record's), flushed, renamed into
 * place, the ready marker last, then the root's mode and times. `beforeRename` is the last
 * point a cancel can stop it. Throws AlreadyCapturedError when another commit got there first.
 */
export async function commitTree(
  staging: string,
  dest: string,
  o: {
    manifest: Buffer;
    hash: string;
    capturedAt: string;
    root: EntryMeta;
    durable: boolean;
    beforeRename: () => void;
  },
): Promise<void> {
  if (o.durable) await syncFilesystem(staging);
  await writeDurably(`${staging}/${MANIFEST_FILE}`, o.manifest.toString("utf8"));
  if (isRoot()) lchownSync(staging, o.root.uid, o.root.gid);
  await fsyncDir(staging);
  o.beforeRename();
  try {
    await rename(staging, dest);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === "ENOTEMPTY" || code === "EEXIST")
      throw new AlreadyCapturedError(dest, await readManifest(dest).catch(() => undefined));
    throw err;
  }
  await fsyncDir(dirname(dest));
  const marker = { hash: o.hash, capturedAt: o.capturedAt, replicatedAt: new Date().toISOString() };
  await writeReadyMarker(dest, `${JSON.stringify(marker)}\n`);
  const fh = await open(dest, "r");
  try {
    await fh.chmod(o.root.mode & READ_ONLY_BITS);
    await setTimesNs(dest, o.root.atimeNs, o.root.mtimeNs, false);
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** Removes a staging folder, giving its directories their owner's write bit back first (they
 * may already be read-only when a replication fails late). */
export async function removeStaging(path: string): Promise<void> {
  const stack: Buffer[] = [Buffer.from(path)];
  while (stack.length) {
    const p = stack.pop() as Buffer;
    const st: Stats | undefined = await lstat(p).catch(() => undefined);
    if (!st?.isDirectory()) continue;
    if ((st.mode & 0o700) !== 0o700) await chmod(p, (st.mode | 0o700) & 0o7777).catch(() => undefined);
    const names = await readdir(p, { encoding: "buffer" }).catch(() => [] as Buffer[]);
    for (const name of names) stack.push(Buffer.concat([p, Buffer.from("/"), name]));
  }
  await rm(path, { recursive: true, force: true });
}

const DIGEST_READ_BYTES = 1024 * 1024;

/** The digest of a file, read in 1 MiB pieces into one buffer (a read stream allocates one per
 * read, and that churn made the receiver's collector mark its whole heap over and over). */
export async function digestFile(path: Buffer, alg: DigestAlgorithm): Promise<string> {
  const d = createDigest(alg);
  const fh = await open(path, "r");
  try {
    const buf = Buffer.allocUnsafe(DIGEST_READ_BYTES);
    for (let pos = 0; ;) {
      const { bytesRead } = await fh.read(buf, 0, buf.length, pos);
      if (bytesRead === 0) break;
      d.update(buf.subarray(0, bytesRead));
      pos += bytesRead;
    }
  } finally {
    await fh.close();
  }
  return d.hex();
}
