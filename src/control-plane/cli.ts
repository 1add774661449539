/**
 * `warmstart control-plane` (the server) and the operator commands that talk to it:
 * `submit`, `requests`, `clusters`, `terminate`.
 */
import { Command, Option } from "commander";
import Table from "cli-table3";
import { randomBytes } from "node:crypto";
import { readFile, stat } from "node:fs/promises";
import type { ClusterView, RequestView } from "./api.js";
import { ControlPlaneClient } from "./client.js";
import {
  checkServeConfig,
  controlPlaneOptions,
  type ControlPlaneConfig,
  type ControlPlaneOptions,
} from "./config.js";
import { startControlPlane } from "./server.js";
import {
  addClusterToken,
  fingerprint,
  openToOthers,
  readTokenFile,
  removeClusterToken,
  secureExisting,
  splitEntry,
  writePrivateFile,
  type ClusterTokenEntry,
} from "./tokens.js";
import { runningLocalCluster } from "../common/local-defaults.js";
import { createLogger, type Logger } from "../common/log.js";
import { onShutdown } from "../common/shutdown.js";

const int =
  (what: string) =>
  (v: string): number => {
    if (!/^-?\d+$/.test(v.trim())) throw new Error(`${what} must be an integer, got "${v}"`);
    return Number(v);
  };
/** A single-token file's token; undefined when it does not exist. Others' read access is fixed or warned. */
async function readSecretFile(file: string, log?: Logger): Promise<string | undefined> {
  try {
    const mode = (await stat(file)).mode;
    if (log && openToOthers(mode)) secureExisting(file, mode, log);
    return (await readFile(file, "utf8")).trim() || undefined;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw new Error(`cannot read token file ${file}: ${(err as Error).message}`, { cause: err });
  }
}

/** The token in `file`; on first start (no file yet) one is minted and written there, owner-only. */
async function tokenFromFile(file: string, log: Logger): Promise<string> {
  const existing = await readSecretFile(file, log);
  if (existing) return existing;
  const minted = randomBytes(24).toString("base64url");
  await writePrivateFile(file, `${minted}\n`);
  return minted;
}

/**
 * Cluster tokens from flags or the environment: `ID=TOKEN` each. A bare token (the older form)
 * is bound to `--cluster-id`, so one cluster can still be set up with one flag pair.
 */
export function clusterTokenEntries(values: string[], clusterId: string | undefined): ClusterTokenEntry[] {
  return values.map((v) => {
    const entry = splitEntry(v);
    if (entry) return entry;
    if (v.includes("=") && !/^[^=]+=*$/.test(v))
      throw new Error(`invalid cluster token "${v.split("=")[0]}=...": expected CLUSTER_ID=TOKEN`);
    if (!clusterId)
      throw new Error(
        "a cluster token is bound to one cluster: write it as CLUSTER_ID=TOKEN, or give --cluster-id for a bare token",
      );
    return { clusterId, token: v.trim() };
  });
}

/** The serve options resolved: the operator token (minted into its file on first start), the cluster tokens bound. */
async function serveConfig(opts: ControlPlaneOptions, log: Logger): Promise<ControlPlaneConfig> {
  const { operatorTokenFile, clusterId, clusterTokens, ...rest } = opts;
  let operatorToken = opts.operatorToken || undefined;
  if (!operatorToken && operatorTokenFile) operatorToken = await tokenFromFile(operatorTokenFile, log);
  return checkServeConfig({
    ...rest,
    // Missing, it is reported with the rest.
    operatorToken: operatorToken as string,
    clusterTokens: clusterTokenEntries(clusterTokens ?? [], clusterId),
  });
}

async function serve(cmd: Command): Promise<void> {
  const opts = controlPlaneOptions.load(controlPlaneOptions.fromCommand(cmd));
  const log = createLogger("control-plane");
  const config = await serveConfig(opts, log);
  const cp = await startControlPlane({ ...config, logger: log });
  process.stdout.write(`control plane listening on ${cp.url}\n`);
  onShutdown({ log, closers: [{ name: "control plane", close: () => cp.close() }] });
}

interface ConnectOptions {
  controlPlane?: string;
  token?: string;
  caFile?: string;
}

/** The control plane URL, operator token and CA: flag, then env, then the running local cluster. */
export async function operatorClient(opts: ConnectOptions): Promise<ControlPlaneClient> {
  const local =
    opts.controlPlane && opts.token ? undefined : await runningLocalCluster().catch(() => undefined);
  const url = opts.controlPlane ?? process.env.WARMSTART_CONTROL_PLANE_URL ?? local?.controlPlaneUrl;
  if (!url) {
    throw new Error(
      "no control plane URL: pass --control-plane URL, set WARMSTART_CONTROL_PLANE_URL, or start the local cluster",
    );
  }
  const token =
    opts.token ??
    process.env.WARMSTART_OPERATOR_TOKEN ??
    (local ? await readSecretFile(local.operatorTokenFile) : undefined);
  if (!token) {
    throw new Error(
      "no operator token: pass --token, set WARMSTART_OPERATOR_TOKEN, or start the local cluster (which keeps one)",
    );
  }
  const caFile = opts.caFile ?? (process.env.WARMSTART_CONTROL_PLANE_CA_FILE || undefined);
  const ca = caFile ? await readFile(caFile) : undefined;
  return new ControlPlaneClient({ baseUrl: url, token, ...(ca ? { ca } : {}) });
}

function withConnection(cmd: Command): Command {
  return cmd
    .option(
      "--control-plane <url>",
      "control plane URL (default: $WARMSTART_CONTROL_PLANE_URL or the local cluster)",
    )
    .option("--token <token>", "operator token (default: $WARMSTART_OPERATOR_TOKEN or the local cluster's)")
    .option(
      "--ca-file <file>",
      "PEM CA to trust for an https control plane (default: $WARMSTART_CONTROL_PLANE_CA_FILE)",
    );
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
  const cp = program
    .command("control-plane")
    .description("the reference control plane: cluster registration, queue credentials, deployment queues");
  controlPlaneOptions.register(cp).action(() => serve(cp));
  registerTokenCommands(cp);

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

/** `warmstart control-plane cluster-token add|list|remove`: manage the cluster token file. */
function registerTokenCommands(cp: Command): void {
  const tokens = cp
    .command("cluster-token")
    .description("mint, list and remove cluster registration tokens in a token file");
  const fileOption = (): Option =>
    new Option("--cluster-token-file <file>", "the token file (or $WARMSTART_CLUSTER_TOKEN_FILE)");
  // The parent command has the same option and takes it wherever it stands: read both.
  const fileOf = (cmd: Command): string => {
    const o = cmd.optsWithGlobals<{ clusterTokenFile?: string }>();
    const f = o.clusterTokenFile ?? process.env.WARMSTART_CLUSTER_TOKEN_FILE;
    if (!f) throw new Error("no token file: pass --cluster-token-file or set WARMSTART_CLUSTER_TOKEN_FILE");
    return f;
  };
  tokens
    .command("add")
    .description("mint a token for a cluster (kept when it has one, unless --rotate) and print it")
    .argument("<cluster-id>", "the cluster's id, as its agent registers")
    .addOption(fileOption())
    .option("--rotate", "replace the cluster's token with a new one")
    .action(async (id: string, o: { rotate?: boolean }, cmd: Command) => {
      const r = await addClusterToken(fileOf(cmd), id, { rotate: o.rotate === true });
      process.stdout.write(`${r.token}\n`);
      process.stderr.write(
        `${id}: ${r.created ? "token minted" : "token already there (--rotate replaces it)"}\n`,
      );
    });
  tokens
    .command("list")
    .description("the clusters that have a token, with a fingerprint of it (never the token)")
    .addOption(fileOption())
    .addOption(outputOption())
    .action(async (o: { output: string }, cmd: Command) => {
      const rows = (await readTokenFile(fileOf(cmd))).map((e) => ({
        clusterId: e.clusterId,
        fingerprint: fingerprint(e.token),
      }));
      if (o.output === "json") process.stdout.write(`${JSON.stringify(rows, null, 2)}\n`);
      else {
        const t = new Table({ head: ["CLUSTER", "TOKEN FINGERPRINT"], style: { head: [], border: [] } });
        t.push(...rows.map((r) => [r.clusterId, r.fingerprint]));
        process.stdout.write(`${t.toString()}\n`);
      }
    });
  tokens
    .command("remove")
    .description("remove a cluster's token: it can no longer register (its queue credentials expire)")
    .argument("<cluster-id>")
    .addOption(fileOption())
    .action(async (id: string, _o: unknown, cmd: Command) => {
      if (!(await removeClusterToken(fileOf(cmd), id)))
        throw new Error(`cluster ${id} has no token in the file`);
      process.stderr.write(`${id}: token removed\n`);
    });
}
