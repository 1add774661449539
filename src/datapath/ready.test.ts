import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { READY_MARKER } from "../core/contract.js";
import { isReady, waitForReady, writeReadyMarker } from "./ready.js";
import { runCli, tempDir, WARMSTART_BIN } from "../../test/support/datapath.js";

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
