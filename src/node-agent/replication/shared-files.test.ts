import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { SharedFiles } from "./shared-files.js";

void test("chunks in flight together share one open file, closed with the last of them; a failed open is tried again", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), "shared-files-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, "shard");
  writeFileSync(path, Buffer.alloc(8));
  const files = new SharedFiles();
  const [one, two] = await Promise.all([files.acquire(0, path), files.acquire(0, path)]);
  assert.equal(one, two, "one handle for both");
  assert.equal(files.openCount, 1);
  await one.write(Buffer.from("ab"), 0, 2, 0);
  await files.release(0);
  await two.write(Buffer.from("cd"), 0, 2, 6); // still open for the second chunk
  await files.release(0);
  assert.equal(files.openCount, 0);
  await assert.rejects(two.write(Buffer.from("x"), 0, 1, 3), /closed/i, "closed with the last chunk");
  assert.equal(readFileSync(path, "latin1"), "ab\0\0\0\0cd");

  const later = join(dir, "later");
  await assert.rejects(files.acquire(1, later), { code: "ENOENT" });
  assert.equal(files.openCount, 0, "the failure is not kept");
  writeFileSync(later, "z");
  const fh = await files.acquire(1, later);
  assert.equal((await fh.stat()).size, 1);
  await files.release(1);
});
