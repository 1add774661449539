import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, lstatSync, mkdtempSync, renameSync, rmSync, statSync, writeFileSync } from "node:fs";
import { chmod, mkdir, open, readdir, readFile, rm, stat, symlink, writeFile } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { MANIFEST_FILE, READY_MARKER } from "../core/contract.js";
import { AlreadyCapturedError, capture } from "./capture.js";
import { DEFAULT_DIGEST, digestOf } from "./digest.js";
import { ManifestSchema, readManifest, type Manifest } from "./manifest.js";
import { exactTimes, missingPages, pageSize } from "./native.js";
import {
  BLOB_BIG,
  BLOB_SMALL,
  canSwitchUid,
  KERNEL,
  KERNEL_META,
  LINK_A,
  LINK_B,
  LOCK,
  makeCacheTree,
  readRel,
  REF_MAIN,
  runCli,
  SNAP_WEIGHTS,
  snapshot,
  tempDir,
  TOP,
} from "../../test/support/datapath.js";

const RESERVED = [READY_MARKER, MANIFEST_FILE];
const MiB = 1024 * 1024;

/** A source with one big file (not a whole number of blocks) and two files with holes: a big one
 * with two islands of data, one of them across a block boundary, ending in a hole; and a small
 * one with a few bytes in the middle. */
async function bigAndSparse(src: string): Promise<Map<string, Buffer>> {
  await mkdir(join(src, "model"), { recursive: true });
  await mkdir(join(src, "cache"), { recursive: true });
  const big = randomBytes(3 * MiB + 5);
  await writeFile(join(src, "model/big.safetensors"), big);
  const holes = async (rel: string, size: number, islands: [number, Buffer][]): Promise<Buffer> => {
    const fh = await open(join(src, rel), "w");
    try {
      await fh.truncate(size);
      for (const [at, bytes] of islands) await fh.write(bytes, 0, bytes.length, at);
    } finally {
      await fh.close();
    }
    const whole = Buffer.alloc(size);
    for (const [at, bytes] of islands) bytes.copy(whole, at);
    return whole;
  };
  return new Map([
    ["model/big.safetensors", big],
    [
      "model/sparse.bin",
      await holes("model/sparse.bin", 64 * MiB, [
        [8 * MiB, randomBytes(3 * 4096)],
        [40_000_001, randomBytes(5000)],
      ]),
    ],
    ["cache/small-sparse", await holes("cache/small-sparse", 100_000, [[50_000, randomBytes(10)]])],
  ]);
}

/** Pages of the file at `path` in the page cache, or undefined when this kernel cannot tell. */
async function residentPages(path: string): Promise<number | undefined> {
  const fh = await open(path, "r");
  try {
    const size = (await fh.stat()).size;
    const missing = missingPages(fh.fd, 0, size);
    return missing === undefined ? undefined : Math.ceil(size / pageSize()) - missing;
  } finally {
    await fh.close();
  }
}

const allocated = async (path: string): Promise<number> => (await stat(path)).blocks * 512;

/** Every file of `files` in the captured tree with its bytes, size and manifest digest. */
async function assertCaptured(dest: string, m: Manifest, files: Map<string, Buffer>): Promise<void> {
  for (const [rel, body] of files) {
    assert.ok((await readRel(dest, rel)).equals(body), rel);
    assert.equal((await stat(join(dest, rel))).size, body.length, `${rel} size`);
    assert.equal(m.files.find((f) => f.path === rel)?.digest, digestOf(m.digest, body), `${rel} digest`);
  }
}

/** Names in `parent` that look like a staging dir of `base`. */
const stagingDirs = async (parent: string, base: string): Promise<string[]> =>
  (await readdir(parent)).filter((n) => n.startsWith(`${base}.tmp-`));

void test("capture copies files, dirs and symlinks with atime and mtime equal to the nanosecond", async (t) => {
  assert.ok(exactTimes, "utimensat must be reachable (koffi) for nanosecond times");
  const dir = tempDir(t);
  const src = join(dir, "src");
  const { files, expected } = await makeCacheTree(src);
  const dest = join(dir, "store", "h1");

  await capture({ src, dest, hash: "a".repeat(64), model: "org/m", progress: false });

  const got = await snapshot(dest, RESERVED);
  assert.deepEqual([...got.keys()].sort(), [...expected.keys()].sort(), "same entries, nothing more");
  for (const [rel, want] of expected) {
    const have = got.get(rel);
    assert.ok(have, rel);
    assert.equal(have.kind, want.kind, `${rel} kind`);
    assert.equal(have.atimeNs, want.atimeNs, `${rel} atime`);
    assert.equal(have.mtimeNs, want.mtimeNs, `${rel} mtime`);
    if (have.kind !== "symlink") assert.equal(have.mode, want.mode, `${rel} mode`);
  }
  // Nanosecond digits that a microsecond copy would have zeroed really are there.
  assert.notEqual((got.get(BLOB_BIG)?.mtimeNs ?? 0n) % 1000n, 0n);
  for (const [rel, body] of files) assert.ok((await readRel(dest, rel)).equals(body), `${rel} content`);

  assert.equal(got.get(LINK_A)?.ino, got.get(LINK_B)?.ino, "hard links share an inode in the copy");
  assert.equal(got.get(LINK_A)?.nlink, 2n);
  assert.notEqual(got.get(KERNEL)?.ino, got.get(KERNEL_META)?.ino);
  assert.equal(got.get(SNAP_WEIGHTS)?.target, "../../blobs/aaaa", "relative in-tree symlink kept as written");
  assert.ok((await readFile(join(dest, SNAP_WEIGHTS))).equals(files.get(BLOB_BIG) as Buffer));
});

void test("the manifest records counts, bytes, digests and the model/cache split, and no env or args", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  const { files } = await makeCacheTree(src);
  const secret = `s3cr3t-${Date.now()}`;
  process.env.WARMSTART_TEST_TOKEN = secret;
  t.after(() => delete process.env.WARMSTART_TEST_TOKEN);
  const dest = join(dir, "store", "h1");

  const m = await capture({ src, dest, hash: "b".repeat(64), model: "org/m", parallel: 3, progress: false });

  const onDisk = await readManifest(dest);
  assert.deepEqual(onDisk, m, "what capture returns is what it wrote");
  // strict(): no field beyond the schema's, so nothing else (env, args) can ride along.
  ManifestSchema.strict().parse(JSON.parse(await readFile(join(dest, MANIFEST_FILE), "utf8")));
  const text = await readFile(join(dest, MANIFEST_FILE), "utf8");
  assert.ok(!text.includes(secret), "no env value in the manifest");
  for (const a of process.argv.slice(1))
    assert.ok(!text.includes(a), `no process arg (${a}) in the manifest`);

  assert.equal(m.hash, "b".repeat(64));
  assert.equal(m.digest, "blake3", "BLAKE3 loads here (its binding ships in the npm package)");
  assert.equal(DEFAULT_DIGEST, "blake3");
  assert.equal(m.model, "org/m");
  assert.ok(["reflink", "copy_file_range", "copy"].includes(m.captureMethod));
  assert.equal(m.fileCount, files.size, "every file path, hard links included");
  const unique = [...files].filter(([rel]) => rel !== LINK_B).reduce((n, [, b]) => n + b.length, 0);
  assert.equal(m.totalBytes, unique, "hard-linked data counted once");
  for (const f of m.files) {
    assert.equal(f.digest, digestOf(m.digest, files.get(f.path) as Buffer), `${f.path} digest`);
    assert.equal(f.size, (files.get(f.path) as Buffer).length, `${f.path} size`);
  }
  assert.deepEqual(
    m.files.filter((f) => f.linkTo).map((f) => [f.path, f.linkTo]),
    [[LINK_B, LINK_A]],
    "the second name of the linked pair points at the first",
  );
  const area = (p: string): string =>
    p.startsWith("model/") ? "model" : p.startsWith("cache/") ? "cache" : "other";
  const modelFiles = [...files.keys()].filter((p) => area(p) === "model");
  assert.deepEqual(m.split.model, {
    files: modelFiles.length,
    bytes: modelFiles.reduce((n, p) => n + (files.get(p) as Buffer).length, 0),
  });
  assert.equal(m.split.cache.files, [...files.keys()].filter((p) => area(p) === "cache").length);
  assert.equal(
    m.split.cache.bytes,
    [KERNEL, KERNEL_META, LINK_A].reduce((n, p) => n + (files.get(p) as Buffer).length, 0),
  );
  assert.deepEqual(m.split.other, { files: 1, bytes: (files.get(TOP) as Buffer).length });
  assert.equal(m.split.model.bytes + m.split.cache.bytes + m.split.other.bytes, m.totalBytes);
  assert.deepEqual(
    m.symlinks.map((s) => s.path).sort(),
    [SNAP_WEIGHTS, SNAP_WEIGHTS.replace("model.safetensors", "config.json")].sort(),
  );
  assert.deepEqual(m.skipped, []);
  for (const k of ["scanMs", "copyMs", "digestMs", "commitMs", "totalMs"] as const)
    assert.ok(m.timings[k] >= 0, k);
  assert.ok(m.timings.totalMs >= m.timings.scanMs + m.timings.copyMs);
  assert.ok(existsSync(join(dest, READY_MARKER)));
});

for (const [name, make] of [
  [
    "absolute",
    async (src: string): Promise<string> => {
      await symlink("/etc/passwd", join(src, "cache/passwd"));
      return "cache/passwd";
    },
  ],
  [
    "../../ relative",
    async (src: string): Promise<string> => {
      await symlink("../../../outside", join(src, "cache/triton/up"));
      return "cache/triton/up";
    },
  ],
  [
    "chained through an in-tree link",
    async (src: string): Promise<string> => {
      // `root` resolves to the tree's root (inside); `esc` is `root/..`, lexically inside, really outside.
      await symlink("../../..", join(src, "cache/triton/abc/root"));
      await symlink("root/..", join(src, "cache/triton/abc/esc"));
      return "cache/triton/abc/esc";
    },
  ],
] as const) {
  void test(`a symlink that escapes the tree (${name}) is left out and recorded; the capture goes on`, async (t) => {
    const dir = tempDir(t);
    const src = join(dir, "src");
    const { files } = await makeCacheTree(src);
    const bad = await make(src);
    const dest = join(dir, "store", "h1");
    const m = await capture({ src, dest, progress: false });
    assert.deepEqual(m.skipped, [{ path: bad, reason: "outside" }]);
    assert.ok(!m.symlinks.some((l) => l.path === bad), "not among the symlinks");
    assert.throws(() => lstatSync(join(dest, bad)), /ENOENT/, "not in the committed tree");
    assert.equal(m.fileCount, files.size, "everything else is there");
    assert.ok(existsSync(join(dest, READY_MARKER)));
    assert.deepEqual(await stagingDirs(join(dir, "store"), "h1"), [], "no staging left behind");
  });
}

void test("FIFOs and sockets are skipped and recorded; reserved names in the source are not taken", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  await makeCacheTree(src);
  assert.equal(spawnSync("mkfifo", [join(src, "cache/triton/pipe")]).status, 0, "mkfifo");
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(join(src, "cache/sock"), resolve));
  t.after(() => server.close());
  await writeFile(join(src, READY_MARKER), "forged");
  const dest = join(dir, "h1");

  const m = await capture({ src, dest, progress: false });
  assert.deepEqual(m.skipped, [
    { path: READY_MARKER, reason: "reserved" },
    { path: "cache/sock", reason: "socket" },
    { path: "cache/triton/pipe", reason: "fifo" },
  ]);
  assert.ok(!existsSync(join(dest, "cache/triton/pipe")));
  assert.ok(!existsSync(join(dest, "cache/sock")));
  assert.notEqual(
    await readFile(join(dest, READY_MARKER), "utf8"),
    "forged",
    "the marker is the capture's own",
  );
});

void test("a file deleted after the walk, before its copy, is tolerated and recorded", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  const { files } = await makeCacheTree(src);
  const dest = join(dir, "h1");
  const m = await capture({
    src,
    dest,
    progress: false,
    hooks: {
      afterScan: (scan) =>
        rm(join(src, KERNEL_META)).then(() => assert.ok(scan.entries.some((e) => e.rel === KERNEL_META))),
    },
  });
  assert.deepEqual(m.skipped, [{ path: KERNEL_META, reason: "vanished" }]);
  assert.equal(m.fileCount, files.size - 1);
  assert.ok(!m.files.some((f) => f.path === KERNEL_META));
  assert.ok(!existsSync(join(dest, KERNEL_META)));
  assert.ok(existsSync(join(dest, READY_MARKER)));
});

void test("a crash before commit leaves nothing that looks ready; the next capture cleans up and succeeds", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  await makeCacheTree(src);
  const store = join(dir, "store");
  const dest = join(store, "h1");
  const captureJs = new URL("./capture.js", import.meta.url).href;
  // A real crash: the process kills itself with SIGKILL once the staging tree is complete.
  const script = `
    const { capture } = await import(${JSON.stringify(captureJs)});
    await capture({ src: ${JSON.stringify(src)}, dest: ${JSON.stringify(dest)}, progress: false,
      hooks: { beforeCommit: () => process.kill(process.pid, "SIGKILL") } });`;
  const r = spawnSync(process.execPath, ["--input-type=module", "-e", script], { encoding: "utf8" });
  assert.equal(r.signal, "SIGKILL", r.stderr);
  assert.ok(!existsSync(dest), "nothing at the destination");
  const stale = await stagingDirs(store, "h1");
  assert.equal(stale.length, 1, "the dead run's staging dir is still there");
  assert.ok(!existsSync(join(store, stale[0] as string, READY_MARKER)), "and it carries no ready marker");

  const m = await capture({ src, dest, progress: false });
  assert.ok(existsSync(join(dest, READY_MARKER)));
  assert.equal(m.fileCount, 9);
  assert.deepEqual(await stagingDirs(store, "h1"), [], "stale staging removed");
});

void test("a failure before commit removes the staging dir and commits nothing", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  await makeCacheTree(src);
  const dest = join(dir, "h1");
  await assert.rejects(
    capture({
      src,
      dest,
      progress: false,
      hooks: { beforeCommit: () => Promise.reject(new Error("injected")) },
    }),
    /injected/,
  );
  assert.ok(!existsSync(dest));
  assert.deepEqual(await stagingDirs(dir, "h1"), []);
});

void test("a committed destination is never overwritten; a foreign one is refused; an unmarked one of ours is redone", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  await makeCacheTree(src);
  const dest = join(dir, "h1");
  const first = await capture({ src, dest, hash: "c".repeat(64), progress: false });
  await writeFile(join(src, TOP), "changed since");
  await assert.rejects(capture({ src, dest, progress: false }), (err: unknown) => {
    assert.ok(err instanceof AlreadyCapturedError);
    assert.equal(err.manifest?.createdAt, first.createdAt);
    assert.match(err.message, /already captured \(hash c{64}\)/);
    return true;
  });
  assert.equal(await readFile(join(dest, TOP), "utf8"), "top\n", "committed tree untouched");

  const foreign = join(dir, "foreign");
  await mkdir(foreign);
  await writeFile(join(foreign, "precious"), "keep me");
  await assert.rejects(
    capture({ src, dest: foreign, progress: false }),
    /is not a capture; refusing to overwrite/,
  );
  assert.equal(await readFile(join(foreign, "precious"), "utf8"), "keep me");

  // Committed but not marked (died between rename and marker): redone from the source.
  await rm(join(dest, READY_MARKER));
  const again = await capture({ src, dest, progress: false });
  assert.notEqual(again.createdAt, first.createdAt);
  assert.equal(await readFile(join(dest, TOP), "utf8"), "changed since");
});

void test("progress is drawn on a TTY and silent otherwise", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  await makeCacheTree(src);
  const drawn: string[] = [];
  await capture({ src, dest: join(dir, "a"), progress: { isTTY: true, write: (s) => drawn.push(s) > 0 } });
  // The final line is always drawn on a TTY, however short the copy.
  assert.match(drawn.at(-2) ?? "", /^\rcapture: 9\/9 files, 5\.3 MB\/5\.3 MB, \d+ MB\/s/);
  assert.equal(drawn.at(-1), "\n");
  const quiet: string[] = [];
  await capture({ src, dest: join(dir, "b"), progress: { isTTY: false, write: (s) => quiet.push(s) > 0 } });
  assert.deepEqual(quiet, []);
});

void test("the capture command: one-line errors for bad input, a summary on success", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  await makeCacheTree(src);
  const missing = runCli(["capture", join(dir, "nope"), join(dir, "x")]);
  assert.equal(missing.status, 1);
  assert.equal(missing.stderr, `warmstart: cannot capture ${join(dir, "nope")}: no such directory\n`);
  const bad = runCli(["capture", src, join(dir, "x"), "--parallel", "0"]);
  assert.equal(bad.status, 1);
  assert.equal(bad.stderr, 'warmstart: --parallel must be an integer from 1 to 256, got "0"\n');

  const ok = runCli(["capture", src, join(dir, "x"), "--hash", "d".repeat(64), "--model", "org/m"]);
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(
    ok.stdout,
    /^captured .*: 9 files, .*, (reflink|copy_file_range|copy)(, [\d.]+ [kMG]?B with O_DIRECT)?\)\n$/,
  );
  assert.equal(ok.stderr, "", "no progress when stderr is not a TTY");
  const twice = runCli(["capture", src, join(dir, "x")]);
  assert.equal(twice.status, 0);
  assert.match(twice.stdout, /already captured/);
  assert.equal((await readManifest(join(dir, "x"))).model, "org/m");
  assert.ok(
    existsSync(join(dir, "x", BLOB_SMALL)) &&
      existsSync(join(dir, "x", REF_MAIN)) &&
      existsSync(join(dir, "x", LOCK)),
  );
});

void test("across filesystems the kernel refuses copy_file_range: bytes are copied as they are hashed", async (t) => {
  const shm = "/dev/shm";
  if (!existsSync(shm) || statSync(shm).dev === statSync(tmpdir()).dev)
    return t.skip("no second filesystem here");
  const src = mkdtempSync(join(shm, "ws-datapath-"));
  t.after(() => rmSync(src, { recursive: true, force: true }));
  const { files, expected } = await makeCacheTree(src);
  const dest = join(tempDir(t), "h1");
  const m = await capture({ src, dest, progress: false });
  assert.equal(m.captureMethod, "copy");
  for (const f of m.files) assert.equal(f.digest, digestOf(m.digest, files.get(f.path) as Buffer), f.path);
  for (const [rel, body] of files) assert.ok((await readRel(dest, rel)).equals(body), rel);
  assert.equal((await snapshot(dest)).get(KERNEL)?.mtimeNs, expected.get(KERNEL)?.mtimeNs);
});

void test("without the native helpers the capture still works, and says its times are microseconds", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  const { files, expected } = await makeCacheTree(src);
  const dest = join(dir, "h1");
  const r = runCli(["capture", src, dest], { env: { WARMSTART_NO_NATIVE: "1" } });
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stderr, "warmstart: utimensat unavailable; times are kept to the microsecond\n");
  const m = await readManifest(dest);
  assert.equal(m.exactTimes, false);
  for (const f of m.files) assert.equal(f.digest, digestOf(m.digest, files.get(f.path) as Buffer), f.path);
  const got = await snapshot(dest, RESERVED);
  for (const rel of [KERNEL, LINK_A, BLOB_BIG]) {
    const want = expected.get(rel)?.mtimeNs ?? 0n;
    assert.equal(got.get(rel)?.mtimeNs, want - (want % 1000n), `${rel} mtime to the microsecond`);
  }
  assert.equal(got.get(LINK_A)?.ino, got.get(LINK_B)?.ino);
});

void test("a source root without write bits is committed with its mode by a plain UID: the marker goes in first", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  await mkdir(join(src, "cache"), { recursive: true });
  await writeFile(join(src, "cache/k"), "kernel");
  const store = join(dir, "store");
  await mkdir(store);
  // Root in the test: capture as a plain UID, which root's powers cannot stand in for.
  const uid = canSwitchUid() ? 12345 : undefined;
  if (uid !== undefined) assert.equal(spawnSync("chown", ["-R", `${uid}:${uid}`, src, store]).status, 0);
  await chmod(src, 0o555);
  const before = statSync(src, { bigint: true });
  const dest = join(store, "h1");
  const r = runCli(["capture", src, dest], { uid });
  assert.equal(r.status, 0, r.stderr);
  assert.ok(existsSync(join(dest, READY_MARKER)), "committed");
  const after = statSync(dest, { bigint: true });
  assert.equal(Number(after.mode) & 0o7777, 0o555, "the root's mode as captured");
  assert.equal(after.mtimeNs, before.mtimeNs, "the root's mtime as captured");
});

void test("each copier waits for the answer to its own question before it opens a file", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  // One big file (a copier of its own) and small ones (another copier), asked about at once.
  await mkdir(join(src, "cache"), { recursive: true });
  await writeFile(join(src, "big"), Buffer.alloc(9 << 20, 1));
  for (let i = 0; i < 20; i++) await writeFile(join(src, `cache/s${i}`), `small ${i}`);
  let bigAsked!: () => void;
  const asked = new Promise<void>((resolve) => (bigAsked = resolve));
  const m = await capture({
    src,
    dest: join(dir, "h1"),
    parallel: 2,
    progress: false,
    hooks: {
      beforeOpen: async (rel) => {
        if (rel !== "big") {
          // Answered while the big file's copier still waits for its own answer.
          await Promise.race([asked, sleep(2_000)]);
          return;
        }
        bigAsked();
        await sleep(300);
        // Replaced before its copier may open it: the copy must see the new file.
        renameSync(join(src, "big"), join(src, "big.old"));
        writeFileSync(join(src, "big"), "another file");
      },
    },
  });
  assert.deepEqual(m.skipped, [{ path: "big", reason: "replaced" }]);
  assert.equal(m.fileCount, 20);
});

test("a model URL's credentials never reach the manifest", async () => {
  const dir = mkdtempSync(join(tmpdir(), "ws-cap-url-"));
  try {
    await mkdir(join(dir, "src/model"), { recursive: true });
    await writeFile(join(dir, "src/model/w"), "weights");
    const m = await capture({
      src: join(dir, "src"),
      dest: join(dir, "tree"),
      hash: "ab".repeat(32),
      model: "https://me@corp:hf_s3cret@hub.local/org/m?token=abc",
      progress: false,
      durable: false,
    });
    const stored = await readFile(join(dir, "tree", MANIFEST_FILE), "utf8");
    for (const text of [m.model, stored]) {
      assert.doesNotMatch(text, /s3cret|corp|token=abc/);
    }
    assert.match(m.model, /hub\.local\/org\/m/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

void test("a big file is written past the page cache and digested from its one read; holes stay holes", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  const files = await bigAndSparse(src);
  const dest = join(dir, "h1");
  const m = await capture({ src, dest, progress: false });
  const big = files.get("model/big.safetensors") as Buffer;
  // The big file and the data blocks of the two files with holes, nothing of the holes.
  assert.ok((m.directBytes ?? 0) >= big.length, `directBytes ${m.directBytes}`);
  assert.ok((m.directBytes ?? 0) <= big.length + 64 * 1024, `directBytes ${m.directBytes}`);
  // Looked at before anything reads the copy: O_DIRECT left none of its pages in memory but
  // the last, which cutting the file back to its size reads in to zero the padding.
  const resident = await residentPages(join(dest, "model/big.safetensors"));
  assert.notEqual(resident, undefined, "this kernel tells page-cache residency (cachestat or mincore)");
  assert.ok((resident ?? 0) <= 1, `${resident} pages of the big file's copy in the page cache`);
  assert.ok((await allocated(join(dest, "model/sparse.bin"))) <= 64 * 1024, "the holes of 64 MiB stay holes");
  assert.ok((await allocated(join(dest, "cache/small-sparse"))) <= 8192, "a small file's holes too");
  await assertCaptured(dest, m, files);
  const want = await snapshot(src);
  const got = await snapshot(dest, RESERVED);
  for (const rel of files.keys()) assert.equal(got.get(rel)?.mtimeNs, want.get(rel)?.mtimeNs, `${rel} mtime`);
});

void test("with directIo off a big file goes through the page cache, and holes still stay holes", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  const files = await bigAndSparse(src);
  const dest = join(dir, "h1");
  const m = await capture({ src, dest, progress: false, directIo: false, durable: false });
  assert.equal(m.directBytes, 0);
  const resident = await residentPages(join(dest, "model/big.safetensors"));
  assert.ok((resident ?? 0) > 0, "the copy is in the page cache");
  assert.ok((await allocated(join(dest, "model/sparse.bin"))) <= 64 * 1024, "the holes stay holes");
  await assertCaptured(dest, m, files);
});

void test("a store that refuses O_DIRECT (ramfs) gets the same tree through the page cache", async (t) => {
  if (process.getuid?.() !== 0) return t.skip("mounting ramfs needs root");
  // Its own folder, unmounted before it is removed (tempDir's cleanup would meet a mount).
  const store = mkdtempSync(join(tmpdir(), "ws-ramfs-"));
  t.after(() => {
    spawnSync("umount", [store]);
    rmSync(store, { recursive: true, force: true });
  });
  if (spawnSync("mount", ["-t", "ramfs", "ramfs", store]).status !== 0)
    return t.skip("cannot mount ramfs here");
  const dir = tempDir(t);
  const src = join(dir, "src");
  const files = await bigAndSparse(src);
  const dest = join(store, "h1");
  const m = await capture({ src, dest, progress: false });
  assert.equal(m.directBytes, 0, "nothing written with O_DIRECT");
  await assertCaptured(dest, m, files);
});
