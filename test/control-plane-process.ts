/**
 * The control plane as the real `warmstart control-plane` process on a temp database, for the
 * fault tests: killed with SIGKILL (by the test, or by test/sqlite-crash.ts at a chosen point of a
 * transaction) and started again on the same database and port. Also reads the database directly
 * to check that nothing in it is half written.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import Database from "better-sqlite3";
import { ControlPlaneClient } from "../src/control-plane/client.js";
import { CRASH_ENV, type CrashMarker, type CrashPoint } from "./sqlite-crash.js";

const ROOT = fileURLToPath(new URL("../..", import.meta.url));
const BIN = join(ROOT, "bin/warmstart");
const CRASH_HOOK = new URL("./sqlite-crash.js", import.meta.url).href;

export const OPERATOR_TOKEN = "fault-tests-operator-token-0001";
export const clusterTokenOf = (clusterId: string): string => `fault-tests-cluster-token-${clusterId}`;

export interface ControlPlaneProcessOptions {
  credentialTtlSeconds?: number;
  visibilityTimeoutSeconds?: number;
  heartbeatIntervalSeconds?: number;
}

type After = { after(fn: () => Promise<void> | void): void };

export class ControlPlaneProcess {
  /** Fixed after the first start, so clients keep their URL across restarts. */
  port = 0;
  private child: ChildProcess | undefined;
  private exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }> | undefined;
  private starts = 0;

  private constructor(
    readonly dir: string,
    private readonly opts: ControlPlaneProcessOptions,
  ) {}

  static async create(t: After, opts: ControlPlaneProcessOptions = {}): Promise<ControlPlaneProcess> {
    const dir = await mkdtemp(join(tmpdir(), "warmstart-cp-faults-"));
    const cp = new ControlPlaneProcess(dir, opts);
    await writeFile(cp.tokenFile, "", { mode: 0o600 });
    t.after(async () => {
      await cp.kill();
      await rm(dir, { recursive: true, force: true });
    });
    return cp;
  }

  get dbPath(): string {
    return join(this.dir, "control-plane.db");
  }

  get tokenFile(): string {
    return join(this.dir, "cluster-tokens");
  }

  get markerFile(): string {
    return join(this.dir, "crash-marker.json");
  }

  /** This run's log (JSON lines). */
  get logFile(): string {
    return join(this.dir, `control-plane-${this.starts}.log`);
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  get pid(): number | undefined {
    return this.child?.exitCode === null && this.child.signalCode === null ? this.child.pid : undefined;
  }

  operator(): ControlPlaneClient {
    return new ControlPlaneClient({ baseUrl: this.url, token: OPERATOR_TOKEN, timeoutMs: 10_000 });
  }

  /** Gives `clusterId` its registration token (the file is re-read by the running process). */
  async allow(clusterId: string): Promise<string> {
    const text = (await readFile(this.tokenFile, "utf8")) + `${clusterId}=${clusterTokenOf(clusterId)}\n`;
    await writeFile(this.tokenFile, text, { mode: 0o600 });
    return clusterTokenOf(clusterId);
  }

  /** Starts the process; with `crash`, it kills itself at that point of its SQLite work. */
  async start(crash?: Omit<CrashPoint, "marker">): Promise<void> {
    if (this.pid !== undefined) throw new Error("the control plane is already running");
    await rm(this.markerFile, { force: true });
    this.starts++;
    const args = [
      ...(crash ? ["--import", CRASH_HOOK] : []),
      BIN,
      "control-plane",
      "--db",
      this.dbPath,
      "--host",
      "127.0.0.1",
      "--port",
      String(this.port),
      "--cluster-token-file",
      this.tokenFile,
      "--operator-token",
      OPERATOR_TOKEN,
      "--allowed-namespaces",
      "*",
      "--credential-ttl",
      String(this.opts.credentialTtlSeconds ?? 3600),
      "--visibility-timeout",
      String(this.opts.visibilityTimeoutSeconds ?? 30),
      "--heartbeat-interval",
      String(this.opts.heartbeatIntervalSeconds ?? 1),
    ];
    const env: NodeJS.ProcessEnv = { ...process.env, WARMSTART_LOG_FORMAT: "json" };
    delete env[CRASH_ENV];
    if (crash) env[CRASH_ENV] = JSON.stringify({ ...crash, marker: this.markerFile });
    const child = spawn(process.execPath, args, { cwd: ROOT, env, stdio: ["ignore", "pipe", "pipe"] });
    this.child = child;
    this.exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
    child.stderr.pipe(createWriteStream(this.logFile));
    let stdout = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    const url = await new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error("the control plane did not start in 20 s")), 20_000);
      const look = (): void => {
        const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(stdout);
        if (m?.[1]) {
          clearTimeout(timer);
          resolve(m[1]);
        }
      };
      child.stdout.on("data", look);
      void this.exited!.then(async ({ code, signal }) => {
        clearTimeout(timer);
        const log = await readFile(this.logFile, "utf8").catch(() => "");
        reject(new Error(`the control plane exited (${code ?? signal}) while starting: ${log.slice(-2000)}`));
      });
    });
    this.port = Number(url);
  }

  /** Waits for the process to end by itself (the crash hook) and returns where it crashed. */
  async crashed(timeoutMs = 60_000): Promise<CrashMarker> {
    const exited = this.exited;
    if (!exited) throw new Error("never started");
    let timer: NodeJS.Timeout | undefined;
    const r = await Promise.race([
      exited,
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error("the control plane did not reach its crash point")),
          timeoutMs,
        );
      }),
    ]).finally(() => clearTimeout(timer));
    if (r.signal !== "SIGKILL")
      throw new Error(`the control plane ended with ${r.code ?? r.signal}, not SIGKILL`);
    return JSON.parse(await readFile(this.markerFile, "utf8")) as CrashMarker;
  }

  async kill(): Promise<void> {
    if (this.pid !== undefined) this.child?.kill("SIGKILL");
    await this.exited;
  }

  /** A clean stop (SIGTERM); resolves with the exit code. */
  async stop(): Promise<number | null> {
    if (this.pid !== undefined) this.child?.kill("SIGTERM");
    return (await this.exited)?.code ?? null;
  }

  /** A read-only look at the database (safe while the process runs: WAL readers never block it). */
  read<T>(fn: (db: Database.Database) => T): T {
    const db = new Database(this.dbPath, { readonly: true, fileMustExist: true });
    try {
      return fn(db);
    } finally {
      db.close();
    }
  }

  /** Everything that would show a half-written state; empty when the database is consistent. */
  consistencyProblems(): string[] {
    return this.read((db) => consistencyProblems(db));
  }
}

interface RequestRow {
  id: string;
  name: string;
  namespace: string;
  status: string;
  cluster_id: string | null;
  assigned_gpu_type: string | null;
}

interface MessageRow {
  id: string;
  cluster_id: string;
  queue: string;
  gpu_type: string | null;
  request_id: string;
}

/**
 * The database's own checks plus the queue's invariants: a Queued request has exactly one deploy
 * message, on its cluster; a Pending one has none and no cluster; any later one has none (it was
 * acknowledged, or withdrawn); a termination message belongs to a request being terminated; a
 * cluster that is registered holds at least one credential issued with its registration.
 */
export function consistencyProblems(db: Database.Database): string[] {
  const out: string[] = [];
  const integrity = db.pragma("integrity_check", { simple: true });
  if (integrity !== "ok") out.push(`integrity_check: ${String(integrity)}`);
  for (const fk of db.pragma("foreign_key_check") as unknown[])
    out.push(`foreign key: ${JSON.stringify(fk)}`);
  const requests = db.prepare("SELECT * FROM requests").all() as RequestRow[];
  const messages = db.prepare("SELECT * FROM messages").all() as MessageRow[];
  const byRequest = new Map<string, MessageRow[]>();
  for (const m of messages) byRequest.set(m.request_id, [...(byRequest.get(m.request_id) ?? []), m]);
  const names = new Map<string, number>();
  for (const r of requests) {
    const key = `${r.namespace}/${r.name}`;
    if (r.status !== "Terminated") names.set(key, (names.get(key) ?? 0) + 1);
    const deploy = (byRequest.get(r.id) ?? []).filter((m) => m.queue === "deploy");
    const term = (byRequest.get(r.id) ?? []).filter((m) => m.queue === "termination");
    const where = `request ${key} (${r.id}, ${r.status})`;
    if (r.status === "Queued") {
      if (deploy.length !== 1) out.push(`${where}: ${deploy.length} deploy messages, not 1`);
      else if (deploy[0]!.cluster_id !== r.cluster_id || deploy[0]!.gpu_type !== r.assigned_gpu_type)
        out.push(`${where}: its deploy message is for ${deploy[0]!.cluster_id}/${deploy[0]!.gpu_type}`);
    } else if (deploy.length > 0) out.push(`${where}: ${deploy.length} deploy messages left`);
    if (r.status === "Pending" && (r.cluster_id !== null || r.assigned_gpu_type !== null))
      out.push(`${where}: Pending but assigned to ${r.cluster_id}`);
    if (r.status !== "Pending" && r.status !== "Terminated" && r.cluster_id === null)
      out.push(`${where}: no cluster`);
    if (term.length > 1) out.push(`${where}: ${term.length} termination messages`);
    if (term.length > 0 && r.status !== "Terminating" && r.status !== "Terminated")
      out.push(`${where}: a termination message but not terminating`);
  }
  for (const [key, n] of names) if (n > 1) out.push(`${n} active requests named ${key}`);
  const bare = db
    .prepare(
      "SELECT id FROM clusters WHERE NOT EXISTS (SELECT 1 FROM credentials WHERE credentials.cluster_id = clusters.id)",
    )
    .all() as { id: string }[];
  for (const c of bare) out.push(`cluster ${c.id} is registered but no credential was ever issued to it`);
  return out;
}
