/**
 * Durable capture flushes once, for the whole tree, before the rename that commits it; and big
 * files are digested from their copy through a mapping. Both seen through capture's hooks, not
 * through timing.
 */
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { randomBytes } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { READY_MARKER } from "../core/contract.js";
import { capture } from "./capture.js";
import { digestAvailable, digestOf } from "./digest.js";
import { syncfsAvailable, syncfsFd } from "./native.js";

const MiB = 1 << 20;

function tempDir(t: TestContext): string {
  const d = mkdtempSync(join(tmpdir(), "ws-capture-flush-"));
  t.after(() => rmSync(d, { recursive: true, force: true }));
  return d;
}

/** A cache root of `n` small files and two big ones; returns their contents by path. */
async function cacheRoot(root: string, n: number): Promise<Map<string, Buffer>> {
  const files = new Map<string, Buffer>();
  for (let i = 0; i < n; i++) files.set(`cache/d${i % 4}/f${i}.bin`, randomBytes(100 + i * 37));
  // Bigger than a copier's read buffer (1 MiB), not a multiple of the page size.
  files.set("model/shard-0.safetensors", randomBytes(3 * MiB + 123));
  files.set("model/shard-1.safetensors", randomBytes(70 * MiB + 5));
  for (const [rel, data] of files) {
    await mkdir(join(root, rel, ".."), { recursive: true });
    await writeFile(join(root, rel), data);
  }
  return files;
}

void test("a durable capture flushes the tree once, after every file is in staging and before the commit", async (t) => {
  if (!syncfsAvailable()) return t.skip("no syncfs without the native helpers");
  const dir = tempDir(t);
  const src = join(dir, "src");
  const dest = join(dir, "store", "tree");
  const files = await cacheRoot(src, 40);
  const events: string[] = [];
  const m = await capture({
    src,
    dest,
    progress: false,
    hooks: {
      syncfs: async (fd, staging) => {
        // Everything copied, nothing committed yet: the destination is not there.
        const copied = readdirSync(staging, { recursive: true, withFileTypes: true }).filter((e) =>
          e.isFile(),
        );
        events.push(`flush ${copied.length} committed=${existsSync(dest)}`);
        await syncfsFd(fd, staging);
      },
      beforeCommit: () => void events.push(`commit committed=${existsSync(dest)}`),
    },
  });
  assert.deepEqual(events, [`flush ${files.size} committed=false`, "commit committed=false"]);
  assert.equal(m.fileCount, files.size);
  assert.ok(existsSync(join(dest, READY_MARKER)));
});

void test("a capture without the flush never calls it; a failed flush commits nothing", async (t) => {
  if (!syncfsAvailable()) return t.skip("no syncfs without the native helpers");
  const dir = tempDir(t);
  const src = join(dir, "src");
  await cacheRoot(src, 5);
  let calls = 0;
  const syncfs = (): Promise<void> => {
    calls += 1;
    return Promise.reject(new Error("EIO: the disk said no"));
  };
  await capture({ src, dest: join(dir, "a"), progress: false, durable: false, hooks: { syncfs } });
  assert.equal(calls, 0);
  await assert.rejects(
    capture({ src, dest: join(dir, "b"), progress: false, hooks: { syncfs } }),
    /the disk said no/,
  );
  assert.equal(calls, 1);
  assert.equal(existsSync(join(dir, "b")), false);
  assert.deepEqual(
    readdirSync(dir).filter((n) => n.startsWith("b.tmp-")),
    [],
    "staging removed",
  );
});

void test("big files are digested from their copy: the manifest matches the bytes, with either digest", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  const files = await cacheRoot(src, 3);
  for (const digest of ["sha256", "blake3"] as const) {
    if (!digestAvailable(digest)) continue;
    const dest = join(dir, `tree-${digest}`);
    const m = await capture({ src, dest, progress: false, durable: false, digest });
    assert.equal(m.files.length, files.size);
    for (const f of m.files) {
      const want = files.get(f.path) as Buffer;
      assert.equal(f.size, want.length, f.path);
      assert.equal(f.digest, digestOf(digest, want), `${digest} ${f.path}`);
      assert.ok((await readFile(join(dest, f.path))).equals(want), f.path);
    }
  }
});
