import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { runningLocalCluster } from "./local-defaults.js";

void test("a local cluster counts only while every process it recorded is alive", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "warmstart-local-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const stat = await readFile(`/proc/${process.pid}/stat`, "utf8");
  const me = {
    name: "me",
    pid: process.pid,
    log: "x",
    startTime: stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19],
  };
  const state = (processes: unknown[]): string =>
    JSON.stringify({
      running: true,
      kubeconfig: "/abs/kubeconfig",
      roles: { controlPlane: "http://127.0.0.1:1234", server: "http://127.0.0.1:4321" },
      processes,
      extra: "ignored",
    });

  assert.equal(await runningLocalCluster(dir), undefined, "no state file");
  await writeFile(join(dir, "state.json"), state([me]));
  assert.deepEqual(await runningLocalCluster(dir), {
    stateDir: dir,
    kubeconfig: "/abs/kubeconfig",
    controlPlaneUrl: "http://127.0.0.1:1234",
    serverUrl: "http://127.0.0.1:4321",
    operatorTokenFile: join(dir, "control-plane", "operator-token"),
  });
  // The same pid with another start time is a reused pid, not the cluster's process.
  await writeFile(join(dir, "state.json"), state([me, { ...me, startTime: "1" }]));
  assert.equal(await runningLocalCluster(dir), undefined);
  await writeFile(join(dir, "state.json"), "{ not json");
  assert.equal(await runningLocalCluster(dir), undefined);
});

void test("no product file imports the development tools (the lint rule says the same)", async () => {
  const { readdir } = await import("node:fs/promises");
  const src = fileURLToPath(new URL("../../../src/", import.meta.url));
  const offenders: string[] = [];
  let scanned = 0;
  const files = await readdir(src, { recursive: true });
  for (const f of files.filter((x) => x.endsWith(".ts"))) {
    scanned++;
    const text = await readFile(join(src, f), "utf8");
    if (/(from\s+|import\s*\(\s*)["'][^"']*\/(tools|localcluster|demo)\//.test(text)) offenders.push(f);
  }
  assert.ok(scanned > 50, `scanned the sources (${scanned} files)`);
  assert.deepEqual(offenders, []);
});
