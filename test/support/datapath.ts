/**
 * Test helpers for the data path: throwaway directories under the OS temp dir, a cache root laid
 * out like a real one (hub cache under model/, compile caches under cache/) with distinct
 * nanosecond times on every entry, and a snapshot of a tree to compare copies with.
 */
import { spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import { chmodSync, mkdtempSync, rmSync } from "node:fs";
import { link, lstat, mkdir, readdir, readFile, readlink, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import type { TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import { setTimesNs } from "../../src/datapath/native.js";

export const REPO_ROOT = join(dirname(fileURLToPath(import.meta.url)), "../../..");
export const WARMSTART_BIN = join(REPO_ROOT, "bin/warmstart");

/** A fresh directory removed after the test; world-traversable so other UIDs can reach inside. */
export function tempDir(t: TestContext, prefix = "ws-datapath-"): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  chmodSync(dir, 0o755);
  t.after(() => {
    // Read-only trees made by tests must become writable again to be removed.
    spawnSync("chmod", ["-R", "u+w", dir]);
    rmSync(dir, { recursive: true, force: true });
  });
  return dir;
}

export const sha256 = (b: Buffer | string): string => createHash("sha256").update(b).digest("hex");

export const BLOB_BIG = "model/hub/models--org--m/blobs/aaaa";
export const BLOB_SMALL = "model/hub/models--org--m/blobs/bbbb";
export const SNAP_WEIGHTS = "model/hub/models--org--m/snapshots/rev1/model.safetensors";
export const SNAP_CONFIG = "model/hub/models--org--m/snapshots/rev1/config.json";
export const REF_MAIN = "model/hub/models--org--m/refs/main";
export const LOCK = "model/hub/.locks/models--org--m/aaaa.lock";
export const KERNEL = "cache/triton/abc/kernel.cubin";
export const KERNEL_META = "cache/triton/abc/kernel.json";
export const LINK_A = "cache/inductor/fx/link-a";
export const LINK_B = "cache/inductor/fx/link-b";
export const TOP = "top.txt";

export interface CacheTree {
  /** File contents by path. */
  files: Map<string, Buffer>;
  /** Every entry as stamped, read with lstat alone (reading a directory would move its atime). */
  expected: Map<string, Snap>;
}

/**
 * Writes a cache root at `root`: a hub model (a 5 MiB blob, larger than one read chunk), its
 * snapshot symlinks, refs and .locks; compile caches with a hard-linked pair; an empty dir and a
 * file outside both areas. Every entry, symlinks and directories included, gets its own atime and
 * mtime with all nine nanosecond digits used.
 */
export async function makeCacheTree(root: string): Promise<CacheTree> {
  const files = new Map<string, Buffer>([
    [BLOB_BIG, randomBytes(5 * 1024 * 1024 + 17)],
    [BLOB_SMALL, Buffer.from('{"model_type":"llama"}\n')],
    [REF_MAIN, Buffer.from("rev1")],
    [LOCK, Buffer.alloc(0)],
    [KERNEL, randomBytes(10_000)],
    [KERNEL_META, Buffer.from('{"num_warps":4}')],
    [LINK_A, randomBytes(3000)],
    [TOP, Buffer.from("top\n")],
  ]);
  for (const [rel, body] of files) {
    await mkdir(dirname(join(root, rel)), { recursive: true });
    await writeFile(join(root, rel), body);
  }
  await link(join(root, LINK_A), join(root, LINK_B));
  files.set(LINK_B, files.get(LINK_A) as Buffer);
  await mkdir(dirname(join(root, SNAP_WEIGHTS)), { recursive: true });
  await symlink("../../blobs/aaaa", join(root, SNAP_WEIGHTS));
  await symlink("../../blobs/bbbb", join(root, SNAP_CONFIG));
  await mkdir(join(root, "cache/empty"), { recursive: true });
  const rels = await stampTimes(root);
  return { files, expected: await statOnly(root, rels) };
}

/**
 * Gives every entry under root (deepest first, root last) distinct times with nanoseconds and
 * returns their paths. Hard links share an inode, so the last stamp of the pair wins.
 */
export async function stampTimes(root: string): Promise<string[]> {
  const rels = [...(await snapshot(root)).keys()].sort((a, b) => b.split("/").length - a.split("/").length);
  let i = 0;
  for (const rel of rels) {
    i += 1;
    const atime = 1_650_000_000_123_456_789n + BigInt(i) * 86_400_000_000_007n;
    const mtime = 1_600_000_000_987_654_321n + BigInt(i) * 3_600_000_000_011n;
    const st = await lstat(rel === "" ? root : join(root, rel));
    await setTimesNs(rel === "" ? root : join(root, rel), atime, mtime, st.isSymbolicLink());
  }
  return rels;
}

/** lstat of each path and nothing else (even readlink moves a link's atime), so atimes stay. */
export async function statOnly(root: string, rels: readonly string[]): Promise<Map<string, Snap>> {
  const out = new Map<string, Snap>();
  for (const rel of rels) out.set(rel, await snapOf(rel === "" ? root : join(root, rel), false));
  return out;
}

async function snapOf(abs: string, withTarget = true): Promise<Snap> {
  const st = await lstat(abs, { bigint: true });
  const kind = st.isDirectory() ? "dir" : st.isFile() ? "file" : st.isSymbolicLink() ? "symlink" : "other";
  return {
    kind,
    mode: Number(st.mode) & 0o7777,
    size: st.size,
    ino: st.ino,
    nlink: st.nlink,
    atimeNs: st.atimeNs,
    mtimeNs: st.mtimeNs,
    ...(kind === "symlink" && withTarget ? { target: await readlink(abs) } : {}),
  };
}

export interface Snap {
  kind: "dir" | "file" | "symlink" | "other";
  mode: number;
  size: bigint;
  ino: bigint;
  nlink: bigint;
  atimeNs: bigint;
  mtimeNs: bigint;
  target?: string;
}

/**
 * Every entry under root ("" is root itself), lstat'ed with bigint times; each directory is
 * lstat'ed before it is read, so the times recorded are the ones before this walk.
 */
export async function snapshot(root: string, skip: readonly string[] = []): Promise<Map<string, Snap>> {
  const out = new Map<string, Snap>();
  const walk = async (rel: string): Promise<void> => {
    const abs = rel === "" ? root : join(root, rel);
    const snap = await snapOf(abs);
    out.set(rel, snap);
    if (snap.kind === "dir") {
      for (const name of (await readdir(abs)).sort()) {
        const child = rel === "" ? name : `${rel}/${name}`;
        if (!skip.includes(child)) await walk(child);
      }
    }
  };
  await walk("");
  return out;
}

export const readRel = (root: string, rel: string): Promise<Buffer> => readFile(join(root, rel));

/** Runs `node bin/warmstart ...args` (as another UID through setpriv when `uid` is given). */
export function runCli(
  args: string[],
  opts: { uid?: number; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): { status: number | null; stdout: string; stderr: string } {
  const node = [process.execPath, WARMSTART_BIN, ...args];
  const argv =
    opts.uid === undefined
      ? node
      : ["setpriv", `--reuid=${opts.uid}`, `--regid=${opts.uid}`, "--clear-groups", ...node];
  const r = spawnSync(argv[0] as string, argv.slice(1), {
    encoding: "utf8",
    env: { ...process.env, ...opts.env },
    timeout: opts.timeoutMs ?? 60_000,
  });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

/** True when `setpriv` can drop to another UID here (we are root and it is installed). */
export function canSwitchUid(): boolean {
  if (process.getuid?.() !== 0) return false;
  return spawnSync("setpriv", ["--reuid=12345", "--regid=12345", "--clear-groups", "true"]).status === 0;
}
