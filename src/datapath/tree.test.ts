import assert from "node:assert/strict";
import { closeSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { openDirNoFollow, readlinkAt } from "./beneath.js";
import { staysInside } from "./tree.js";

const none = new Map<string, string>();

void test("symlinks that stay inside the tree", () => {
  assert.ok(staysInside("model/hub/m/snapshots/r/w", "../../blobs/b", none), "the hub's snapshot links");
  assert.ok(staysInside("a", "b", none));
  assert.ok(staysInside("a/b/l", "../../c", none), "up to the root and back down");
  assert.ok(staysInside("a/l", "./x/../y", none));
  assert.ok(staysInside("a/b/c/root", "../../..", none), "the root itself is inside");
  // A cycle never resolves, so it never reaches outside.
  assert.ok(
    staysInside(
      "x",
      "y",
      new Map([
        ["x", "y"],
        ["y", "x"],
      ]),
    ),
  );
});

void test("symlinks that escape the tree", () => {
  assert.equal(staysInside("a", "/etc/passwd", none), false, "absolute");
  assert.equal(staysInside("a", "/", none), false);
  assert.equal(staysInside("l", "..", none), false);
  assert.equal(staysInside("a/b/l", "../../../x", none), false, "../ past the root");
  assert.equal(staysInside("a/l", "b/../../../x", none), false);
  // Lexically inside, but `root` is a link to the root, so `root/..` is the root's parent.
  const links = new Map([["a/b/c/root", "../../.."]]);
  assert.equal(staysInside("a/b/c/esc", "root/..", links), false, "chained through an in-tree link");
  // Through an in-tree link that is itself absolute.
  assert.equal(staysInside("x", "abs/file", new Map([["abs", "/data"]])), false);
  // Into a link that escapes further down the chain.
  assert.equal(
    staysInside(
      "p",
      "q",
      new Map([
        ["q", "r"],
        ["r", "../.."],
      ]),
    ),
    false,
  );
});

void test("a symlink replaced by a file before its link is read is told apart (EINVAL), not an error", (t) => {
  const dir = mkdtempSync(join(tmpdir(), "ws-tree-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  symlinkSync("target", join(dir, "link"));
  writeFileSync(join(dir, "file"), "x");
  const fd = openDirNoFollow(dir);
  try {
    assert.equal(readlinkAt(fd, "link"), "target");
    // What the walk meets when the pod swaps a link for a file between its lstat and its readlink.
    assert.equal(readlinkAt(fd, "file"), undefined);
    assert.throws(() => readlinkAt(fd, "missing"), /ENOENT/, "a name gone is still the walk's to judge");
  } finally {
    closeSync(fd);
  }
});
