/**
 * Holding one of the local cluster's own roles still while a test runs its in-process twin, so
 * the interleaving the test sets up is the only one that happens: the role's process is stopped
 * (SIGSTOP) and continued (SIGCONT) when the test ends; its watches pick up what changed meanwhile.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { openSync, closeSync } from "node:fs";
import { request } from "node:https";
import type { TestContext } from "node:test";
import { readState, startClusterProcessAgain, stopClusterProcess } from "../tools/localcluster/cluster.js";
import { isAlive } from "../tools/localcluster/processes.js";
import { waitFor } from "./harness.js";

type After = Pick<TestContext, "after">;

/** Pauses the local cluster's process `name` (e.g. "server") until the test ends. */
export async function pauseRole(t: After, name: string): Promise<void> {
  const st = await readState();
  const rec = st?.processes.find((p) => p.name === name);
  if (!rec) throw new Error(`the local cluster runs no ${name}: these tests need \`warmstart cluster up\``);
  if (!(await isAlive(rec))) throw new Error(`the local cluster's ${name} (pid ${rec.pid}) is not running`);
  process.kill(rec.pid, "SIGSTOP");
  t.after(async () => {
    if (await isAlive(rec)) process.kill(rec.pid, "SIGCONT");
  });
}

/**
 * Fault tests take a role of the running local cluster over: the role's own process is stopped
 * and the test runs it as a child started exactly the same way (optionally against a fault
 * proxy's kubeconfig, or with more flags), kills and restarts it at chosen moments, and the
 * cluster gets its own process back when the test ends.
 */
export interface RoleHandle {
  readonly name: string;
  /** The child's pid while it runs. */
  pid(): number | undefined;
  /** SIGKILL (default) the role now and wait until it is gone. */
  kill(signal?: NodeJS.Signals): Promise<void>;
  /** Start it again (as it was started) and wait until it answers its health check. */
  start(): Promise<void>;
}

export async function takeOverRole(
  t: TestContext,
  name: string,
  opts: { kubeconfig?: string; extraArgs?: string[] } = {},
): Promise<RoleHandle> {
  const st = await readState();
  const rec = st?.processes.find((p) => p.name === name);
  if (!rec?.command || !rec.args) throw new Error(`no role ${name} in the local cluster`);
  await stopClusterProcess(name);
  const args = [...rec.args, ...(opts.extraArgs ?? [])];
  const env = { ...process.env, ...rec.env, ...(opts.kubeconfig ? { KUBECONFIG: opts.kubeconfig } : {}) };
  const port = /--port=(\d+)/.exec(args.join(" "))?.[1];
  const https = args.includes("webhook");
  let child: ChildProcess | undefined;

  const handle: RoleHandle = {
    name,
    pid: () => (child && child.exitCode === null && child.signalCode === null ? child.pid : undefined),
    async kill(signal = "SIGKILL") {
      const c = child;
      if (!c || c.exitCode !== null || c.signalCode !== null) return;
      const gone = new Promise((r) => c.once("exit", r));
      const send = (sig: NodeJS.Signals): void => {
        try {
          process.kill(-c.pid!, sig);
        } catch {
          /* gone */
        }
      };
      send(signal);
      // A role that does not stop within its grace is killed: a test's end never hangs on it.
      const escalate = signal === "SIGKILL" ? undefined : setTimeout(() => send("SIGKILL"), 15_000);
      await gone;
      clearTimeout(escalate);
    },
    async start() {
      const fd = openSync(rec.log, "a");
      try {
        child = spawn(rec.command!, args, { env, detached: true, stdio: ["ignore", fd, fd] });
      } finally {
        closeSync(fd);
      }
      if (port) await waitFor(`${name} healthy`, () => healthy(port, https), 30_000);
    },
  };
  takenOver.add(name);
  t.after(async () => {
    await handle.kill("SIGTERM");
    await startClusterProcessAgain(name);
    if (port) await waitFor(`${name} back`, () => healthy(port, https), 30_000);
    takenOver.delete(name);
  });
  await handle.start();
  return handle;
}

/** Roles a test runs in place of the cluster's own process (that process is stopped meanwhile). */
const takenOver = new Set<string>();

async function healthy(port: string, https: boolean): Promise<boolean> {
  if (!https) return (await fetch(`http://127.0.0.1:${port}/healthz`)).ok;
  return new Promise((resolve) => {
    // Our own child on loopback: its serving certificate is checked by the API server, not here.
    const req = request(
      `https://127.0.0.1:${port}/healthz`,
      { rejectUnauthorized: false, timeout: 2000 },
      (res) => {
        res.resume();
        resolve(res.statusCode === 200);
      },
    );
    req.on("error", () => resolve(false));
    req.on("timeout", () => req.destroy());
    req.end();
  });
}

/** The local cluster's processes that are not running (none: no role crashed), roles a test took over aside. */
export async function clusterProcessesAlive(): Promise<string[]> {
  const st = await readState();
  const dead: string[] = [];
  for (const p of st?.processes ?? []) if (!takenOver.has(p.name) && !(await isAlive(p))) dead.push(p.name);
  return dead;
}
