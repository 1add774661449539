import assert from "node:assert/strict";
import { closeSync, mkdtempSync, openSync, rmSync, statSync, constants as fsc } from "node:fs";
import { chmod, link, mkdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { capture } from "./capture.js";
import {
  copyUserXattrs,
  getXattr,
  listXattrs,
  MAX_XATTR_BYTES,
  MAX_XATTRS,
  setXattr,
  xattrsAvailable,
} from "./xattr.js";
import { tempDir } from "../../test/support/datapath.js";

/** Runs `fn` on a descriptor of `path` (file or directory), opened read-only. */
function withFd<T>(path: string, fn: (fd: number) => T): T {
  const fd = openSync(path, fsc.O_RDONLY | fsc.O_NOFOLLOW);
  try {
    return fn(fd);
  } finally {
    closeSync(fd);
  }
}

const setX = (path: string, name: string, value: Buffer | string): void =>
  withFd(path, (fd) => setXattr(fd, name, Buffer.isBuffer(value) ? value : Buffer.from(value)));
const listX = (path: string): string[] => withFd(path, listXattrs).sort();
const getX = (path: string, name: string): Buffer | undefined => withFd(path, (fd) => getXattr(fd, name));

const code = (err: unknown): string | undefined => (err as NodeJS.ErrnoException).code;

/**
 * A scratch directory whose filesystem keeps user attributes with values of `valueBytes` in all
 * on one file (ext4 keeps about 4 KiB a file; tmpfs, XFS and btrfs 64 KiB per value): the test
 * temp directory if it does, else one in /dev/shm (tmpfs). A string says why there is none.
 */
function xattrDir(t: TestContext, valueBytes: number): string | { why: string } {
  if (!xattrsAvailable()) return { why: "no native helpers (koffi) for f*xattr" };
  const tried: string[] = [];
  const candidates: (() => string)[] = [
    () => tempDir(t, "ws-xattr-"),
    () => {
      const dir = mkdtempSync("/dev/shm/ws-xattr-");
      t.after(() => rmSync(dir, { recursive: true, force: true }));
      return dir;
    },
  ];
  for (const make of candidates) {
    let dir: string;
    try {
      dir = make();
    } catch (err) {
      tried.push(String((err as Error).message));
      continue;
    }
    const probe = join(dir, "probe");
    try {
      closeSync(openSync(probe, fsc.O_CREAT | fsc.O_WRONLY, 0o600));
      const each = Math.min(valueBytes, 10 << 10);
      for (let i = 0; i * each < valueBytes; i++) setX(probe, `user.probe${i}`, Buffer.alloc(each, 1));
      rmSync(probe);
      return dir;
    } catch (err) {
      tried.push(`${dir}: ${code(err) ?? String(err)}`);
      rmSync(probe, { force: true });
    }
  }
  return { why: `no filesystem here keeps ${valueBytes} bytes of user xattrs a file (${tried.join("; ")})` };
}

void test("capture keeps the user.* xattrs of files, hard links, read-only files and directories, root included", async (t) => {
  const dir = xattrDir(t, 1024);
  if (typeof dir !== "string") return t.skip(dir.why);
  const src = join(dir, "src");
  await mkdir(join(src, "model", "sub"), { recursive: true });
  await writeFile(join(src, "model", "a.bin"), "alpha");
  await writeFile(join(src, "model", "plain.bin"), "no attributes");
  await writeFile(join(src, "model", "sub", "ro.bin"), "read-only");
  await link(join(src, "model", "a.bin"), join(src, "model", "a-link.bin"));
  const notUtf8 = Buffer.from([0xff, 0x00, 0xfe, 0x80]);
  setX(join(src, "model", "a.bin"), "user.origin", "hub:org/m@rev1");
  setX(join(src, "model", "a.bin"), "user.bytes", notUtf8);
  setX(join(src, "model", "a.bin"), "user.empty", Buffer.alloc(0));
  setX(join(src, "model", "sub", "ro.bin"), "user.ro", "kept");
  setX(join(src, "model", "sub"), "user.dir", "sub");
  setX(src, "user.root", "top");
  // Modes that would refuse a user xattr to anyone but root if the copy's mode came first.
  await chmod(join(src, "model", "sub", "ro.bin"), 0o444);
  await chmod(join(src, "model", "sub"), 0o555);
  const before = statSync(join(src, "model", "a.bin"), { bigint: true });
  const dest = join(dir, "store", "h1");

  await capture({ src, dest, hash: "c".repeat(64), model: "org/m", progress: false });

  const a = join(dest, "model", "a.bin");
  assert.deepEqual(listX(a), ["user.bytes", "user.empty", "user.origin"]);
  assert.equal(getX(a, "user.origin")?.toString(), "hub:org/m@rev1");
  assert.deepEqual(getX(a, "user.bytes"), notUtf8, "values copied byte for byte");
  assert.equal(getX(a, "user.empty")?.length, 0);
  assert.deepEqual(listX(join(dest, "model", "a-link.bin")), ["user.bytes", "user.empty", "user.origin"]);
  assert.deepEqual(listX(join(dest, "model", "plain.bin")), []);
  assert.equal(getX(join(dest, "model", "sub", "ro.bin"), "user.ro")?.toString(), "kept");
  assert.equal(getX(join(dest, "model", "sub"), "user.dir")?.toString(), "sub");
  assert.equal(getX(dest, "user.root")?.toString(), "top");
  // Attributes go on before the times: the captured mtime stands.
  assert.equal(statSync(a, { bigint: true }).mtimeNs, before.mtimeNs);
  assert.equal(statSync(join(dest, "model", "sub")).mode & 0o7777, 0o555);
});

void test("only the user namespace travels: trusted.* and security.* xattrs stay behind", async (t) => {
  const dir = xattrDir(t, 1024);
  if (typeof dir !== "string") return t.skip(dir.why);
  const src = join(dir, "src");
  await mkdir(join(src, "d"), { recursive: true });
  const file = join(src, "d", "f.bin");
  await writeFile(file, "data");
  for (const p of [file, join(src, "d")]) {
    setX(p, "user.keep", "yes");
    for (const name of ["trusted.warmstart", "security.warmstart"]) {
      try {
        setX(p, name, "privileged");
      } catch (err) {
        return t.skip(`cannot set ${name} here (${code(err)}): needs root and a filesystem that keeps it`);
      }
    }
  }
  const dest = join(dir, "store", "h1");

  await capture({ src, dest, hash: "d".repeat(64), model: "org/m", progress: false });

  for (const p of [join(dest, "d", "f.bin"), join(dest, "d")]) {
    const names = listX(p);
    assert.ok(names.includes("user.keep"), `${p}: ${names.join(",")}`);
    assert.ok(!names.includes("trusted.warmstart"), `${p}: trusted.* must not be copied`);
    assert.ok(!names.includes("security.warmstart"), `${p}: security.* must not be copied`);
    assert.equal(getX(p, "trusted.warmstart"), undefined);
  }
});

void test("at most 64 user xattrs and 64 KiB of their values are copied per file, and the capture goes on", async (t) => {
  const dir = xattrDir(t, 80 << 10);
  if (typeof dir !== "string") return t.skip(dir.why);
  const src = join(dir, "src");
  await mkdir(src, { recursive: true });
  const many = join(src, "many.bin");
  const big = join(src, "big.bin");
  const after = join(src, "zz-after.bin");
  await writeFile(many, "many");
  await writeFile(big, "big");
  await writeFile(after, "after");
  for (let i = 0; i < 80; i++) setX(many, `user.n${String(i).padStart(2, "0")}`, `v${i}`);
  // Eight values of 10 KiB: six fit in 64 KiB, whichever order the kernel lists them in.
  for (let i = 0; i < 8; i++) setX(big, `user.big${i}`, Buffer.alloc(10 << 10, 0x30 + i));
  setX(after, "user.after", "ok");
  const dest = join(dir, "store", "h1");

  const m = await capture({ src, dest, hash: "e".repeat(64), model: "org/m", progress: false });
  assert.equal(m.fileCount, 3);

  const manyNames = listX(join(dest, "many.bin"));
  assert.equal(manyNames.length, MAX_XATTRS);
  for (const n of manyNames) {
    assert.match(n, /^user\.n\d\d$/);
    assert.deepEqual(getX(join(dest, "many.bin"), n), getX(many, n), n);
  }
  const bigNames = listX(join(dest, "big.bin"));
  assert.equal(bigNames.length, 6);
  let total = 0;
  for (const n of bigNames) {
    const v = getX(join(dest, "big.bin"), n) as Buffer;
    assert.deepEqual(v, getX(big, n), n);
    total += v.length;
  }
  assert.ok(total <= MAX_XATTR_BYTES, `${total} bytes of values`);
  assert.equal((await readFile(join(dest, "big.bin"))).toString(), "big");
  assert.equal(getX(join(dest, "zz-after.bin"), "user.after")?.toString(), "ok");
});

void test("copyUserXattrs counts what it leaves out, and copies nothing onto a filesystem that keeps none", async (t) => {
  const dir = xattrDir(t, 1024);
  if (typeof dir !== "string") return t.skip(dir.why);
  const a = join(dir, "a");
  const b = join(dir, "b");
  await writeFile(a, "");
  await writeFile(b, "");
  for (let i = 0; i < MAX_XATTRS + 3; i++) setX(a, `user.k${i}`, "1");
  const r = withFd(a, (src) => {
    const dst = openSync(b, fsc.O_WRONLY);
    try {
      return copyUserXattrs(src, dst);
    } finally {
      closeSync(dst);
    }
  });
  assert.deepEqual(r, { copied: MAX_XATTRS, dropped: 3 });
  // /proc keeps no extended attributes: listing there finds none, and nothing throws.
  const none = withFd("/proc/self/status", (src) => withFd(a, (dst) => copyUserXattrs(src, dst)));
  assert.deepEqual(none, { copied: 0, dropped: 0 });
  const refused = withFd(a, (src) => withFd("/proc/self/status", (dst) => copyUserXattrs(src, dst)));
  assert.equal(refused.copied, 0);
  assert.equal(refused.dropped, MAX_XATTRS + 3);
});
