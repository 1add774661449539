import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { chmod, lstat, mkdir, readFile, stat, symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { READY_MARKER, type SeedOutcome } from "../core/contract.js";
import { isReady, waitForFill, waitForReady, writeReadyMarker } from "./ready.js";
import { capture } from "./capture.js";
import {
  canSwitchUid,
  makeCacheTree,
  runCli,
  SNAP_WEIGHTS,
  tempDir,
  WARMSTART_BIN,
} from "../../test/support/datapath.js";

void test("waitForReady times out when the marker never comes", async (t) => {
  const dir = tempDir(t);
  const start = Date.now();
  await assert.rejects(
    waitForReady(dir, 300, { intervalMs: 50 }),
    /^Error: timed out after 0s waiting for .*\.warmstart-ready$/,
  );
  assert.ok(Date.now() - start >= 290, "waited the whole timeout");
});

void test("waitForReady returns once the marker appears", async (t) => {
  const dir = tempDir(t);
  const start = Date.now();
  const waiting = waitForReady(dir, 10_000, { intervalMs: 20 });
  await sleep(200);
  assert.equal(await isReady(dir), false);
  await writeReadyMarker(dir, "{}\n");
  await waiting;
  const took = Date.now() - start;
  assert.ok(took >= 200 && took < 5000, `returned after ${took} ms`);
  await assert.rejects(writeReadyMarker(dir, "{}\n"), /EEXIST/, "a marker is written once");
});

void test("waitForReady stops when aborted", async (t) => {
  const dir = tempDir(t);
  const ac = new AbortController();
  const waiting = waitForReady(dir, 0, { intervalMs: 1000, signal: ac.signal });
  ac.abort();
  await assert.rejects(waiting, /stopped waiting/);
});

void test("the wait-ready command: non-zero on timeout, zero when the marker appears", async (t) => {
  const dir = tempDir(t);
  const late = runCli(["wait-ready", dir, "--timeout", "1"]);
  assert.equal(late.status, 1);
  assert.equal(late.stderr, `warmstart: timed out after 1s waiting for ${dir}/${READY_MARKER}\n`);
  const bad = runCli(["wait-ready", dir, "--timeout", "soon"]);
  assert.equal(bad.status, 1);
  assert.match(bad.stderr, /^warmstart: --timeout must be an integer/);

  const child = spawn(process.execPath, [WARMSTART_BIN, "wait-ready", dir, "--timeout", "30"], {
    stdio: "pipe",
  });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.on("exit", resolve));
  await sleep(1500);
  await writeFile(join(dir, READY_MARKER), "{}");
  assert.equal(await exited, 0);
  assert.equal(out, `${dir} is ready\n`);
});

// A waiting follower's seed (SPEC 1.3 "Groups and gangs"): its volume is filled by its node's
// agent, or gets the agent's cold marker, or nothing comes before its deadline.
void test("waitForFill: the filled tree, the agent's cold marker, or the deadline", async (t) => {
  const vol = tempDir(t);
  const tree = join(vol, "tree");
  const marker = join(vol, ".warmstart-cold");
  const soon = Date.now() + 10_000;
  const filled = waitForFill(tree, marker, soon, { intervalMs: 20 });
  await sleep(100);
  await mkdir(tree);
  await writeReadyMarker(tree, "{}\n");
  assert.equal((await filled).kind, "ready");

  const vol2 = tempDir(t);
  const cold = waitForFill(join(vol2, "tree"), join(vol2, ".warmstart-cold"), soon, { intervalMs: 20 });
  await writeFile(join(vol2, ".warmstart-cold"), "the election of cache x failed\n");
  assert.deepEqual(
    { ...(await cold), waitedMs: 0 },
    { kind: "cold", reason: "the election of cache x failed", waitedMs: 0 },
  );

  const start = Date.now();
  const late = await waitForFill(join(vol2, "none"), join(vol2, "no-marker"), Date.now() + 300, {
    intervalMs: 20,
  });
  assert.equal(late.kind, "cold");
  assert.match(late.kind === "cold" ? late.reason : "", /no cache within the wait deadline/);
  assert.ok(Date.now() - start >= 290, "waited until the deadline");
});

void test("attacker: a cold marker that is a symlink or a FIFO is not followed or opened to block; the pod starts cold", async (t) => {
  const vol = tempDir(t);
  await writeFile(join(vol, "secret"), "not a reason");
  await symlink(join(vol, "secret"), join(vol, ".warmstart-cold"));
  const r = await waitForFill(join(vol, "tree"), join(vol, ".warmstart-cold"), Date.now() + 5000, {
    intervalMs: 20,
  });
  assert.equal(r.kind, "cold");
  assert.doesNotMatch(r.kind === "cold" ? r.reason : "", /not a reason/);
  const vol2 = tempDir(t);
  assert.equal(spawnSync("mkfifo", [join(vol2, ".warmstart-cold")]).status, 0);
  const f = await waitForFill(join(vol2, "tree"), join(vol2, ".warmstart-cold"), Date.now() + 5000, {
    intervalMs: 20,
  });
  assert.equal(f.kind, "cold", "answered at once, not blocked on the FIFO");
});

void test("seed --fill-until: a filled tree is seeded and the outcome reported; past the deadline the shadow is made and the pod starts cold", async (t) => {
  const dir = tempDir(t);
  const src = join(dir, "src");
  await makeCacheTree(src);
  const vol = join(dir, "vol");
  await mkdir(vol);
  const hash = "e".repeat(64);
  // What the node agent does: a capture of the committed tree into the pod's fill volume.
  await capture({ src, dest: join(vol, "tree"), hash, durable: false, progress: false });
  const outcome = join(dir, "outcome");
  const until = new Date(Date.now() + 60_000).toISOString();
  const ok = runCli([
    "seed",
    "--from",
    join(vol, "tree"),
    "--to",
    join(dir, "shadow"),
    "--hash",
    hash,
    "--fill-until",
    until,
    "--cold-marker",
    join(vol, ".warmstart-cold"),
    "--outcome-file",
    outcome,
  ]);
  assert.equal(ok.status, 0, ok.stderr);
  assert.match(ok.stdout, /filled after \d+s[\s\S]*seeded/);
  assert.equal((JSON.parse(await readFile(outcome, "utf8")) as SeedOutcome).outcome, "restored");
  assert.ok((await lstat(join(dir, "shadow", SNAP_WEIGHTS))).isSymbolicLink(), "the model is used in place");

  const past = runCli([
    "seed",
    "--from",
    join(dir, "none", "tree"),
    "--to",
    join(dir, "shadow2"),
    "--hash",
    hash,
    "--fill-until",
    new Date(Date.now() - 1000).toISOString(),
    "--cold-marker",
    join(dir, "none", "m"),
    "--outcome-file",
    outcome,
    "--any-uid",
  ]);
  assert.equal(past.status, 0, past.stderr);
  assert.match(past.stdout, /starting cold after 0s: no cache within the wait deadline/);
  assert.equal((JSON.parse(await readFile(outcome, "utf8")) as SeedOutcome).outcome, "cold");
  assert.equal((await stat(join(dir, "shadow2"))).mode & 0o777, 0o777, "the engine's cache root, writable");
  const bad = runCli(["seed", "--from", "x", "--to", "y", "--fill-until", "soon", "--cold-marker", "m"]);
  assert.notEqual(bad.status, 0);
  assert.match(bad.stderr, /--fill-until must be an ISO 8601 time/);
});

void test("seed --fill-until going cold as a non-root UID leaves the kubelet's 0777 shadow as it is", async (t) => {
  if (!canSwitchUid()) return t.skip("needs root and setpriv to run as another UID");
  const dir = tempDir(t);
  const shadow = join(dir, "shadow");
  // As the kubelet makes an emptyDir: owned by root, open to all.
  await mkdir(shadow);
  await chmod(shadow, 0o777);
  await chmod(dir, 0o755);
  const r = runCli(
    [
      "seed",
      "--from",
      join(dir, "fill", "tree"),
      "--to",
      shadow,
      "--hash",
      "e".repeat(64),
      "--fill-until",
      new Date(Date.now() - 1).toISOString(),
      "--cold-marker",
      join(dir, "fill", "m"),
      "--any-uid",
    ],
    { uid: 1000 },
  );
  assert.equal(r.status, 0, r.stderr);
  assert.match(r.stdout, /starting cold/);
});
