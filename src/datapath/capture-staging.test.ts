// What a capture checks and clears before it copies anything: its arguments, staging directories
// a dead run left behind, and a destination that is already there.
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdir, readdir, symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { MANIFEST_FILE, READY_MARKER } from "../core/contract.js";
import { AlreadyCapturedError, capture, checkParallel } from "./capture.js";
import { tempDir } from "../../test/support/datapath.js";

/** A pid that is certainly not running: one that has just exited. */
function deadPid(): number {
  const r = spawnSync(process.execPath, ["-e", "process.stdout.write(String(process.pid))"], {
    encoding: "utf8",
  });
  return Number(r.stdout);
}

async function source(dir: string): Promise<string> {
  const src = join(dir, "src");
  await mkdir(join(src, "model"), { recursive: true });
  await writeFile(join(src, "model", "w.bin"), "weights");
  return src;
}

void test("arguments are checked before anything is touched", async (t) => {
  const dir = tempDir(t);
  const src = await source(dir);
  assert.equal(checkParallel(256), 256);
  for (const bad of [0, 257, 1.5, Number.NaN])
    assert.throws(() => checkParallel(bad, "--parallel"), /--parallel must be an integer from 1 to 256/);
  await assert.rejects(
    capture({ src, dest: join(dir, "d"), parallel: 0, progress: false }),
    /parallel must be/,
  );
  await assert.rejects(
    capture({ src, dest: join(dir, "d"), deadlineMs: -1, progress: false }),
    /deadlineMs must be 0 or more, got -1/,
  );
  await assert.rejects(
    capture({ src: join(dir, "missing"), dest: join(dir, "d"), progress: false }),
    /cannot capture .*missing: no such directory/,
  );
  await assert.rejects(
    capture({ src, dest: join(src, "inside"), progress: false }),
    /destination .*src\/inside is inside the source/,
  );
  await assert.rejects(
    capture({ src, dest: dir, progress: false }),
    /source .*src is inside the destination/,
  );
  assert.deepEqual((await readdir(dir)).sort(), ["src"], "nothing created");
});

void test("staging left by a dead run, or by this pid in an earlier container, is removed; a live run's is kept", async (t) => {
  const dir = tempDir(t);
  const src = await source(dir);
  const dead = join(dir, `h1.tmp-${deadPid()}-abc123`);
  const reused = join(dir, `h1.tmp-${process.pid}-def456`);
  const live = join(dir, `h1.tmp-${process.ppid}-0a0b0c`);
  const notOurs = [join(dir, "h1.tmp-notapid-abc"), join(dir, "h1.tmp-1-XYZ"), join(dir, "h2.tmp-1-abc")];
  for (const d of [dead, reused, live, ...notOurs]) await mkdir(d);

  await capture({ src, dest: join(dir, "h1"), progress: false });
  assert.ok(!existsSync(dead), "a dead pid's staging is removed");
  assert.ok(!existsSync(reused), "our own pid's, not being written now, is removed");
  assert.ok(existsSync(live), "a running process's staging is left alone");
  for (const d of notOurs) assert.ok(existsSync(d), `${d} does not match the staging pattern of h1`);
});

void test("a destination that is a file, a foreign folder, or a committed capture is refused and left as it is", async (t) => {
  const dir = tempDir(t);
  const src = await source(dir);

  const file = join(dir, "file");
  await writeFile(file, "x");
  await assert.rejects(capture({ src, dest: file, progress: false }), /exists and is not a directory/);

  const link = join(dir, "link");
  await symlink(src, link);
  await assert.rejects(capture({ src, dest: link, progress: false }), /exists and is not a directory/);

  const foreign = join(dir, "foreign");
  await mkdir(foreign);
  await writeFile(join(foreign, "data"), "mine");
  await assert.rejects(capture({ src, dest: foreign, progress: false }), /exists and is not a capture/);
  assert.deepEqual(await readdir(foreign), ["data"]);

  const done = join(dir, "done");
  await mkdir(done);
  await writeFile(join(done, READY_MARKER), "{}\n");
  await writeFile(join(done, MANIFEST_FILE), "not json");
  await assert.rejects(
    capture({ src, dest: done, progress: false }),
    (err: unknown) => err instanceof AlreadyCapturedError && err.manifest === undefined,
  );
  assert.deepEqual((await readdir(done)).sort(), [READY_MARKER, MANIFEST_FILE].sort());

  const empty = join(dir, "empty");
  await mkdir(empty);
  const m = await capture({ src, dest: empty, progress: false, hash: "h" });
  assert.equal(m.hash, "h", "an empty folder is taken");
});
