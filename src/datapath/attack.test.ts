/**
 * The data path played by an attacker: the pod whose cache is captured keeps running and changes
 * its tree while it is copied (through the capture's hooks, at exact points), and a pod's
 * writable shadow may hold symlinks planted by an earlier container. Nothing from outside the
 * source may reach the store, nothing may hang, and a stopped capture leaves nothing behind.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import {
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import {
  appendFile,
  chmod,
  mkdir,
  mkdtemp,
  open,
  readdir,
  readFile,
  rm,
  stat,
  writeFile,
} from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { MANIFEST_FILE, READY_MARKER } from "../core/contract.js";
import { capture, CaptureStoppedError } from "./capture.js";
import { createDigest, digestOf } from "./digest.js";
import { nameOf, readManifest } from "./manifest.js";
import { isReady, waitForReady } from "./ready.js";
import { seed } from "./seed.js";
import {
  KERNEL,
  KERNEL_META,
  LINK_A,
  makeCacheTree,
  runCli,
  tempDir,
  TOP,
} from "../../test/support/datapath.js";

const PASSWD = readFileSync("/etc/passwd");
const stagingDirs = (parent: string, base: string): string[] =>
  readdirSync(parent).filter((n) => n.startsWith(`${base}.tmp-`));

/** Every regular file's bytes under `root`, by relative path, without following any symlink. */
function contents(root: string): Map<string, Buffer> {
  const out = new Map<string, Buffer>();
  const walk = (rel: string): void => {
    const abs = rel === "" ? root : join(root, rel);
    const st = lstatSync(abs);
    if (st.isDirectory()) for (const n of readdirSync(abs)) walk(rel === "" ? n : `${rel}/${n}`);
    else if (st.isFile()) out.set(rel, readFileSync(abs));
  };
  walk("");
  return out;
}

for (const noOpenat2 of [false, true]) {
  const how = noOpenat2 ? "component by component" : "openat2";

  void test(`a folder swapped for a symlink to /etc after the scan: nothing of /etc is committed (${how})`, async (t) => {
    const dir = tempDir(t);
    const src = join(dir, "src");
    await makeCacheTree(src);
    // A file whose name exists in /etc: what the copy would read through the swapped folder.
    await writeFile(join(src, "cache/triton/abc/passwd"), "the pod's own\n");
    const dest = join(dir, "store", "h1");
    const m = await capture({
      src,
      dest,
      progress: false,
      noOpenat2,
      hooks: {
        afterScan: () => {
          renameSync(join(src, "cache/triton/abc"), join(src, "cache/triton/moved"));
          symlinkSync("/etc", join(src, "cache/triton/abc"));
        },
      },
    });
    for (const [rel, body] of contents(dest))
      assert.ok(!body.equals(PASSWD) || PASSWD.length === 0, `${rel} holds /etc/passwd`);
    assert.ok(!existsSync(join(dest, "cache/triton/abc/passwd")));
    assert.deepEqual(
      m.skipped.filter((s) => s.path.startsWith("cache/triton/abc/")),
      [
        { path: "cache/triton/abc/kernel.cubin", reason: "replaced" },
        { path: "cache/triton/abc/kernel.json", reason: "replaced" },
        { path: "cache/triton/abc/passwd", reason: "replaced" },
      ],
    );
    assert.ok(existsSync(join(dest, READY_MARKER)), "the rest is captured");
  });

  void test(`a folder swapped for a symlink mid-copy, just before a file in it is opened (${how})`, async (t) => {
    const dir = tempDir(t);
    const src = join(dir, "src");
    await makeCacheTree(src);
    await writeFile(join(src, "cache/triton/abc/passwd"), "the pod's own\n");
    const dest = join(dir, "h1");
    let swapped = 0;
    const m = await capture({
      src,
      dest,
      progress: false,
      noOpenat2,
      hooks: {
        beforeOpen: (rel) => {
          if (rel !== "cache/triton/abc/passwd") return;
          swapped += 1;
          renameSync(join(src, "cache/triton/abc"), join(src, "cache/triton/moved"));
          symlinkSync("/etc", join(src, "cache/triton/abc"));
        },
      },
    });
    assert.equal(swapped, 1, "the hook ran where it was meant to");
    for (const [rel, body] of contents(dest)) assert.ok(!body.equals(PASSWD), `${rel} holds /etc/passwd`);
    assert.ok(m.skipped.some((s) => s.path === "cache/triton/abc/passwd" && s.reason === "replaced"));
  });
}

void test(
  "a file swapped for a FIFO after the scan is never opened for reading: no hang, skipped and recorded",
  { timeout: 30_000 },
  async (t) => {
    const dir = tempDir(t);
    const src = join(dir, "src");
    const { files } = await makeCacheTree(src);
    const dest = join(dir, "h1");
    const m = await capture({
      src,
      dest,
      progress: false,
      deadlineMs: 20_000,
      hooks: {
        afterScan: () => {
          rmSync(join(src, KERNEL_META));
          assert.equal(spawnSync("mkfifo", [join(src, KERNEL_META)]).status, 0, "mkfifo");
        },
      },
    });
    assert.deepEqual(m.skipped, [{ path: KERNEL_META, reason: "fifo" }]);
    assert.equal(m.fileCount, files.size - 1);
    assert.ok(!existsSync(join(dest, KERNEL_META)));
    assert.ok(existsSync(join(dest, READY_MARKER)));
  },
);

void test("a file replaced by another file after the scan is left out (it is not the file that was scanned)", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  await makeCacheTree(src);
  const dest = join(dir, "h1");
  const m = await capture({
    src,
    dest,
    progress: false,
    hooks: {
      afterScan: () => {
        // The old file stays alive elsewhere, so the new one cannot reuse its inode number.
        renameSync(join(src, TOP), join(src, "cache/top.old"));
        writeFileSync(join(src, TOP), "another file under the same name");
      },
    },
  });
  assert.deepEqual(m.skipped, [{ path: TOP, reason: "replaced" }]);
  assert.ok(!existsSync(join(dest, TOP)));
});

/** Waits while the copy goes on, so a deadline or a cancel lands mid-copy. */
async function stoppedMidCopy(
  t: TestContext,
  stopWith: (ac: AbortController) => { deadlineMs?: number; signal?: AbortSignal },
): Promise<{ err: unknown; dest: string; dir: string; calls: () => number }> {
  const dir = tempDir(t);
  const src = join(dir, "src");
  await makeCacheTree(src);
  const dest = join(dir, "h1");
  mkdirSync(dest); // a destination made by someone else: it must survive the failure as it was
  const ino = statSync(dest).ino;
  const ac = new AbortController();
  let calls = 0;
  const err = await capture({
    src,
    dest,
    progress: false,
    ...stopWith(ac),
    hooks: {
      beforeOpen: async () => {
        calls += 1;
        if (calls === 3) ac.abort(new Error("the leader went away"));
        await sleep(150);
      },
    },
  }).then(
    () => undefined,
    (e: unknown) => e,
  );
  assert.ok(existsSync(dest), "the destination it did not create is still there");
  assert.equal(statSync(dest).ino, ino, "the very same directory");
  assert.deepEqual(readdirSync(dest), [], "and as empty as it was");
  return { err, dest, dir, calls: () => calls };
}

void test("a capture past its deadline fails cleanly: copiers stopped, no staging, nothing committed", async (t) => {
  const { err, dir, calls } = await stoppedMidCopy(t, () => ({ deadlineMs: 200 }));
  assert.ok(err instanceof CaptureStoppedError, String(err));
  assert.equal(err.why, "deadline");
  assert.match(err.message, /passed its deadline .*nothing was committed/);
  assert.deepEqual(stagingDirs(dir, "h1"), [], "no staging left");
  const seen = calls();
  await sleep(600);
  assert.equal(calls(), seen, "no copier opens anything after the capture ended");
  assert.deepEqual(stagingDirs(dir, "h1"), [], "and nothing writes a staging tree back");
});

void test("a capture cancelled mid-copy (the leader went away) fails cleanly as well", async (t) => {
  const { err, dir, calls } = await stoppedMidCopy(t, (ac) => ({ signal: ac.signal, deadlineMs: 0 }));
  assert.ok(err instanceof CaptureStoppedError, String(err));
  assert.equal(err.why, "aborted");
  assert.match(err.message, /was cancelled: the leader went away; nothing was committed/);
  assert.ok(calls() >= 3 && calls() < 9, `stopped early (${calls()} opens of 9 files)`);
  assert.deepEqual(stagingDirs(dir, "h1"), []);
  const seen = calls();
  await sleep(600);
  assert.equal(calls(), seen);
});

void test("the capture command takes --deadline in seconds (0: no limit)", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  await makeCacheTree(src);
  const r = runCli(["capture", src, join(dir, "h1"), "--deadline", "x"]);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /^warmstart: --deadline must be an integer from 0 to \d+, got "x"\n$/);
  const ok = runCli(["capture", src, join(dir, "h1"), "--deadline", "0"]);
  assert.equal(ok.status, 0, ok.stderr);
});

void test("names that are not UTF-8 are captured and seeded byte for byte", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  const { files } = await makeCacheTree(src);
  const raw = (s: string, tail: number[]): Buffer => Buffer.concat([Buffer.from(s), Buffer.from(tail)]);
  const fileName = raw(`${src}/cache/k-`, [0xff, 0xfe, 0x2e]); // not UTF-8
  const dirName = raw(`${src}/cache/d-`, [0xc3, 0x28]); // an invalid two-byte sequence
  const inDir = Buffer.concat([dirName, Buffer.from("/inner.bin")]);
  const linkName = raw(`${src}/cache/l-`, [0x80]);
  const body = Buffer.from("bytes of a file with an odd name");
  writeFileSync(fileName, body);
  mkdirSync(dirName);
  writeFileSync(inDir, body);
  symlinkSync(raw("k-", [0xff, 0xfe, 0x2e]), linkName);

  const dest = join(dir, "ro");
  const m = await capture({ src, dest, progress: false });
  assert.deepEqual(m.skipped, []);
  assert.equal(m.fileCount, files.size + 2);
  const rawOf = (b: Buffer): string => b.subarray(src.length + 1).toString("latin1");
  for (const want of [fileName, inDir]) {
    const f = m.files.find((x) => nameOf(x.path, x.pathBytes) === rawOf(want));
    assert.ok(f, `the manifest lists ${rawOf(want)}`);
    assert.ok(f.pathBytes, "with its bytes");
    assert.equal(f.digest, digestOf(m.digest, body));
    const copy = Buffer.concat([Buffer.from(dest), want.subarray(src.length)]);
    assert.ok(readFileSync(copy).equals(body), "the copy is there under the same bytes");
  }
  const l = m.symlinks.find((x) => nameOf(x.path, x.pathBytes) === rawOf(linkName));
  assert.ok(l?.targetBytes, "the link's target is kept as bytes");
  const destLink = Buffer.concat([Buffer.from(dest), linkName.subarray(src.length)]);
  assert.ok(readlinkSync(destLink, { encoding: "buffer" }).equals(raw("k-", [0xff, 0xfe, 0x2e])));

  // And back out through seed, with the manifest check on.
  const shadow = join(dir, "shadow");
  await seed({ from: dest, to: shadow });
  const seeded = Buffer.concat([Buffer.from(shadow), fileName.subarray(src.length)]);
  assert.ok(readFileSync(seeded).equals(body));
  assert.ok(readFileSync(Buffer.concat([Buffer.from(shadow), inDir.subarray(src.length)])).equals(body));
});

/** A committed tree to restore from. */
async function captured(dir: string, hash = "e".repeat(64)): Promise<string> {
  await makeCacheTree(join(dir, "src"));
  const ro = join(dir, "ro");
  await capture({ src: join(dir, "src"), dest: ro, hash, progress: false });
  return ro;
}

void test("seed never writes through symlinks planted in the shadow by an earlier container", async (t) => {
  const dir = tempDir(t);
  const ro = await captured(dir);
  const outside = join(dir, "outside");
  await mkdir(outside);
  await writeFile(join(outside, "precious"), "keep");
  const shadow = join(dir, "shadow");
  await mkdir(join(shadow, "cache/triton"), { recursive: true });
  // A folder of the tree, and a file seed copies, both planted as links out of the shadow.
  symlinkSync(outside, join(shadow, "cache/triton/abc"));
  await mkdir(join(shadow, "cache/inductor/fx"), { recursive: true });
  symlinkSync(join(outside, "precious"), join(shadow, LINK_A));

  const r = await seed({ from: ro, to: shadow });
  assert.deepEqual(readdirSync(outside), ["precious"], "nothing created outside the shadow");
  assert.equal(readFileSync(join(outside, "precious"), "utf8"), "keep", "nothing written outside");
  assert.ok(lstatSync(join(shadow, "cache/triton/abc")).isDirectory(), "the planted link became a directory");
  assert.ok(lstatSync(join(shadow, KERNEL)).isFile());
  assert.ok(lstatSync(join(shadow, LINK_A)).isFile(), "the planted file link was replaced by the file");
  assert.equal(r.replaced, 2);
});

void test("seed refuses to seed into a shadow that is itself a symlink", async (t) => {
  const dir = tempDir(t);
  const ro = await captured(dir);
  await mkdir(join(dir, "elsewhere"));
  symlinkSync(join(dir, "elsewhere"), join(dir, "shadow"));
  await assert.rejects(
    seed({ from: ro, to: join(dir, "shadow") }),
    /refusing to seed into .*: it is a symlink/,
  );
  assert.deepEqual(readdirSync(join(dir, "elsewhere")), []);
});

void test("seed checks the manifest of the tree it mounts: hash, file list and sizes, digests of what it copies", async (t) => {
  const dir = tempDir(t);
  const hash = "e".repeat(64);
  const ro = await captured(dir, hash);
  const shadow = (n: string): string => join(dir, `shadow-${n}`);

  // The right hash: fine.
  await seed({ from: ro, to: shadow("ok"), hash });

  // Another hash.
  await assert.rejects(
    seed({ from: ro, to: shadow("hash"), hash: "f".repeat(64) }),
    new RegExp(`refusing to seed from .*: it was captured for hash ${hash}, not f{64}`),
  );
  const cli = runCli(["seed", "--from", ro, "--to", shadow("cli"), "--hash", "f".repeat(64)]);
  assert.equal(cli.status, 1);
  assert.match(
    cli.stderr,
    /^warmstart: refusing to seed from .*: it was captured for hash e{64}, not f{64}\n$/,
  );
  assert.ok(!existsSync(join(shadow("cli"), "cache")), "nothing seeded");

  // A file whose size differs from the manifest's.
  await appendFile(join(ro, KERNEL), "x");
  await assert.rejects(
    seed({ from: ro, to: shadow("size"), hash }),
    /the tree does not match its manifest: cache\/triton\/abc\/kernel\.cubin is 10001 bytes, the manifest says 10000/,
  );
  await writeFile(join(ro, KERNEL), (await readFile(join(ro, KERNEL))).subarray(0, 10_000));

  // Same size, other bytes, in a file seed copies: caught by its digest.
  const body = await readFile(join(ro, KERNEL_META));
  await writeFile(join(ro, KERNEL_META), Buffer.from(body.toString().replace("4", "8")));
  await assert.rejects(
    seed({ from: ro, to: shadow("digest"), hash }),
    /refusing to seed cache\/triton\/abc\/kernel\.json: its content does not match the manifest's blake3 digest/,
  );
  await writeFile(join(ro, KERNEL_META), body);

  // A file the manifest does not list.
  await writeFile(join(ro, "cache/extra"), "x");
  await assert.rejects(seed({ from: ro, to: shadow("extra") }), /cache\/extra is not in the manifest/);
  await rm(join(ro, "cache/extra"));

  // No manifest, or one that is not a regular file.
  const manifest = await readFile(join(ro, MANIFEST_FILE));
  await chmod(join(ro, MANIFEST_FILE), 0o644);
  await rm(join(ro, MANIFEST_FILE));
  await assert.rejects(
    seed({ from: ro, to: shadow("none") }),
    /refusing to seed from .*: it has no manifest/,
  );
  await writeFile(join(dir, "m.json"), manifest);
  symlinkSync(join(dir, "m.json"), join(ro, MANIFEST_FILE));
  await assert.rejects(seed({ from: ro, to: shadow("link") }), /refusing to seed from .*manifest/);
  await rm(join(ro, MANIFEST_FILE));
  await writeFile(join(ro, MANIFEST_FILE), "{ not json");
  await assert.rejects(seed({ from: ro, to: shadow("bad") }), /refusing to seed from .*not valid JSON/);
  await writeFile(join(ro, MANIFEST_FILE), manifest);
  await seed({ from: ro, to: shadow("again"), hash });
  assert.equal((await readManifest(ro)).hash, hash);
});

void test("a version 1 manifest (sha256 digests) still verifies", async (t) => {
  const dir = tempDir(t);
  const ro = await captured(dir);
  const m = await readManifest(ro);
  const v1 = {
    ...m,
    version: 1,
    digest: undefined,
    files: m.files.map(({ digest: _d, pathBytes: _p, linkToBytes: _l, ...f }) => ({
      ...f,
      sha256: digestOf("sha256", readFileSync(join(ro, f.path))),
    })),
    symlinks: m.symlinks.map((l) => ({ path: l.path, target: l.target })),
  };
  await chmod(join(ro, MANIFEST_FILE), 0o644);
  await writeFile(join(ro, MANIFEST_FILE), JSON.stringify(v1));
  const back = await readManifest(ro);
  assert.equal(back.digest, "sha256");
  const r = await seed({ from: ro, to: join(dir, "shadow"), hash: "e".repeat(64) });
  assert.equal(r.copied, 7, "copied files verified against their sha256");
});

void test("wait-ready only takes a marker that is a regular file, not a symlink to one", async (t) => {
  const dir = tempDir(t);
  await writeFile(join(dir, "real"), "{}");
  symlinkSync(join(dir, "real"), join(dir, READY_MARKER));
  assert.equal(await isReady(dir), false);
  await assert.rejects(waitForReady(dir, 200, { intervalMs: 20 }), /timed out/);
  await rm(join(dir, READY_MARKER));
  await writeFile(join(dir, READY_MARKER), "{}");
  await waitForReady(dir, 200, { intervalMs: 20 });
  assert.deepEqual((await readdir(dir)).sort(), [READY_MARKER, "real"].sort());
});

test("a pod's credentials and set-id bits never reach the tree others start from", async () => {
  const dir = await mkdtemp(join(tmpdir(), "ws-attack-cred-"));
  try {
    const src = join(dir, "src");
    await mkdir(join(src, "huggingface/hub"), { recursive: true });
    await mkdir(join(src, "cache/shared"), { recursive: true });
    await writeFile(join(src, "huggingface/token"), "hf_s3cret");
    await writeFile(join(src, "huggingface/stored_tokens"), "[x]\nhf_token = hf_s3cret");
    await writeFile(join(src, ".netrc"), "machine hub login me password s3cret");
    await writeFile(join(src, "cache/.git-credentials"), "https://me:s3cret@git");
    await writeFile(join(src, "huggingface/hub/weights"), "w");
    await writeFile(join(src, "cache/kernel.so"), "elf");
    await chmod(join(src, "cache/kernel.so"), 0o4755);
    await chmod(join(src, "cache/shared"), 0o2777);
    const m = await capture({
      src,
      dest: join(dir, "tree"),
      hash: "cd".repeat(32),
      progress: false,
      durable: false,
    });
    const tree = join(dir, "tree");
    for (const f of ["huggingface/token", "huggingface/stored_tokens", ".netrc", "cache/.git-credentials"]) {
      await assert.rejects(stat(join(tree, f)), /ENOENT/, `${f} not copied`);
      assert.ok(
        m.skipped.some((s) => s.path === f && s.reason === "credential"),
        `${f} listed as set aside`,
      );
    }
    assert.equal(await readFile(join(tree, "huggingface/hub/weights"), "utf8"), "w");
    assert.equal((await stat(join(tree, "cache/kernel.so"))).mode & 0o6000, 0, "no set-user-ID");
    assert.equal((await stat(join(tree, "cache/shared"))).mode & 0o6000, 0, "no set-group-ID");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test("a pod's sparse file takes no more room in the tree others start from than in the pod", async () => {
  const dir = await mkdtemp(join(tmpdir(), "ws-attack-sparse-"));
  try {
    const src = join(dir, "src");
    await mkdir(join(src, "model"), { recursive: true });
    // 1 GiB to anyone who reads it, 4 KiB on the pod's disk.
    const fh = await open(join(src, "model/huge.bin"), "w");
    try {
      await fh.truncate(1 << 30);
      await fh.write(Buffer.from("payload"), 0, 7, 512 << 20);
    } finally {
      await fh.close();
    }
    const m = await capture({ src, dest: join(dir, "tree"), progress: false, durable: false });
    const st = await stat(join(dir, "tree/model/huge.bin"));
    assert.equal(st.size, 1 << 30, "the same apparent size");
    assert.ok(st.blocks * 512 <= 64 * 1024, `${st.blocks * 512} bytes on disk, not a filled GiB`);
    // What a reader sees, digested a block of zeros at a time: 512 MiB of zeros, the payload,
    // then zeros to 1 GiB.
    const d = createDigest(m.digest);
    const zeros = Buffer.alloc(16 << 20);
    for (let n = 0; n < 32; n++) d.update(zeros);
    d.update(Buffer.from("payload"));
    const tail = (1 << 30) - (512 << 20) - 7;
    for (let left = tail; left > 0; left -= zeros.length)
      d.update(zeros.subarray(0, Math.min(left, zeros.length)));
    assert.equal(m.files[0]?.digest, d.hex(), "the digest is of what a reader sees");
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
