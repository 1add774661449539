/**
 * `warmstart control-plane` (the server) and the operator commands that talk to it:
 * `submit`, `requests`, `clusters`, `terminate`.
 */
import { Command, Option } from "commander";
import Table from "cli-table3";
import { randomBytes } from "node:crypto";
import { mkdir, readFile, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import type { ClusterView, RequestView } from "./api.js";
import { ControlPlaneClient } from "./client.js";
import { parseConfig } from "./config.js";
import { startControlPlane } from "./server.js";
import { readState } from "../localcluster/cluster.js";
import { stateDir } from "../localcluster/versions.js";
import { createLogger } from "../common/log.js";

/** Where the local cluster keeps the operator token of the control plane it runs. */
export function localOperatorTokenFile(): string {
  return join(stateDir(), "control-plane", "operator-token");
}

/** Where the local cluster keeps the cluster token its agent registers with. */
export function localClusterTokenFile(): string {
  return join(stateDir(), "control-plane", "cluster-token");
}

const int =
  (what: string) =>
  (v: string): number => {
    if (!/^-?\d+$/.test(v.trim())) throw new Error(`${what} must be an integer, got "${v}"`);
    return Number(v);
  };
const collect = (v: string, prev: string[] = []): string[] => [...prev, v];
const csv = (v: string | undefined): string[] =>
  (v ?? "")
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean);

async function readTokenFile(file: string): Promise<string | undefined> {
  try {
    return (await readFile(file, "utf8")).trim() || undefined;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new Error(`cannot read token file ${file}: ${(err as Error).message}`, { cause: err });
  }
}

interface ServeOptions {
  db?: string;
  port?: number;
  host?: string;
  clusterToken?: string[];
  operatorToken?: string;
  operatorTokenFile?: string;
  clusterTokenFile?: string;
  credentialTtl?: number;
  visibilityTimeout?: number;
  heartbeatInterval?: number;
}

/** The token in `file`; on first start (no file yet) one is minted and written there, 0600. */
async function tokenFromFile(file: string): Promise<string> {
  const existing = await readTokenFile(file);
  if (existing) return existing;
  const minted = randomBytes(24).toString("base64url");
  await mkdir(dirname(file), { recursive: true });
  await writeFile(file, `${minted}\n`, { mode: 0o600 });
  return minted;
}

async function serve(opts: ServeOptions): Promise<void> {
  let operatorToken = opts.operatorToken ?? process.env.WARMSTART_OPERATOR_TOKEN;
  if (!operatorToken && opts.operatorTokenFile) operatorToken = await tokenFromFile(opts.operatorTokenFile);
  const dbPath = opts.db ?? process.env.WARMSTART_CONTROL_PLANE_DB ?? "warmstart-control-plane.db";
  const clusterTokens = opts.clusterToken?.length
    ? [...opts.clusterToken]
    : csv(process.env.WARMSTART_CLUSTER_TOKENS);
  if (opts.clusterTokenFile) clusterTokens.push(await tokenFromFile(opts.clusterTokenFile));
  const config = parseConfig({
    dbPath,
    port: opts.port,
    host: opts.host,
    clusterTokens,
    operatorToken,
    credentialTtlSeconds: opts.credentialTtl,
    visibilityTimeoutSeconds: opts.visibilityTimeout,
    heartbeatIntervalSeconds: opts.heartbeatInterval,
  });
  await mkdir(dirname(config.dbPath), { recursive: true });
  const log = createLogger("control-plane");
  const cp = await startControlPlane({ ...config, logger: log });
  process.stdout.write(`control plane listening on ${cp.url}\n`);
  await new Promise<void>((resolve) => {
    const stop = (signal: string): void => {
      log.info({ signal }, "shutting down");
      cp.close().then(resolve, (err: unknown) => {
        log.error({ err }, "shutdown failed");
        resolve();
      });
    };
    process.once("SIGTERM", () => stop("SIGTERM"));
    process.once("SIGINT", () => stop("SIGINT"));
  });
}

interface ConnectOptions {
  controlPlane?: string;
  token?: string;
}

/** The control plane URL and operator token: flag, then env, then the local cluster. */
export async function operatorClient(opts: ConnectOptions): Promise<ControlPlaneClient> {
  const url =
    opts.controlPlane ?? process.env.WARMSTART_CONTROL_PLANE_URL ?? (await readState())?.roles.controlPlane;
  if (!url) {
    throw new Error(
      "no control plane URL: pass --control-plane URL, set WARMSTART_CONTROL_PLANE_URL, or start the local cluster",
    );
  }
  const token =
    opts.token ?? process.env.WARMSTART_OPERATOR_TOKEN ?? (await readTokenFile(localOperatorTokenFile()));
  if (!token) {
    throw new Error(
      `no operator token: pass --token, set WARMSTART_OPERATOR_TOKEN, or start the local cluster (which writes ${localOperatorTokenFile()})`,
    );
  }
  return new ControlPlaneClient({ baseUrl: url, token });
}

function withConnection(cmd: Command): Command {
  return cmd
    .option(
      "--control-plane <url>",
      "control plane URL (default: $WARMSTART_CONTROL_PLANE_URL or the local cluster)",
    )
    .option("--token <token>", "operator token (default: $WARMSTART_OPERATOR_TOKEN or the local cluster's)");
}

const outputOption = (): Option =>
  new Option("-o, --output <format>", "output format").choices(["table", "json"]).default("table");

function age(iso: string | null, now = Date.now()): string {
  if (!iso) return "-";
  const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  if (s < 172_800) return `${Math.round(s / 3600)}h`;
  return `${Math.round(s / 86_400)}d`;
}

export function requestsTable(requests: RequestView[]): string {
  const t = new Table({
    head: ["ID", "NAMESPACE/NAME", "MODEL", "GPUS", "CLUSTER", "STATUS", "READY", "AGE", "MESSAGE"],
    style: { head: [], border: [] },
  });
  for (const r of requests) {
    const ready = r.instances.filter((i) => i.ready).length;
    t.push([
      r.id,
      `${r.namespace}/${r.name}`,
      r.model,
      `${r.replicas}x${r.gpus} ${r.assignedGpuType ?? r.gpuType ?? "any"}`,
      r.clusterId ?? "-",
      r.status,
      `${ready}/${r.replicas}`,
      age(r.createdAt),
      r.message ?? "",
    ]);
  }
  return t.toString();
}

export function clustersTable(clusters: ClusterView[]): string {
  const t = new Table({
    head: [
      "CLUSTER",
      "GPUS",
      "CAPACITY",
      "ALLOCATED",
      "SCHEDULABLE",
      "READY",
      "PAUSED",
      "INSTRUCTION",
      "HEARTBEAT",
      "QUEUED",
    ],
    style: { head: [], border: [] },
  });
  for (const c of clusters) {
    t.push([
      c.name && c.name !== c.clusterId ? `${c.clusterId} (${c.name})` : c.clusterId,
      c.inventory.map((i) => `${i.gpuType}: ${i.allocated}/${i.count}`).join("\n") || "-",
      c.capacity,
      c.allocated,
      c.schedulable ? "yes" : "no",
      c.ready ? "yes" : "no",
      c.paused ? "yes" : "no",
      c.instruction,
      age(c.lastHeartbeatAt),
      `${c.queueDepth.deploy} deploy, ${c.queueDepth.termination} terminate`,
    ]);
  }
  return t.toString();
}

export function registerControlPlaneCommands(program: Command): void {
  program
    .command("control-plane")
    .description("the reference control plane: cluster registration, queue credentials, deployment queues")
    .option(
      "--db <file>",
      "SQLite database file (default: $WARMSTART_CONTROL_PLANE_DB or ./warmstart-control-plane.db)",
    )
    .option("--port <n>", "port to listen on (0: any free port)", int("--port"))
    .option("--host <addr>", "address to listen on", "127.0.0.1")
    .option(
      "--cluster-token <token>",
      "token clusters register with; repeatable (or $WARMSTART_CLUSTER_TOKENS)",
      collect,
    )
    .option("--operator-token <token>", "operator token (or $WARMSTART_OPERATOR_TOKEN)")
    .option("--operator-token-file <file>", "read the operator token here; minted and written on first start")
    .option(
      "--cluster-token-file <file>",
      "also accept the cluster token kept here; minted and written on first start",
    )
    .option("--credential-ttl <seconds>", "lifetime of queue credentials", int("--credential-ttl"))
    .option(
      "--visibility-timeout <seconds>",
      "default visibility timeout of received messages",
      int("--visibility-timeout"),
    )
    .option(
      "--heartbeat-interval <seconds>",
      "heartbeat interval told to agents",
      int("--heartbeat-interval"),
    )
    .action(serve);

  withConnection(
    program
      .command("submit")
      .description("submit a deployment request to the control plane; prints its id")
      .argument("<name>", "request name (the Deployment's name; a DNS-1123 label)")
      .argument("[args...]", "container args, after --")
      .requiredOption("--model <model>", "model to serve")
      .requiredOption("--image <image>", "container image")
      .option("--replicas <n>", "replicas", int("--replicas"), 1)
      .option("--gpus <n>", "GPUs per replica", int("--gpus"), 1)
      .option("--gpu-type <type>", "GPU type (default: any)")
      .option("--namespace <ns>", "namespace", "default")
      .addOption(new Option("-o, --output <format>", "output format").choices(["id", "json"]).default("id")),
  ).action(
    async (
      name: string,
      args: string[],
      o: ConnectOptions & {
        model: string;
        image: string;
        replicas: number;
        gpus: number;
        gpuType?: string;
        namespace: string;
        output: string;
      },
    ) => {
      const client = await operatorClient(o);
      const res = await client.submit({
        name,
        namespace: o.namespace,
        model: o.model,
        image: o.image,
        gpus: o.gpus,
        replicas: o.replicas,
        ...(o.gpuType ? { gpuType: o.gpuType } : {}),
        ...(args.length ? { args } : {}),
      });
      process.stdout.write(o.output === "json" ? `${JSON.stringify(res, null, 2)}\n` : `${res.id}\n`);
      if (o.output !== "json") process.stderr.write(`${name}: ${res.status}\n`);
    },
  );

  withConnection(
    program.command("requests").description("deployment requests and their status").addOption(outputOption()),
  ).action(async (o: ConnectOptions & { output: string }) => {
    const requests = await (await operatorClient(o)).listRequests();
    process.stdout.write(
      o.output === "json" ? `${JSON.stringify(requests, null, 2)}\n` : `${requestsTable(requests)}\n`,
    );
  });

  withConnection(
    program
      .command("clusters")
      .description("registered clusters and their GPU capacity")
      .addOption(outputOption()),
  ).action(async (o: ConnectOptions & { output: string }) => {
    const clusters = await (await operatorClient(o)).listClusters();
    process.stdout.write(
      o.output === "json" ? `${JSON.stringify(clusters, null, 2)}\n` : `${clustersTable(clusters)}\n`,
    );
  });

  withConnection(
    program.command("terminate").description("terminate a deployment request").argument("<id>", "request id"),
  ).action(async (id: string, o: ConnectOptions) => {
    const res = await (await operatorClient(o)).terminate(id);
    process.stdout.write(`${res.id} ${res.status}\n`);
  });
}
