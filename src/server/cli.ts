import { Command, Option } from "commander";
import Table from "cli-table3";
import type { KubeConfig } from "@kubernetes/client-node";
import { SYSTEM_NAMESPACE, loadKubeConfig } from "../common/kube.js";
import { runningLocalCluster } from "../common/local-defaults.js";
import { defaultServerConfig, runServer, type ServerFlags } from "./run.js";
import { fetchSnapshot, type Snapshot } from "./views.js";

const bytes = (n: number): string => {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  for (; n >= 1024 && i < u.length - 1; i++) n /= 1024;
  return `${n.toFixed(i ? 1 : 0)} ${u[i]}`;
};
const secs = (s: number | null): string =>
  s === null ? "-" : s < 120 ? `${s.toFixed(1)}s` : `${(s / 60).toFixed(1)}m`;

function print(rows: string[][], head: string[]): void {
  const t = new Table({ head, style: { head: [], border: [] } });
  t.push(...rows);
  process.stdout.write(`${t.toString()}\n`);
}

type View = "caches" | "elections" | "pods";

function render(view: View, s: Snapshot): void {
  if (view === "caches") {
    print(
      s.caches.map((c) => [
        c.hash,
        c.model,
        c.phase + (c.reason ? ` (${c.reason})` : ""),
        bytes(c.sizeBytes),
        String(c.restores),
        secs(c.leaderReadySeconds),
        secs(c.restoredReadySeconds),
        secs(c.savedSeconds),
      ]),
      ["HASH", "MODEL", "PHASE", "SIZE", "RESTORES", "LEADER READY", "RESTORED READY", "SAVED"],
    );
  } else if (view === "elections") {
    print(
      s.elections.map((e) => [e.hash, e.leaderNamespace, e.acquired, e.deadline, String(e.followers)]),
      ["HASH", "LEADER NAMESPACE", "ACQUIRED", "DEADLINE", "WAITING"],
    );
  } else {
    print(
      s.pods.map((p) => [
        p.namespace,
        p.name,
        p.hash,
        p.role,
        p.phase,
        p.ready ? "yes" : "no",
        secs(p.readySeconds),
        p.node,
      ]),
      ["NAMESPACE", "POD", "HASH", "ROLE", "PHASE", "READY", "READY IN", "NODE"],
    );
    const cold = s.pods
      .filter((p) => p.role === "leader" || p.role === "cold")
      .map((p) => p.readySeconds)
      .filter((x): x is number => x !== null);
    const warm = s.pods
      .filter((p) => p.role === "restore" || p.role === "follower")
      .map((p) => p.readySeconds)
      .filter((x): x is number => x !== null);
    const avg = (xs: number[]): number | null =>
      xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null;
    process.stdout.write(
      `cold: ${cold.length} pods, mean ready in ${secs(avg(cold))}; restored: ${warm.length} pods, mean ready in ${secs(avg(warm))}; saved ${secs(s.totals.savedSeconds)} and ${bytes(s.totals.savedBytes)} of downloads\n`,
    );
  }
}

/** $KUBECONFIG, else the running local cluster's, else the usual defaults (in-cluster, ~/.kube). */
async function operatorKubeConfig(): Promise<KubeConfig> {
  if (!process.env.KUBECONFIG) {
    const local = await runningLocalCluster();
    if (local) return loadKubeConfig(local.kubeconfig);
  }
  return loadKubeConfig();
}

export function registerServerCommands(program: Command): void {
  program
    .command("server")
    .description("release controller, operators' API and dashboard")
    .option("--host <host>", "listen address (default: 127.0.0.1; or $WARMSTART_SERVER_HOST)")
    .option("--port <port>", "listen port (0 = any free port; default 8080 or $WARMSTART_SERVER_PORT)")
    .option(
      "--token-file <file>",
      "bearer token for the API and dashboard (or $WARMSTART_SERVER_TOKEN_FILE); required off loopback",
    )
    .option("--token <token>", "the token itself (prefer --token-file or $WARMSTART_SERVER_TOKEN)")
    .action(async (flags: ServerFlags) => {
      const srv = await runServer(await defaultServerConfig(flags));
      const shutdown = (): void => {
        srv.stop().then(
          () => process.exit(0),
          () => process.exit(1),
        );
      };
      process.once("SIGTERM", shutdown);
      process.once("SIGINT", shutdown);
    });

  for (const view of ["caches", "elections", "pods"] as const) {
    program
      .command(view)
      .description(
        `operators' view: ${view}${view === "pods" ? " (time to ready, cold vs restored, and what was saved)" : ""}`,
      )
      .addOption(
        new Option("-o, --output <format>", "output format").choices(["table", "json"]).default("table"),
      )
      .action(async (opts: { output: string }) => {
        const s = await fetchSnapshot(await operatorKubeConfig(), SYSTEM_NAMESPACE);
        if (opts.output === "json")
          process.stdout.write(
            `${JSON.stringify(view === "pods" ? { pods: s.pods, totals: s.totals } : s[view], null, 2)}\n`,
          );
        else render(view, s);
      });
  }
}
