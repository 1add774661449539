import { spawn } from "node:child_process";
import { openSync, closeSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { createServer } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";

/** A process we started, identified by pid *and* kernel start time so a reused pid is never mistaken for ours. */
export interface ProcessRecord {
  name: string;
  pid: number;
  startTime: string;
  log: string;
  /** How it was started (the environment on top of the starter's own), so it can be started again. */
  command?: string;
  args?: string[];
  env?: Record<string, string>;
  cwd?: string;
}

/** The kernel's start time of a pid (field 22 of /proc/<pid>/stat), or undefined when it is gone. */
export async function processStartTime(pid: number): Promise<string | undefined> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    if (fields[0] === "Z") return undefined; // a zombie is as good as gone
    return fields[19];
  } catch {
    return undefined;
  }
}

export async function isAlive(rec: ProcessRecord): Promise<boolean> {
  return (await processStartTime(rec.pid)) === rec.startTime;
}

/**
 * Start a long-running process in its own session (so its process group can be signalled as a
 * whole, and it survives the death of whoever started it), with output appended to `log`.
 */
export async function startDetached(
  name: string,
  command: string,
  args: string[],
  opts: { log: string; env?: Record<string, string>; cwd?: string },
): Promise<ProcessRecord> {
  const fd = openSync(opts.log, "a");
  try {
    const child = spawn(command, args, {
      detached: true,
      stdio: ["ignore", fd, fd],
      env: { ...process.env, ...opts.env },
      cwd: opts.cwd,
    });
    const pid = await new Promise<number>((resolve, reject) => {
      child.once("error", (err) => reject(new Error(`starting ${name} (${command}): ${err.message}`)));
      child.once("spawn", () => resolve(child.pid!));
    });
    child.unref();
    const startTime = await processStartTime(pid);
    if (!startTime) throw new Error(`${name} exited at once; see ${opts.log}`);
    return {
      name,
      pid,
      startTime,
      log: opts.log,
      command,
      args,
      ...(opts.env ? { env: opts.env } : {}),
      ...(opts.cwd ? { cwd: opts.cwd } : {}),
    };
  } finally {
    closeSync(fd);
  }
}

/** Starts a process again exactly as it was first started (same command, args, env, log). */
export async function startAgain(rec: ProcessRecord): Promise<ProcessRecord> {
  if (!rec.command || !rec.args) throw new Error(`${rec.name}: no record of how it was started`);
  if (await isAlive(rec)) return rec;
  return startDetached(rec.name, rec.command, rec.args, {
    log: rec.log,
    ...(rec.env ? { env: rec.env } : {}),
    ...(rec.cwd ? { cwd: rec.cwd } : {}),
  });
}

/**
 * Stop a process group: SIGTERM, then SIGKILL after `graceMs`. Returns once the leader is gone.
 * Signals the whole group so children of the process go with it.
 */
export async function stopProcess(rec: ProcessRecord, graceMs = 5000): Promise<void> {
  if (!(await isAlive(rec))) return;
  signalGroup(rec.pid, "SIGTERM");
  const deadline = Date.now() + graceMs;
  while (Date.now() < deadline) {
    if (!(await isAlive(rec))) return signalGroup(rec.pid, "SIGKILL"); // stragglers in the group
    await sleep(50);
  }
  signalGroup(rec.pid, "SIGKILL");
  while (await isAlive(rec)) await sleep(20);
}

function signalGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch {
    try {
      process.kill(pid, signal);
    } catch {
      /* already gone */
    }
  }
}

/** A free loopback port (there is a small window before the caller binds it; callers retry on clash). */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.once("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() =>
        typeof addr === "object" && addr ? resolve(addr.port) : reject(new Error("no free port")),
      );
    });
  });
}
