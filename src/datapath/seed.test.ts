import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import { chmod, lstat, mkdir, readFile, readlink, realpath, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { MANIFEST_FILE, READY_MARKER } from "../core/contract.js";
import { capture } from "./capture.js";
import { usedInPlace } from "./in-place.js";
import { seed } from "./seed.js";
import {
  BLOB_BIG,
  BLOB_SMALL,
  canSwitchUid,
  KERNEL,
  KERNEL_META,
  LINK_A,
  LOCK,
  makeCacheTree,
  REF_MAIN,
  runCli,
  SNAP_WEIGHTS,
  tempDir,
  TOP,
  type CacheTree,
} from "../../test/support/datapath.js";

const UID = 12345;

/** A captured tree made read-only (no write bit anywhere), as the volume a restore mounts. */
async function readOnlyCapture(dir: string): Promise<{ ro: string; tree: CacheTree }> {
  const tree = await makeCacheTree(join(dir, "src"));
  const ro = join(dir, "ro");
  await capture({ src: join(dir, "src"), dest: ro, progress: false });
  assert.equal(spawnSync("chmod", ["-R", "a-w", ro]).status, 0);
  return { ro: await realpath(ro), tree };
}

void test("which files are used in place and which are copied", () => {
  assert.equal(usedInPlace(BLOB_BIG), true);
  assert.equal(usedInPlace(SNAP_WEIGHTS), true);
  assert.equal(usedInPlace(REF_MAIN), false, "refs are written by the hub");
  assert.equal(usedInPlace(LOCK), false, ".locks are written by the hub");
  assert.equal(usedInPlace(KERNEL), false, "compile caches are copied");
  assert.equal(usedInPlace(TOP), false);
  assert.equal(usedInPlace("modelx/file"), false);
  assert.equal(
    usedInPlace("model/at/mnt/models/model.safetensors"),
    true,
    "a storage initializer's folder is used in place",
  );
  assert.equal(
    usedInPlace("model/at/mnt/models/.cache/huggingface/download/model.safetensors.metadata"),
    false,
    "a local folder's download metadata is rewritten by the hub client",
  );
  assert.equal(usedInPlace("model/at/mnt/models/.cache/huggingface/download/model.safetensors.lock"), false);
});

void test("seed links model files in place and copies compile caches with their times (as a non-root UID)", async (t) => {
  const dir = tempDir(t);
  const { ro, tree } = await readOnlyCapture(dir);
  const shadowParent = join(dir, "pod");
  await mkdir(shadowParent, { mode: 0o777 });
  await chmod(shadowParent, 0o777);
  const shadow = join(shadowParent, "cache-root");

  // Root in the test: seed as a plain UID so nothing can lean on root's powers. Not root: as is.
  const uid = canSwitchUid() ? UID : undefined;
  if (process.getuid?.() === 0 && uid === undefined) t.diagnostic("setpriv unavailable: seeding as root");
  const r = runCli(["seed", "--from", ro, "--to", shadow], { uid });
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /2 model files linked in place, 7 files copied/);
  if (uid !== undefined)
    assert.equal((await lstat(join(shadow, KERNEL))).uid, UID, "the shadow belongs to the pod's UID");

  // Model data: symlinks into the read-only tree, never copies.
  for (const rel of [BLOB_BIG, BLOB_SMALL]) {
    assert.ok((await lstat(join(shadow, rel))).isSymbolicLink(), rel);
    assert.equal(await readlink(join(shadow, rel)), join(ro, rel));
    assert.ok((await readFile(join(shadow, rel))).equals(tree.files.get(rel) as Buffer));
  }
  assert.equal(
    await readlink(join(shadow, SNAP_WEIGHTS)),
    "../../blobs/aaaa",
    "the hub's own links as they are",
  );
  assert.ok((await readFile(join(shadow, SNAP_WEIGHTS))).equals(tree.files.get(BLOB_BIG) as Buffer));

  // Compile caches, refs and .locks: real files with the captured nanosecond times.
  for (const rel of [KERNEL, KERNEL_META, LINK_A, REF_MAIN, LOCK, TOP]) {
    const st = await lstat(join(shadow, rel), { bigint: true });
    assert.ok(st.isFile(), `${rel} is a real file`);
    assert.ok((await readFile(join(shadow, rel))).equals(tree.files.get(rel) as Buffer), `${rel} content`);
    const want = tree.expected.get(rel);
    assert.equal(st.mtimeNs, want?.mtimeNs, `${rel} mtime`);
    assert.equal(st.atimeNs, want?.atimeNs, `${rel} atime`);
  }

  // Engines write next to the model and into caches: as the same UID, every write must work.
  const writes = `
    const fs = require("node:fs"); const s = ${JSON.stringify(shadow)};
    fs.writeFileSync(s + "/${REF_MAIN}", "rev2");
    fs.writeFileSync(s + "/${LOCK}", "locked");
    fs.writeFileSync(s + "/model/hub/.locks/models--org--m/new.lock", "");
    fs.writeFileSync(s + "/model/hub/models--org--m/snapshots/rev1/tokenizer.json", "{}");
    fs.mkdirSync(s + "/model/hub/models--org--x/blobs", { recursive: true });
    fs.appendFileSync(s + "/${KERNEL_META}", "more");
    fs.writeFileSync(s + "/cache/triton/new-kernel", "x");
    fs.writeFileSync(s + "/cache/empty/first", "x");
    fs.writeFileSync(s + "/brand-new-at-root", "x");`;
  const argv = uid === undefined ? [] : ["setpriv", `--reuid=${uid}`, `--regid=${uid}`, "--clear-groups"];
  const w = spawnSync(
    argv[0] ?? process.execPath,
    [...argv.slice(1), ...(argv.length ? [process.execPath] : []), "-e", writes],
    {
      encoding: "utf8",
    },
  );
  assert.equal(w.status, 0, w.stderr);
  assert.equal(await readFile(join(ro, REF_MAIN), "utf8"), "rev1", "the read-only tree is untouched");

  // Twice is fine: what is there (including the engine's writes) is kept.
  const again = runCli(["seed", "--from", ro, "--to", shadow], { uid });
  assert.equal(again.status, 0, again.stderr);
  assert.match(again.stdout, /0 model files linked in place, 0 files copied .* 11 kept/);
  assert.equal(await readFile(join(shadow, REF_MAIN), "utf8"), "rev2");
});

void test("seed refuses a tree without the ready marker, with one line", async (t) => {
  const dir = tempDir(t);
  await makeCacheTree(join(dir, "src"));
  await capture({ src: join(dir, "src"), dest: join(dir, "ro"), progress: false });
  await rm(join(dir, "ro", READY_MARKER));
  await assert.rejects(
    seed({ from: join(dir, "ro"), to: join(dir, "shadow") }),
    /has no \.warmstart-ready: the capture is not complete/,
  );
  const r = runCli(["seed", "--from", join(dir, "ro"), "--to", join(dir, "shadow")]);
  assert.equal(r.status, 1);
  assert.match(r.stderr, /^warmstart: .*has no \.warmstart-ready.*\n$/);
  assert.ok(!existsSync(join(dir, "shadow", "cache")), "nothing seeded");
});

void test("seed in-process: counts, and a stale link to elsewhere is replaced", async (t) => {
  const dir = tempDir(t);
  const { ro } = await readOnlyCapture(dir);
  const shadow = join(dir, "shadow");
  const first = await seed({ from: ro, to: shadow });
  assert.deepEqual(first, {
    linked: 2,
    copied: 7,
    bytesCopied: 16_023,
    dirs: 15,
    symlinks: 2,
    kept: 0,
    replaced: 0,
  });
  await rm(join(shadow, BLOB_SMALL));
  await writeFile(join(dir, "elsewhere"), "x");
  const { symlink } = await import("node:fs/promises");
  await symlink(join(dir, "elsewhere"), join(shadow, BLOB_SMALL));
  const second = await seed({ from: ro, to: shadow });
  assert.equal(second.linked, 1);
  assert.equal(await readlink(join(shadow, BLOB_SMALL)), join(ro, BLOB_SMALL));
});

void test("seed refuses a tree whose manifest is not the one the cache's record names, and seeds the one it names", async (t) => {
  const dir = tempDir(t);
  const { ro } = await readOnlyCapture(dir);
  const digest = createHash("sha256")
    .update(await readFile(join(ro, MANIFEST_FILE)))
    .digest("hex");
  const shadow = join(dir, "shadow");
  await assert.rejects(
    seed({ from: ro, to: shadow, manifestDigest: "0".repeat(64) }),
    /not the one the cache's record names/,
  );
  assert.equal(existsSync(join(shadow, BLOB_SMALL)), false, "nothing seeded");
  const r = runCli(["seed", "--from", ro, "--to", shadow, "--manifest-digest", "f".repeat(64)]);
  assert.notEqual(r.status, 0, "the command refuses it too");
  assert.match(r.stderr, /not the one the cache's record names/);
  assert.equal((await seed({ from: ro, to: shadow, manifestDigest: digest })).linked, 2);
});

void test("--any-uid: a workload running as another UID than the seed's writes its caches and beside the model", async (t) => {
  if (!canSwitchUid()) {
    t.skip("needs root and setpriv to run as two UIDs");
    return;
  }
  const dir = tempDir(t);
  const { ro } = await readOnlyCapture(dir);
  const seedAs = UID;
  const workload = UID + 1;
  const sh = (uid: number, script: string): number | null =>
    spawnSync("setpriv", [`--reuid=${uid}`, `--regid=${uid}`, "--clear-groups", "sh", "-c", script]).status;
  for (const anyUid of [false, true]) {
    const parent = join(dir, `pod-${anyUid}`);
    await mkdir(parent, { mode: 0o777 });
    await chmod(parent, 0o777); // as the kubelet makes an emptyDir
    const shadow = join(parent, "cache-root");
    const r = runCli(["seed", "--from", ro, "--to", shadow, ...(anyUid ? ["--any-uid"] : [])], {
      uid: seedAs,
    });
    assert.equal(r.status, 0, r.stderr);
    const kernel = join(shadow, KERNEL);
    const lockDir = join(shadow, LOCK, "..");
    const writes = [
      `echo more >> '${kernel}'`,
      `touch '${lockDir}/new.lock'`,
      `touch '${join(shadow, "cache", "new")}'`,
    ];
    for (const w of writes) {
      const status = sh(workload, w);
      if (anyUid) assert.equal(status, 0, `with --any-uid, UID ${workload} can: ${w}`);
      else assert.notEqual(status, 0, `without it, UID ${workload} cannot: ${w}`);
    }
  }
});
