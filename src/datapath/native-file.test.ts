import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { closeSync, lstatSync, openSync, constants as fsc, utimesSync, type BigIntStats } from "node:fs";
import { link, mkdir, symlink, truncate, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { MANIFEST_FILE, READY_MARKER } from "../core/contract.js";
import { O_PATH } from "./beneath.js";
import { capture } from "./capture.js";
import { statxAt, type FileStat } from "./native-file.js";
import { kernelCopyAvailable } from "./native.js";
import { readManifest } from "./manifest.js";
import { makeCacheTree, runCli, snapshot, tempDir } from "../../test/support/datapath.js";

const FIELDS = ["dev", "ino", "mode", "nlink", "uid", "gid", "size", "blocks", "atimeNs", "mtimeNs"] as const;
const KINDS = [
  "isFile",
  "isDirectory",
  "isSymbolicLink",
  "isFIFO",
  "isSocket",
  "isCharacterDevice",
  "isBlockDevice",
] as const;

function assertSame(got: FileStat | undefined, want: BigIntStats, what: string): void {
  assert.ok(got, `${what}: statx answered`);
  for (const f of FIELDS) assert.equal(got[f], want[f], `${what}: ${f}`);
  for (const k of KINDS) assert.equal(got[k](), want[k](), `${what}: ${k}`);
}

void test("statx reads what Node's lstat reads, field by field, for every kind of entry", async (t) => {
  if (!kernelCopyAvailable()) return t.skip("no native helpers here");
  const dir = tempDir(t);
  await writeFile(join(dir, "file"), "x".repeat(5000));
  await truncate(join(dir, "file"), 1 << 20); // a hole: fewer blocks than the size needs
  // Times before the epoch and with nanoseconds, which a wrong offset or sign would show.
  utimesSync(join(dir, "file"), -1.25, 1_700_000_000.123456);
  await link(join(dir, "file"), join(dir, "hard"));
  await mkdir(join(dir, "sub"));
  await symlink("file", join(dir, "link"));
  assert.equal(spawnSync("mkfifo", [join(dir, "fifo")]).status, 0);
  const dirFd = openSync(dir, O_PATH | fsc.O_DIRECTORY);
  try {
    for (const name of ["file", "hard", "sub", "link", "fifo"]) {
      const want = lstatSync(join(dir, name), { bigint: true });
      assertSame(statxAt(dirFd, name), want, name);
      // The same entry through a descriptor of its own (O_PATH: a link or a FIFO is not followed
      // or opened).
      const fd = openSync(join(dir, name), O_PATH | fsc.O_NOFOLLOW);
      try {
        assertSame(statxAt(fd, ""), want, `${name} by descriptor`);
      } finally {
        closeSync(fd);
      }
    }
    assert.throws(() => statxAt(dirFd, "missing"), { code: "ENOENT" });
  } finally {
    closeSync(dirFd);
  }
});

void test("a capture without statx (refused, or an old libc) records the same tree", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  await makeCacheTree(src);
  const withStatx = join(dir, "a");
  const without = join(dir, "b");
  await capture({ src, dest: withStatx, progress: false });
  const r = runCli(["capture", src, without], { env: { WARMSTART_NO_STATX: "1" } });
  assert.equal(r.status, 0, r.stderr);
  const [a, b] = [await readManifest(withStatx), await readManifest(without)];
  assert.deepEqual(
    b.files.map((f) => [f.path, f.size, f.digest, f.linkTo]),
    a.files.map((f) => [f.path, f.size, f.digest, f.linkTo]),
  );
  assert.deepEqual(b.symlinks, a.symlinks);
  assert.deepEqual(b.skipped, a.skipped);
  // The manifest and the ready marker are each capture's own, written when it commits.
  const own = [MANIFEST_FILE, READY_MARKER];
  const [sa, sb] = [await snapshot(withStatx, own), await snapshot(without, own)];
  assert.deepEqual([...sb.keys()].sort(), [...sa.keys()].sort());
  for (const [rel, e] of sa) {
    const other = sb.get(rel);
    assert.equal(other?.mtimeNs, e.mtimeNs, `${rel} mtime`);
    // The first capture's listing and readlink move a folder's or a symlink's atime; a file is
    // read with O_NOATIME.
    if (e.kind === "file") assert.equal(other?.atimeNs, e.atimeNs, `${rel} atime`);
  }
});
