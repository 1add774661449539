import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { execFileSync } from "node:child_process";
import { closeSync, fstatSync, fsyncSync, openSync, readdirSync, statSync } from "node:fs";
import { chmod, mkdir, readdir, symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { ENV_PREWARM } from "../core/contract.js";
import { dropFromPageCache, missingPages } from "./native.js";
import { listTree, loadOrder } from "./prewarm-order.js";
import { describePrewarm, prewarm, readerCount } from "./prewarm.js";
import { capture } from "./capture.js";
import { seed } from "./seed.js";
import {
  BLOB_BIG,
  BLOB_SMALL,
  canSwitchUid,
  makeCacheTree,
  runCli,
  tempDir,
} from "../../test/support/datapath.js";

const MiB = 1 << 20;

/** `n` files of known sizes in nested dirs, plus a symlink (not read twice). Returns total bytes. */
async function tree(root: string, n: number, size: (i: number) => number): Promise<number> {
  let total = 0;
  for (let i = 0; i < n; i++) {
    const d = join(root, `d${i % 3}`, `e${i % 2}`);
    await mkdir(d, { recursive: true });
    await writeFile(join(d, `f${i}`), randomBytes(size(i)));
    total += size(i);
  }
  await symlink("d0/e0/f0", join(root, "link"));
  return total;
}

async function filesOf(root: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(root, { withFileTypes: true, recursive: true }))
    if (e.isFile()) out.push(join(e.parentPath, e.name));
  return out;
}

/** Pages of `path` not in the page cache; undefined when that cannot be told here. */
function missingOf(path: string): number | undefined {
  const fd = openSync(path, "r");
  try {
    return missingPages(fd, 0, fstatSync(fd).size);
  } finally {
    closeSync(fd);
  }
}

/**
 * Flushes `path` and drops [offset, offset + len) of it from the page cache (len 0: to the end).
 * False when this machine cannot (no native helpers, or a filesystem such as tmpfs that keeps
 * its pages whatever it is told).
 */
function evict(path: string, offset = 0, len = 0): boolean {
  const fd = openSync(path, "r");
  try {
    fsyncSync(fd);
    if (!dropFromPageCache(fd, offset, len)) return false;
    const m = missingPages(fd, offset, len || fstatSync(fd).size - offset);
    return m !== undefined && m > 0;
  } finally {
    closeSync(fd);
  }
}

/**
 * Runs `attempt` until it passes, at most three times: another process (a drop_caches, memory
 * pressure) can evict pages between the set-up of a test and what it looks at.
 */
async function settled(attempt: () => Promise<void>): Promise<void> {
  for (let i = 1; ; i++) {
    try {
      return await attempt();
    } catch (err) {
      if (i >= 3) throw err;
    }
  }
}

/** Drops every file of `root` from the page cache, or skips the test where that cannot be done. */
async function coldTree(t: TestContext, root: string): Promise<boolean> {
  for (const f of await filesOf(root)) {
    if (!evict(f)) {
      t.skip("cannot drop files from the page cache here (no native helpers, or tmpfs)");
      return false;
    }
  }
  return true;
}

void test("prewarm reads every byte of a cold tree once, and leaves it in the page cache", async (t) => {
  const dir = tempDir(t);
  const total = await tree(dir, 20, (i) => (i === 0 ? 9 * MiB + 3 : 1000 * i));
  if (!(await coldTree(t, dir))) return;
  const r = await prewarm({ dir, parallel: 4, chunkBytes: MiB });
  assert.equal(r.skipped, false);
  assert.deepEqual([r.files, r.bytes, r.residentFiles, r.residentBytes], [20, total, 0, 0]);
  assert.equal(r.errorCount, 0);
  assert.ok(r.residency === "cachestat" || r.residency === "mincore");
  assert.ok(r.peakReaders >= 1 && r.peakReaders <= 4);
  for (const f of await filesOf(dir)) assert.equal(missingOf(f), 0, `${f} is in the page cache after`);
});

void test("a tree already in the page cache is not read: every file is reported in memory", async (t) => {
  const dir = tempDir(t);
  const total = await tree(dir, 20, (i) => (i === 0 ? 9 * MiB + 3 : 1000 * i));
  if (!(await coldTree(t, dir))) return;
  await settled(async () => {
    await prewarm({ dir, parallel: 2 });
    const again = await prewarm({ dir, parallel: 2 });
    assert.deepEqual([again.files, again.bytes, again.residentFiles, again.residentBytes], [0, 0, 20, total]);
    assert.match(
      describePrewarm(again),
      /^prewarm: read 0 files, 0\.0 MB in [\d.]+ s \(0 MB\/s, 2 readers\); 20 files and 9\.6 MB already in memory, not read \((cachestat|mincore)\), 0 errors$/,
    );
  });
  await settled(async () => {
    await prewarm({ dir });
    const cli = runCli(["prewarm", dir, "--parallel", "3"]);
    assert.equal(cli.status, 0);
    assert.match(cli.stdout, /^prewarm: read 0 files, 0\.0 MB .*; 20 files and 9\.6 MB already in memory/);
  });
});

void test("a file partly in the page cache is read only where it is missing, with either lookup", async (t) => {
  for (const residency of ["cachestat", "mincore"] as const) {
    const dir = tempDir(t);
    const f = join(dir, "model.safetensors");
    await writeFile(f, randomBytes(8 * MiB));
    if (!evict(f)) return t.skip("cannot drop files from the page cache here (no native helpers, or tmpfs)");
    await settled(async () => {
      // The first 3 MiB stay in memory, the other 5 go.
      await prewarm({ dir, parallel: 1 });
      assert.ok(evict(f, 3 * MiB), "dropped");
      assert.equal(missingOf(f), (5 * MiB) / 4096);
      const r = await prewarm({ dir, parallel: 1, chunkBytes: MiB, residency });
      assert.deepEqual(
        [r.files, r.bytes, r.residentFiles, r.residentBytes, r.residency],
        [1, 5 * MiB, 0, 3 * MiB, residency],
        residency,
      );
    });
    assert.equal(missingOf(f), 0);
  }
});

void test("where residency cannot be looked up, everything is read and the report says so", async (t) => {
  const dir = tempDir(t);
  const total = await tree(dir, 5, () => 4096);
  const r = await prewarm({ dir, parallel: 2, residency: "none" });
  assert.deepEqual([r.files, r.bytes, r.residentFiles, r.residency], [5, total, 0, null]);
  assert.match(
    describePrewarm(r),
    /^prewarm: read 5 files, 0\.0 MB .*; residency unknown, all read, 0 errors$/,
  );
  const noNative = runCli(["prewarm", dir], { env: { WARMSTART_NO_NATIVE: "1" } });
  assert.match(noNative.stdout, /^prewarm: read 5 files, .*; residency unknown, all read, 0 errors\n$/);
});

void test("files are read in the order an engine loads them: config and index, shards in index order, the rest", async (t) => {
  const dir = tempDir(t);
  const hub = join(dir, "model/hub/models--org--m");
  const snap = join(hub, "snapshots/rev1");
  await mkdir(join(hub, "blobs"), { recursive: true });
  await mkdir(snap, { recursive: true });
  await mkdir(join(dir, "cache/triton"), { recursive: true });
  // Blobs are named by digest; the snapshot's names lead to them.
  const shards = [
    "model-00001-of-00003.safetensors",
    "model-00002-of-00003.safetensors",
    "model-00003-of-00003.safetensors",
  ];
  const blobOf = new Map<string, string>();
  const names = ["config.json", "tokenizer.json", "model.safetensors.index.json", ...shards, "README.md"];
  names.forEach((n, i) => blobOf.set(n, join(hub, "blobs", `${(9 - i).toString(16).repeat(8)}`)));
  const index = {
    metadata: {},
    // Tensor names sort differently from the files that hold them.
    weight_map: { "a.weight": shards[2], "b.weight": shards[0], "c.weight": shards[1], "d.bias": shards[0] },
  };
  for (const n of names) {
    const blob = blobOf.get(n) as string;
    await writeFile(blob, n === "model.safetensors.index.json" ? JSON.stringify(index) : n);
    await symlink(`../../blobs/${blob.split("/").pop()}`, join(snap, n));
  }
  await writeFile(join(dir, "cache/triton/kernel.cubin"), "k");
  const order = loadOrder(listTree(dir, () => undefined));
  const b = (n: string): string => blobOf.get(n) as string;
  assert.deepEqual(
    order.slice(0, 3).sort(),
    [b("config.json"), b("tokenizer.json"), b("model.safetensors.index.json")].sort(),
  );
  assert.deepEqual(order.slice(3, 6), shards.map(b));
  assert.deepEqual(order.slice(6).sort(), [b("README.md"), join(dir, "cache/triton/kernel.cubin")].sort());
});

void test("prewarm respects its parallelism: exactly P readers at once", async (t) => {
  const dir = tempDir(t);
  await tree(dir, 24, () => 4096);
  // Each reader holds each file 80 ms (about 0.6 s of work each), so all three overlap even if
  // one starts late on a busy machine.
  // Read whatever is in memory: a tree just written is, and would start no reader at all.
  const three = await prewarm({ dir, parallel: 3, holdMs: 80, residency: "none" });
  assert.equal(three.peakReaders, 3);
  assert.equal(three.files, 24);
  const one = await prewarm({ dir, parallel: 1, holdMs: 2, residency: "none" });
  assert.equal(one.peakReaders, 1);
  assert.equal(one.files, 24);
});

void test("readers read at best-effort I/O priority 7; the thread that starts them keeps its own", async (t) => {
  const dir = tempDir(t);
  await tree(dir, 8, () => 10);
  const ionice = (tid: string): string | undefined => {
    try {
      return execFileSync("ionice", ["-p", tid], { encoding: "utf8" }).trim();
    } catch {
      return undefined;
    }
  };
  const before = ionice(String(process.pid));
  if (before === undefined) return t.skip("no ionice here");
  const running = prewarm({ dir, parallel: 2, holdMs: 300, residency: "none" });
  await new Promise((resolve) => setTimeout(resolve, 200));
  const prios = readdirSync(`/proc/${process.pid}/task`).map(ionice);
  const r = await running;
  if (!r.lowPriority) return t.skip("the kernel refused ioprio_set here");
  assert.equal(prios.filter((p) => p === "best-effort: prio 7").length, 2, prios.join(", "));
  assert.equal(ionice(String(process.pid)), before);
});

void test("prewarm is best effort: read errors are counted and reported, and it still resolves", async (t) => {
  const dir = tempDir(t);
  const missingDir = await prewarm({ dir: join(dir, "no-such-dir") });
  assert.equal(missingDir.files, 0);
  assert.equal(missingDir.errorCount, 1);
  assert.match(missingDir.errors[0] ?? "", /no-such-dir: ENOENT/);

  // Unreadable files need a UID without root's read-anything power.
  const uid = canSwitchUid() ? 12345 : process.getuid?.() === 0 ? undefined : process.getuid?.();
  if (uid === undefined) return t.skip("running as root without setpriv: cannot make a file unreadable");
  await tree(dir, 4, () => 2048);
  for (const f of ["d0/e0/f0", "d1/e1/f1"]) await chmod(join(dir, f), 0o000);
  const r = runCli(["prewarm", dir, "--parallel", "2"], { uid: canSwitchUid() ? uid : undefined });
  assert.equal(r.status, 0, "read errors never fail the command");
  assert.match(
    r.stdout,
    /^prewarm: read \d files, 0\.0 MB in [\d.]+ s \(\d+ MB\/s, 2 readers\); .*, 2 read errors \(first: .*f[01]: EACCES.*\)\n$/,
  );
});

void test("prewarm skips on --skip, on the env var at 0, and follows --default when it is unset", async (t) => {
  const dir = tempDir(t);
  await tree(dir, 3, () => 100);
  const off = await prewarm({ dir, respectEnv: ENV_PREWARM, env: { [ENV_PREWARM]: "0" } });
  assert.deepEqual([off.skipped, off.reason, off.files], [true, `${ENV_PREWARM}=0`, 0]);
  const on = await prewarm({ dir, respectEnv: ENV_PREWARM, env: { [ENV_PREWARM]: "1" }, defaultOn: false });
  assert.deepEqual([on.skipped, on.files + on.residentFiles], [false, 3]);
  const unset = await prewarm({ dir, respectEnv: ENV_PREWARM, env: {}, defaultOn: false });
  assert.deepEqual([unset.skipped, unset.reason], [true, `${ENV_PREWARM} unset, default off`]);
  assert.equal((await prewarm({ dir, skip: true })).reason, "--skip given");

  const cli = runCli(["prewarm", dir, "--respect-env", ENV_PREWARM], { env: { [ENV_PREWARM]: "0" } });
  assert.deepEqual([cli.status, cli.stdout], [0, `prewarm skipped (${ENV_PREWARM}=0)\n`]);
  const skip = runCli(["prewarm", dir, "--skip"]);
  assert.deepEqual([skip.status, skip.stdout], [0, "prewarm skipped (--skip given)\n"]);
  const ran = runCli(["prewarm", dir, "--respect-env", ENV_PREWARM], { env: { [ENV_PREWARM]: "" } });
  assert.match(ran.stdout, /^prewarm: read \d files, 0\.0 MB .*, 0 errors\n$/);
  const bad = runCli(["prewarm", dir, "--parallel", "many"]);
  assert.deepEqual(
    [bad.status, bad.stderr],
    [1, 'warmstart: --parallel must be an integer from 1 to 256, got "many"\n'],
  );
});

void test("a big cold file is brought in through a mapping, nothing copied to a reader; the buffer where that is off", async (t) => {
  const dir = tempDir(t);
  const big = join(dir, "model-00001-of-00001.safetensors");
  await writeFile(big, randomBytes(9 * MiB + 5));
  await writeFile(join(dir, "config.json"), "{}");
  for (const noPopulate of [false, true]) {
    if (!(await coldTree(t, dir))) return;
    const r = await prewarm({ dir, parallel: 2, noPopulate });
    assert.deepEqual([r.files, r.bytes, r.errorCount], [2, 9 * MiB + 7, 0], `noPopulate ${noPopulate}`);
    // Small files are always read; the big one is mapped unless that is turned off.
    assert.equal(r.mappedBytes, noPopulate ? 0 : 9 * MiB + 5, `noPopulate ${noPopulate}`);
    assert.equal(missingOf(big), 0, "in the page cache after");
  }
});

void test("what is missing from a tree mostly in memory gets the readers it is worth, not all of them", async (t) => {
  const task = (size: number): { path: string; size: number } => ({ path: "x", size });
  assert.equal(readerCount([], 6), 0);
  assert.equal(readerCount([task(4096)], 6), 1);
  assert.equal(
    readerCount(
      Array.from({ length: 300 }, () => task(60_000)),
      6,
    ),
    2,
    "300 small files",
  );
  assert.equal(readerCount([task(1 << 30)], 6), 1, "one file, however big");
  assert.equal(
    readerCount(
      Array.from({ length: 4 }, () => task(512 * MiB)),
      6,
    ),
    4,
  );
  assert.equal(
    readerCount(
      Array.from({ length: 20_000 }, () => task(30_000)),
      6,
    ),
    6,
  );
  assert.equal(readerCount([{ path: "x", size: 1 << 30, ranges: [[0, MiB]] }], 6), 1);

  const dir = tempDir(t);
  await tree(dir, 12, () => 8192);
  if (!(await coldTree(t, dir))) return;
  await settled(async () => {
    await prewarm({ dir, parallel: 6 });
    const [a, b] = (await filesOf(dir)).slice(0, 2) as [string, string];
    assert.ok(evict(a) && evict(b), "two files dropped");
    const r = await prewarm({ dir, parallel: 6, holdMs: 50 });
    assert.deepEqual([r.files, r.bytes, r.residentFiles, r.peakReaders], [2, 16384, 10, 1]);
  });
});

void test("big files are read at most two at a time, in order, while the other readers read the small ones", async (t) => {
  const dir = tempDir(t);
  for (let i = 0; i < 4; i++)
    await writeFile(join(dir, `model-0000${i}.safetensors`), randomBytes(64 * 1024));
  for (let i = 0; i < 12; i++) await writeFile(join(dir, `small-${i}.bin`), randomBytes(1000));
  // Everything counts as missing; 32 KiB and more is "big"; each reader holds each file 300 ms,
  // so readers overlap even when some start late on a busy machine.
  await settled(async () => {
    const r = await prewarm({ dir, parallel: 6, holdMs: 300, residency: "none", bigBytes: 32 * 1024 });
    assert.deepEqual([r.files, r.bytes, r.errorCount], [16, 4 * 64 * 1024 + 12_000, 0]);
    assert.equal(r.peakBigReaders, 2);
    assert.ok(r.peakReaders >= 3, `peak readers ${r.peakReaders}`);
  });
});

void test("after seed, prewarm --seeded reads the model files seed left in place and none it copied", async (t) => {
  const dir = tempDir(t);
  await makeCacheTree(join(dir, "src"));
  const ro = join(dir, "ro");
  await capture({ src: join(dir, "src"), dest: ro, progress: false, durable: false });
  const seeded = await seed({ from: ro, to: join(dir, "shadow") });
  assert.ok(seeded.linked > 0 && seeded.copied > 0, JSON.stringify(seeded));
  const inPlace = [BLOB_BIG, BLOB_SMALL].reduce((n, rel) => n + statSync(join(ro, rel)).size, 0);

  // Everything read (no lookup), so the counts say exactly which files were looked at.
  const r = await prewarm({ dir: ro, seeded: true, residency: "none" });
  assert.deepEqual([r.files, r.bytes, r.errorCount], [seeded.linked, inPlace, 0]);
  assert.equal(r.seeded, true);
  const whole = await prewarm({ dir: ro, residency: "none" });
  assert.ok(whole.files >= seeded.linked + seeded.copied, "without --seeded, the copied files too");

  const cli = runCli(["prewarm", ro, "--seeded", "--parallel", "2"]);
  assert.equal(cli.status, 0, cli.stderr);
  assert.match(cli.stdout, /, 0 errors; only the model files used in place \(seed read the rest\)\n$/);

  // A tree with no model folder, or one whose model folder is a symlink: nothing to read, no error.
  const bare = join(dir, "bare");
  await mkdir(join(bare, "cache"), { recursive: true });
  await writeFile(join(bare, "cache", "k"), "x");
  const none = await prewarm({ dir: bare, seeded: true });
  assert.deepEqual([none.files, none.residentFiles, none.errorCount], [0, 0, 0]);
  await symlink(join(ro, "model"), join(bare, "model"));
  const linked = await prewarm({ dir: bare, seeded: true });
  assert.deepEqual([linked.files, linked.residentFiles, linked.errorCount], [0, 0, 0]);
});
