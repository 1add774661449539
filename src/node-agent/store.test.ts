import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { chownSync, renameSync, symlinkSync, unlinkSync } from "node:fs";
import {
  chmod,
  link,
  lstat,
  mkdir,
  mkdtemp,
  readdir,
  rm,
  stat,
  symlink,
  truncate,
  writeFile,
} from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { capture, CaptureStoppedError } from "../datapath/capture.js";
import { bytesOf, CacheStore, heldBytes, treeBytes, type StoredTree } from "./store.js";

const HASH = "ab".repeat(32);
const OWNER = 4321;
const isRoot = process.getuid?.() === 0;

/** A cache root written by a workload running as OWNER (its engine writes as its own UID). */
async function cacheRoot(dir: string): Promise<void> {
  await mkdir(join(dir, "model/hub/blobs"), { recursive: true });
  await mkdir(join(dir, "cache/triton"), { recursive: true });
  await writeFile(join(dir, "model/hub/blobs/w"), Buffer.alloc(4096, 1));
  await writeFile(join(dir, "cache/triton/k.cubin"), "kernel");
  await writeFile(join(dir, "cache/run.sh"), "#!/bin/sh\n", { mode: 0o755 });
  await symlink("../model/hub/blobs/w", join(dir, "cache/link"));
  if (isRoot)
    for (const p of [
      "",
      "model",
      "model/hub",
      "model/hub/blobs",
      "model/hub/blobs/w",
      "cache",
      "cache/triton",
      "cache/triton/k.cubin",
      "cache/run.sh",
    ])
      chownSync(join(dir, p), OWNER, OWNER);
}

/** Every directory and file under `root` (links are not followed), with its mode. */
async function modes(root: string): Promise<Map<string, number>> {
  const out = new Map<string, number>();
  const walk = async (rel: string): Promise<void> => {
    const st = await lstat(join(root, rel));
    if (st.isSymbolicLink()) return;
    out.set(rel || ".", st.mode & 0o7777);
    if (st.isDirectory()) for (const n of await readdir(join(root, rel))) await walk(rel ? `${rel}/${n}` : n);
  };
  await walk("");
  return out;
}

void test("a committed tree is read-only on disk: no write bit anywhere, so even its files' owner cannot change it", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "ws-store-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await chmod(dir, 0o755); // the owner of the files reaches them, as a pod reaches its mount
  const src = join(dir, "src");
  await cacheRoot(src);
  const store = new CacheStore(join(dir, "store"));
  await store.init();
  await capture({ src, dest: store.treeDir(HASH), hash: HASH, progress: false, durable: false });
  const tree = store.treeDir(HASH);
  const before = await stat(join(tree, "cache/triton/k.cubin"), { bigint: true });
  // What vLLM writes through a temp file's rename: readable by its writer only.
  await chmod(join(tree, "cache/triton/k.cubin"), 0o600);
  await chmod(join(tree, "cache/triton"), 0o700);
  await store.seal(HASH);

  const m = await modes(tree);
  assert.ok(m.size >= 8, `walked ${m.size} entries`);
  for (const [rel, mode] of m) assert.equal(mode & 0o222, 0, `${rel} has mode ${mode.toString(8)}`);
  assert.equal(m.get("cache/run.sh"), 0o555, "an executable stays executable");
  assert.equal(m.get("cache/triton/k.cubin"), 0o444, "an owner-only file is readable by every restore's UID");
  assert.equal(m.get("cache/triton"), 0o555);
  const after = await stat(join(tree, "cache/triton/k.cubin"), { bigint: true });
  assert.equal(after.mtimeNs, before.mtimeNs, "sealing keeps the captured times");
  assert.ok((await store.committed(HASH))?.hash === HASH, "still a committed capture");

  {
    // A restore running as the workload's UID (the files' owner) through a mount that forgot
    // readOnly. Run by root, the test writes as OWNER; run by anyone else, as itself (the owner).
    const attempt = (code: string): { status: number | null; stderr: string } => {
      const r = spawnSync(process.execPath, ["-e", code], {
        ...(isRoot ? { uid: OWNER, gid: OWNER } : {}),
        encoding: "utf8",
      });
      return { status: r.status, stderr: r.stderr };
    };
    const tries = {
      "a new file at the root": `require("fs").writeFileSync(${JSON.stringify(join(tree, "new"))}, "x")`,
      "a file rewritten": `require("fs").writeFileSync(${JSON.stringify(join(tree, "cache/triton/k.cubin"))}, "evil")`,
      "a file appended to": `require("fs").appendFileSync(${JSON.stringify(join(tree, "model/hub/blobs/w"))}, "evil")`,
      "a file removed": `require("fs").unlinkSync(${JSON.stringify(join(tree, "cache/run.sh"))})`,
      "a folder made": `require("fs").mkdirSync(${JSON.stringify(join(tree, "cache/new"))})`,
    };
    for (const [what, code] of Object.entries(tries)) {
      const r = attempt(code);
      assert.notEqual(r.status, 0, `${what} must be refused`);
      assert.match(r.stderr, /EACCES|EPERM/, what);
    }
    // The same writes as the owner succeed on a tree that was not sealed: the seal is what refuses them.
    const other = "cd".repeat(32);
    await capture({ src, dest: store.treeDir(other), hash: other, progress: false, durable: false });
    const r = attempt(
      `require("fs").writeFileSync(${JSON.stringify(join(store.treeDir(other), "cache/triton/k.cubin"))}, "evil")`,
    );
    assert.equal(r.status, 0, r.stderr);
  }

  // The agent still removes it.
  assert.equal(await store.remove(HASH), true);
  await assert.rejects(stat(tree), /ENOENT/);
  assert.deepEqual(
    (await readdir(join(dir, "store"))).filter((n) => n.startsWith(HASH.slice(0, 16))),
    [],
  );
  assert.equal(await store.remove(HASH), false, "removing what is gone is no error");
});

void test("treeBytes counts file data without following links", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "ws-bytes-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await cacheRoot(dir);
  await symlink("/etc", join(dir, "cache/outside"));
  assert.equal(await treeBytes(dir), 4096 + "kernel".length + "#!/bin/sh\n".length);
  assert.equal(await treeBytes(join(dir, "missing")), 0);
});

void test("treeBytes never counts what a folder swapped for a symlink leads to, even mid-walk", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "ws-bytes-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  // Outside the source: a folder holding a 1 TiB (sparse) file.
  const outside = join(dir, "outside");
  await mkdir(outside);
  await writeFile(join(outside, "huge"), "");
  await truncate(join(outside, "huge"), 2 ** 40);
  const src = join(dir, "src");
  await cacheRoot(src);
  const own = 4096 + "kernel".length + "#!/bin/sh\n".length;
  await symlink(outside, join(src, "cache/elsewhere"));
  assert.equal(await treeBytes(src), own, "a symlink to a folder is not followed");

  // The pod swaps a folder of its cache for a symlink to the outside folder and back, as fast
  // as it can, while the cache is sized: a walk by path would sooner or later go through it.
  const swapped = join(src, "cache/swap");
  await mkdir(swapped);
  await writeFile(join(swapped, "small"), "x");
  let stop = false;
  const swapper = (async (): Promise<void> => {
    while (!stop) {
      renameSync(swapped, `${swapped}.real`);
      symlinkSync(outside, swapped);
      await new Promise<void>((r) => setImmediate(r));
      unlinkSync(swapped);
      renameSync(`${swapped}.real`, swapped);
      await new Promise<void>((r) => setImmediate(r));
    }
  })();
  try {
    for (let i = 0; i < 200; i++) {
      const n = await treeBytes(src);
      assert.ok(n <= own + 1, `round ${i}: counted ${n} bytes, more than the source holds`);
    }
  } finally {
    stop = true;
    await swapper;
  }
});

void test("treeBytes counts a hard-linked file once, and stops when asked to", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "ws-bytes-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await cacheRoot(dir);
  await link(join(dir, "model/hub/blobs/w"), join(dir, "cache/w2"));
  assert.equal(await treeBytes(dir), 4096 + "kernel".length + "#!/bin/sh\n".length);
  const ac = new AbortController();
  ac.abort("pod-deleted");
  await assert.rejects(
    treeBytes(dir, { signal: ac.signal }),
    (err: unknown) => err instanceof CaptureStoppedError && err.why === "aborted",
  );
});

void test("bytes held against the budget count a committed tree once, however long its capture holds its reservation", () => {
  const tree = (short: string, totalBytes: number): StoredTree => ({
    short,
    manifest: { totalBytes } as StoredTree["manifest"],
  });
  const trees = [tree("a".repeat(16), 100), tree("b".repeat(16), 50)];
  assert.equal(bytesOf(trees), 150);
  assert.equal(heldBytes(trees, new Map()), 150);
  // "a" is committed but its pipeline still holds its reservation (promoting); "c" is copying.
  const reserved = new Map([
    ["a".repeat(16), 100],
    ["c".repeat(16), 30],
  ]);
  assert.equal(heldBytes(trees, reserved), 180);
});
