/**
 * What the operator commands (`caches`, `submit`, `requests`, ...) fall back to when given no
 * kubeconfig or control plane URL: those of the local cluster running on this machine, read from
 * its state file. A read-only lookup, so that no role depends on the local-cluster tooling.
 */
import { readFile } from "node:fs/promises";
import { homedir } from "node:os";
import { join, resolve } from "node:path";
import { z } from "zod";

/** The local cluster's state folder (`warmstart cluster up` keeps its state there too). */
export function localStateDir(): string {
  return resolve(
    process.env.WARMSTART_STATE_DIR ??
      join(process.env.XDG_STATE_HOME ?? join(homedir(), ".local", "state"), "warmstart", "cluster"),
  );
}

/** Only the fields read here; the file holds more. */
const State = z.object({
  kubeconfig: z.string().min(1),
  roles: z.object({ controlPlane: z.string().optional(), server: z.string().optional() }).default({}),
  processes: z.array(z.object({ pid: z.int().positive(), startTime: z.string() })).default([]),
});

export interface LocalCluster {
  stateDir: string;
  kubeconfig: string;
  controlPlaneUrl: string | undefined;
  serverUrl: string | undefined;
  /** Where the local control plane keeps its operator token. */
  operatorTokenFile: string;
}

/** The kernel's start time of a pid (field 22 of /proc/<pid>/stat); a reused pid does not match. */
async function startTime(pid: number): Promise<string | undefined> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return fields[0] === "Z" ? undefined : fields[19];
  } catch {
    return undefined;
  }
}

/** The running local cluster (every process it started still alive), or undefined. */
export async function runningLocalCluster(dir = localStateDir()): Promise<LocalCluster | undefined> {
  let raw: unknown;
  try {
    raw = JSON.parse(await readFile(join(dir, "state.json"), "utf8"));
  } catch {
    return undefined;
  }
  const parsed = State.safeParse(raw);
  if (!parsed.success || parsed.data.processes.length === 0) return undefined;
  const s = parsed.data;
  const alive = await Promise.all(s.processes.map(async (p) => (await startTime(p.pid)) === p.startTime));
  if (!alive.every(Boolean)) return undefined;
  return {
    stateDir: dir,
    kubeconfig: s.kubeconfig,
    controlPlaneUrl: s.roles.controlPlane,
    serverUrl: s.roles.server,
    operatorTokenFile: join(dir, "control-plane", "operator-token"),
  };
}
