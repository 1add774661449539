import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { localStateDir, runningLocalCluster } from "./local-defaults.js";
import { stateDir } from "../localcluster/versions.js";

void test("the lookup finds the state folder where the local cluster keeps it", () => {
  const saved = { ...process.env };
  try {
    for (const env of [
      { WARMSTART_STATE_DIR: "/tmp/some-state", XDG_STATE_HOME: undefined },
      { WARMSTART_STATE_DIR: undefined, XDG_STATE_HOME: "/tmp/xdg" },
      { WARMSTART_STATE_DIR: undefined, XDG_STATE_HOME: undefined },
    ]) {
      for (const [k, v] of Object.entries(env)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
      assert.equal(localStateDir(), stateDir());
    }
  } finally {
    process.env = saved;
  }
});

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

void test("no role imports the local-cluster tooling (the lint rule says the same)", async () => {
  const { readdir } = await import("node:fs/promises");
  const src = fileURLToPath(new URL("../../../src/", import.meta.url));
  const roles = [
    "webhook",
    "server",
    "node-agent",
    "cluster-agent",
    "control-plane",
    "promote",
    "datapath",
    "core",
    "common",
  ];
  const offenders: string[] = [];
  let scanned = 0;
  for (const role of roles) {
    const files = await readdir(join(src, role), { recursive: true }).catch(() => [] as string[]);
    for (const f of files.filter((x) => x.endsWith(".ts") && !x.endsWith(".test.ts"))) {
      scanned++;
      const text = await readFile(join(src, role, f), "utf8");
      if (/(from\s+|import\s*\(\s*)["'][^"']*\/localcluster\//.test(text)) offenders.push(`${role}/${f}`);
    }
  }
  assert.ok(scanned > 50, `scanned the sources (${scanned} files)`);
  assert.deepEqual(offenders, []);
});
