import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { chmod, mkdir, symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { ENV_PREWARM } from "../core/contract.js";
import { prewarm } from "./prewarm.js";
import { canSwitchUid, runCli, tempDir } from "../../test/support/datapath.js";

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

void test("prewarm reads every byte of every file once", async (t) => {
  const dir = tempDir(t);
  const total = await tree(dir, 20, (i) => (i === 0 ? 9 * 1024 * 1024 + 3 : 1000 * i));
  const r = await prewarm({ dir, parallel: 4, chunkBytes: 1 << 20 });
  assert.equal(r.skipped, false);
  assert.equal(r.files, 20);
  assert.equal(r.bytes, total);
  assert.equal(r.errorCount, 0);
  assert.ok(r.peakReaders >= 1 && r.peakReaders <= 4);
});

void test("prewarm respects its parallelism: exactly P readers at once", async (t) => {
  const dir = tempDir(t);
  await tree(dir, 24, () => 4096);
  // Each reader holds each file 80 ms (about 0.6 s of work each), so all three overlap even if
  // one starts late on a busy machine.
  const three = await prewarm({ dir, parallel: 3, holdMs: 80 });
  assert.equal(three.peakReaders, 3);
  assert.equal(three.files, 24);
  const one = await prewarm({ dir, parallel: 1, holdMs: 2 });
  assert.equal(one.peakReaders, 1);
  assert.equal(one.files, 24);
});

void test("prewarm is best effort: read errors are counted and reported, and it still resolves", async (t) => {
  const dir = tempDir(t);
  const missing = await prewarm({ dir: join(dir, "no-such-dir") });
  assert.equal(missing.files, 0);
  assert.equal(missing.errorCount, 1);
  assert.match(missing.errors[0] ?? "", /no-such-dir: ENOENT/);

  // Unreadable files need a UID without root's read-anything power.
  const uid = canSwitchUid() ? 12345 : process.getuid?.() === 0 ? undefined : process.getuid?.();
  if (uid === undefined) return t.skip("running as root without setpriv: cannot make a file unreadable");
  await tree(dir, 4, () => 2048);
  for (const f of ["d0/e0/f0", "d1/e1/f1"]) await chmod(join(dir, f), 0o000);
  const r = runCli(["prewarm", dir, "--parallel", "2"], { uid: canSwitchUid() ? uid : undefined });
  assert.equal(r.status, 0, "read errors never fail the command");
  assert.match(
    r.stdout,
    /^prewarm: 2 files, 0\.0 MB in [\d.]+ s \(\d+ MB\/s, 2 readers\), 2 read errors \(first: .*f[01]: EACCES.*\)\n$/,
  );
});

void test("prewarm skips on --skip, on the env var at 0, and follows --default when it is unset", async (t) => {
  const dir = tempDir(t);
  await tree(dir, 3, () => 100);
  const off = await prewarm({ dir, respectEnv: ENV_PREWARM, env: { [ENV_PREWARM]: "0" } });
  assert.deepEqual([off.skipped, off.reason, off.files], [true, `${ENV_PREWARM}=0`, 0]);
  const on = await prewarm({ dir, respectEnv: ENV_PREWARM, env: { [ENV_PREWARM]: "1" }, defaultOn: false });
  assert.deepEqual([on.skipped, on.files], [false, 3]);
  const unset = await prewarm({ dir, respectEnv: ENV_PREWARM, env: {}, defaultOn: false });
  assert.deepEqual([unset.skipped, unset.reason], [true, `${ENV_PREWARM} unset, default off`]);
  assert.equal((await prewarm({ dir, skip: true })).reason, "--skip given");

  const cli = runCli(["prewarm", dir, "--respect-env", ENV_PREWARM], { env: { [ENV_PREWARM]: "0" } });
  assert.deepEqual([cli.status, cli.stdout], [0, `prewarm skipped (${ENV_PREWARM}=0)\n`]);
  const skip = runCli(["prewarm", dir, "--skip"]);
  assert.deepEqual([skip.status, skip.stdout], [0, "prewarm skipped (--skip given)\n"]);
  const ran = runCli(["prewarm", dir, "--respect-env", ENV_PREWARM], { env: { [ENV_PREWARM]: "" } });
  assert.match(ran.stdout, /^prewarm: 3 files, 0\.0 MB .*, 0 errors\n$/);
  const bad = runCli(["prewarm", dir, "--parallel", "many"]);
  assert.deepEqual(
    [bad.status, bad.stderr],
    [1, 'warmstart: --parallel must be an integer from 1 to 256, got "many"\n'],
  );
});
