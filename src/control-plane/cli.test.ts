import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { chmod, mkdir, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import type { ClusterView, RequestView } from "./api.js";
import {
  OPERATOR_TOKEN,
  clusterToken,
  registerAgent,
  startHarness,
} from "../../test/support/control-plane.js";
import { clusterTokenEntries } from "./cli.js";

const BIN = fileURLToPath(new URL("../../../bin/warmstart", import.meta.url));

async function procStartTime(pid: number): Promise<string> {
  const stat = await readFile(`/proc/${pid}/stat`, "utf8");
  return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19]!;
}

/** Runs the real command (asynchronously: the server under test lives in this process). */
async function warmstart(
  args: string[],
  env: NodeJS.ProcessEnv = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  // A private state dir: no local cluster's URL or token leaks in; unset env so flags are tested.
  const base: NodeJS.ProcessEnv = { ...process.env, WARMSTART_LOG_FORMAT: "json", LOG_LEVEL: "warn" };
  delete base.WARMSTART_CONTROL_PLANE_URL;
  delete base.WARMSTART_OPERATOR_TOKEN;
  delete base.WARMSTART_CLUSTER_TOKENS;
  delete base.WARMSTART_CLUSTER_TOKEN_FILE;
  delete base.WARMSTART_CONTROL_PLANE_CA_FILE;
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, [BIN, ...args], {
      env: { ...base, ...env },
      timeout: 30_000,
    });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code?: number; stdout?: string; stderr?: string };
    return { code: typeof e.code === "number" ? e.code : -1, stdout: e.stdout ?? "", stderr: e.stderr ?? "" };
  }
}

void test("submit, requests, clusters and terminate against a running control plane", async (t) => {
  const h = await startHarness(t);
  const stateDir = await mkdtemp(join(tmpdir(), "warmstart-cli-state-"));
  t.after(() => rm(stateDir, { recursive: true, force: true }));
  const env = { WARMSTART_STATE_DIR: stateDir };
  await registerAgent(h.cp.url, "alpha", [{ gpuType: "H100", count: 8 }]);
  const conn = ["--control-plane", h.cp.url, "--token", OPERATOR_TOKEN];

  const submitted = await warmstart(
    [
      "submit",
      "llama",
      "--model",
      "meta/llama-3",
      "--image",
      "vllm/vllm-openai:v0.9",
      "--replicas",
      "2",
      "--gpus",
      "2",
      "--gpu-type",
      "H100",
      "--namespace",
      "serving",
      ...conn,
      "--",
      "--model",
      "meta/llama-3",
      "--port",
      "8000",
    ],
    env,
  );
  assert.equal(submitted.code, 0, submitted.stderr);
  const id = submitted.stdout.trim();
  assert.match(id, /^[0-9a-f-]{36}$/, "prints the request id alone");

  const listed = await warmstart(["requests", "-o", "json", ...conn], env);
  assert.equal(listed.code, 0, listed.stderr);
  const requests = JSON.parse(listed.stdout) as RequestView[];
  assert.equal(requests.length, 1);
  assert.deepEqual(
    {
      id: requests[0]?.id,
      name: requests[0]?.name,
      namespace: requests[0]?.namespace,
      args: requests[0]?.args,
      replicas: requests[0]?.replicas,
      gpus: requests[0]?.gpus,
      status: requests[0]?.status,
      clusterId: requests[0]?.clusterId,
    },
    {
      id,
      name: "llama",
      namespace: "serving",
      args: ["--model", "meta/llama-3", "--port", "8000"],
      replicas: 2,
      gpus: 2,
      status: "Queued",
      clusterId: "alpha",
    },
  );

  // Env instead of flags; a table by default.
  const table = await warmstart(["requests"], {
    ...env,
    WARMSTART_CONTROL_PLANE_URL: h.cp.url,
    WARMSTART_OPERATOR_TOKEN: OPERATOR_TOKEN,
  });
  assert.equal(table.code, 0, table.stderr);
  assert.match(table.stdout, /STATUS/);
  assert.match(table.stdout, new RegExp(`${id}.*serving/llama.*2x2 H100.*alpha.*Queued.*0/2`));

  const clusters = await warmstart(["clusters", "-o", "json", ...conn], env);
  const parsed = JSON.parse(clusters.stdout) as ClusterView[];
  assert.deepEqual(
    parsed.map((c) => [c.clusterId, c.capacity, c.allocated, c.queueDepth.deploy]),
    [["alpha", 8, 4, 1]],
  );
  const clusterTable = await warmstart(["clusters", ...conn], env);
  assert.match(clusterTable.stdout, /alpha.*H100: 4\/8.*8.*4.*yes/);

  const terminated = await warmstart(["terminate", id, ...conn], env);
  assert.equal(terminated.code, 0, terminated.stderr);
  assert.equal(terminated.stdout.trim(), `${id} Terminated`, "never received by the cluster: done at once");

  // Bad input and missing settings end in one clear line and exit 1.
  const badName = await warmstart(["submit", "Bad_Name", "--model", "m", "--image", "i", ...conn], env);
  assert.equal(badName.code, 1);
  assert.match(badName.stderr, /^warmstart: .*400 invalid request body: name: must be a DNS-1123 label/m);
  const badNumber = await warmstart(
    ["submit", "x", "--model", "m", "--image", "i", "--replicas", "two", ...conn],
    env,
  );
  assert.notEqual(badNumber.code, 0);
  assert.match(badNumber.stderr, /--replicas must be an integer/);
  const noUrl = await warmstart(["requests", "--token", OPERATOR_TOKEN], env);
  assert.equal(noUrl.code, 1);
  assert.match(noUrl.stderr, /no control plane URL/);
  const noToken = await warmstart(["requests", "--control-plane", h.cp.url], env);
  assert.equal(noToken.code, 1);
  assert.match(noToken.stderr, /no operator token/);
  const badToken = await warmstart(["requests", "--control-plane", h.cp.url, "--token", "nope"], env);
  assert.equal(badToken.code, 1);
  assert.match(badToken.stderr, /401 unknown token/);
});

void test("the URL and token come from the local cluster's state when not given", async (t) => {
  const h = await startHarness(t);
  const stateDir = await mkdtemp(join(tmpdir(), "warmstart-cli-state-"));
  t.after(() => rm(stateDir, { recursive: true, force: true }));
  await mkdir(join(stateDir, "control-plane"), { recursive: true });
  await writeFile(join(stateDir, "control-plane", "operator-token"), `${OPERATOR_TOKEN}\n`);
  const state = (startTime: string): string =>
    JSON.stringify({
      running: true,
      kubeconfig: join(stateDir, "kubeconfig"),
      roles: { controlPlane: h.cp.url },
      // This test process stands for the cluster's processes.
      processes: [{ name: "apiserver", pid: process.pid, startTime, log: "x" }],
    });
  await writeFile(join(stateDir, "state.json"), state(await procStartTime(process.pid)));
  const r = await warmstart(["clusters", "-o", "json"], { WARMSTART_STATE_DIR: stateDir });
  assert.equal(r.code, 0, r.stderr);
  assert.deepEqual(JSON.parse(r.stdout), []);

  // A stopped cluster's state file is not a fallback.
  await writeFile(join(stateDir, "state.json"), state("1"));
  const stopped = await warmstart(["clusters", "-o", "json"], { WARMSTART_STATE_DIR: stateDir });
  assert.equal(stopped.code, 1);
  assert.match(stopped.stderr, /no control plane URL/);
});

void test("cluster tokens from flags: ID=TOKEN each, a bare token only with its cluster id", () => {
  assert.deepEqual(
    clusterTokenEntries(["east=token-of-the-east-0001", "west=token-of-the-west-0001=="], undefined),
    [
      { clusterId: "east", token: "token-of-the-east-0001" },
      { clusterId: "west", token: "token-of-the-west-0001==" },
    ],
  );
  assert.deepEqual(clusterTokenEntries(["a-bare-token-0000000000=="], "local"), [
    { clusterId: "local", token: "a-bare-token-0000000000==" },
  ]);
  assert.throws(() => clusterTokenEntries(["a-bare-token-0000000000"], undefined), /bound to one cluster/);
  assert.throws(() => clusterTokenEntries(["east=short"], undefined), /expected CLUSTER_ID=TOKEN/);
});

void test("warmstart control-plane serves, mints its token files owner-only, binds each cluster token to its cluster, and stops on SIGTERM", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "warmstart-cp-cli-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const bad = await warmstart([
    "control-plane",
    "--db",
    join(dir, "x.db"),
    "--port",
    "0",
    "--operator-token",
    OPERATOR_TOKEN,
  ]);
  assert.equal(bad.code, 1);
  assert.match(bad.stderr, /at least one cluster token is needed/);

  const secrets = join(dir, "secrets");
  const tokenFile = join(secrets, "operator-token");
  const clusterTokenFile = join(secrets, "cluster-tokens");
  // The operator mints a token for cluster "east" before the server starts.
  const minted = await warmstart([
    "control-plane",
    "cluster-token",
    "add",
    "east",
    "--cluster-token-file",
    clusterTokenFile,
  ]);
  assert.equal(minted.code, 0, minted.stderr);
  const eastToken = minted.stdout.trim();
  assert.match(eastToken, /^wsc_/);
  assert.equal((await stat(secrets)).mode & 0o777, 0o700, "a folder it creates is owner-only");
  assert.equal((await stat(clusterTokenFile)).mode & 0o777, 0o600, "the token file is owner-only");
  const again = await warmstart([
    "control-plane",
    "cluster-token",
    "add",
    "east",
    "--cluster-token-file",
    clusterTokenFile,
  ]);
  assert.equal(again.stdout.trim(), eastToken, "adding again keeps the token");

  const child = spawn(
    process.execPath,
    [
      BIN,
      "control-plane",
      "--db",
      join(dir, "db", "cp.db"),
      "--port",
      "0",
      "--operator-token-file",
      tokenFile,
      "--cluster-token-file",
      clusterTokenFile,
    ],
    {
      env: {
        ...process.env,
        WARMSTART_CLUSTER_TOKENS: `alpha=${clusterToken("alpha")}, beta=${clusterToken("beta")}`,
        WARMSTART_LOG_FORMAT: "json",
      },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  t.after(() => {
    if (child.exitCode === null) child.kill("SIGKILL");
  });
  const url = await new Promise<string>((resolve, reject) => {
    let out = "";
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString();
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m?.[1]) resolve(m[1]);
    });
    child.once("exit", (code) => reject(new Error(`exited early with ${code}`)));
  });
  const operator = (await readFile(tokenFile, "utf8")).trim();
  assert.ok(operator.length >= 16);
  assert.equal((await stat(tokenFile)).mode & 0o777, 0o600, "the minted operator token is owner-only");
  assert.equal((await stat(join(dir, "db"))).mode & 0o777, 0o700, "the database folder it created");
  for (const f of ["cp.db", "cp.db-wal", "cp.db-shm"])
    assert.equal((await stat(join(dir, "db", f))).mode & 0o777, 0o600, `${f} is owner-only`);
  const listed = await warmstart(["clusters", "-o", "json", "--control-plane", url, "--token", operator]);
  assert.equal(listed.code, 0, listed.stderr);

  const register = (token: string, clusterId: string): Promise<Response> =>
    fetch(`${url}/v1/clusters/register`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify({ clusterId, inventory: [] }),
    });
  // Each token registers its own cluster, and only that one.
  for (const [token, id] of [
    [clusterToken("alpha"), "alpha"],
    [clusterToken("beta"), "beta"],
    [eastToken, "east"],
  ] as const) {
    assert.equal((await register(token, id)).status, 200, id);
    assert.equal((await register(token, "gamma")).status, 403, `${id}'s token as gamma`);
  }

  // A token minted while the server runs works at once; a removed one stops working.
  const west = await warmstart([
    "control-plane",
    "cluster-token",
    "add",
    "west",
    "--cluster-token-file",
    clusterTokenFile,
  ]);
  const westToken = west.stdout.trim();
  assert.equal((await register(westToken, "west")).status, 200);
  const list = await warmstart([
    "control-plane",
    "cluster-token",
    "list",
    "-o",
    "json",
    "--cluster-token-file",
    clusterTokenFile,
  ]);
  const rows = JSON.parse(list.stdout) as { clusterId: string; fingerprint: string }[];
  assert.deepEqual(
    rows.map((r) => r.clusterId),
    ["east", "west"],
  );
  assert.ok(!list.stdout.includes(westToken), "list never prints a token");
  assert.equal(
    (
      await warmstart([
        "control-plane",
        "cluster-token",
        "remove",
        "west",
        "--cluster-token-file",
        clusterTokenFile,
      ])
    ).code,
    0,
  );
  assert.equal((await register(westToken, "west")).status, 401, "a removed token is unknown");

  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  child.kill("SIGTERM");
  assert.equal(await exited, 0, "a clean exit on SIGTERM");
});

void test("an existing database others can read is made owner-only before it is opened", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "warmstart-cp-perm-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const db = join(dir, "cp.db");
  const h = await startHarness(t, { dbPath: db });
  await h.cp.close();
  for (const f of [db, `${db}-wal`, `${db}-shm`]) await chmod(f, 0o644).catch(() => undefined);
  assert.equal((await stat(db)).mode & 0o777, 0o644);
  await h.restart();
  assert.equal((await stat(db)).mode & 0o777, 0o600);
});
