import { Command, Option } from "commander";
import Table from "cli-table3";
import type { KubeConfig } from "@kubernetes/client-node";
import { SYSTEM_NAMESPACE, loadKubeConfig } from "../common/kube.js";
import { runningLocalCluster } from "../common/local-defaults.js";
import { setTimeout as sleep } from "node:timers/promises";
import { CacheRecords } from "../common/cache-record.js";
import { createLogger } from "../common/log.js";
import { shortHash } from "../core/contract.js";
import { PHASE } from "../api/names.js";
import { HASH_REF, normalizeHashRef } from "../core/refs.js";
import { promoteClients } from "../promote/claims.js";
import { deleteCachePass, describeLeft, type DeleteReport } from "../promote/rollback.js";
import { durationMs } from "../common/units.js";
import { onShutdown } from "../common/shutdown.js";
import { serverOptions } from "./config.js";
import { defaultServerConfig, runServer } from "./run.js";
import { fetchSnapshot, type Snapshot } from "./dashboard/views.js";

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

/** The other nodes that serve a copy of the tree to their peers, and those filling one now. */
function copiesElsewhere(c: Snapshot["caches"][number]): string {
  const others = c.copies.filter((n) => n !== c.node);
  const filling = c.filling.map((f) => `${f.node} filling ${f.percent}%`);
  const copies = others.length
    ? `+${others.length} cop${others.length === 1 ? "y" : "ies"}: ${others.join(", ")}`
    : "";
  const parts = [copies, ...filling].filter(Boolean);
  return parts.length ? ` (${parts.join("; ")})` : "";
}

function render(view: View, s: Snapshot): void {
  if (view === "caches") {
    print(
      s.caches.map((c) => [
        c.hash,
        c.model,
        c.phase + (c.reason ? ` (${c.reason})` : ""),
        bytes(c.sizeBytes),
        (c.node || "-") + copiesElsewhere(c),
        String(c.failedCaptures),
        String(c.restores),
        secs(c.leaderReadySeconds),
        secs(c.restoredReadySeconds),
        secs(c.savedSeconds),
        bytes(c.savedBytes),
        c.compileCache.hits + c.compileCache.misses
          ? `${c.compileCache.hits}/${c.compileCache.hits + c.compileCache.misses} hit`
          : "-",
      ]),
      [
        "HASH",
        "MODEL",
        "PHASE",
        "SIZE",
        "NODE",
        "FAILED",
        "RESTORES",
        "LEADER READY",
        "RESTORED READY",
        "SAVED",
        "NOT DOWNLOADED",
        "COMPILE CACHE",
      ],
    );
    for (const st of s.stores)
      process.stdout.write(
        `store ${st.node}: ${bytes(st.usedBytes)} used${st.budgetBytes ? ` of a ${bytes(st.budgetBytes)} budget` : " (no budget)"}, ${st.caches.length} cache(s)\n`,
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
        secs(p.startup?.seconds.download ?? null),
        secs(p.startup?.seconds.weightLoad ?? p.startup?.seconds.modelLoad ?? null),
        secs(p.startup?.seconds.compile ?? null),
        p.startup?.compileCache ?? "-",
      ]),
      [
        "NAMESPACE",
        "POD",
        "HASH",
        "ROLE",
        "PHASE",
        "READY",
        "READY IN",
        "NODE",
        "DOWNLOAD",
        "LOAD",
        "COMPILE",
        "COMPILE CACHE",
      ],
    );
    for (const p of s.pods)
      if (p.startup?.cause)
        process.stdout.write(`compile cache missed on ${p.namespace}/${p.name}: ${p.startup.cause}\n`);
    for (const p of s.pods) {
      const w = p.waitsFor;
      if (!w) continue;
      const leader = w.leader ? `leader ${w.leader}, ` : "";
      process.stdout.write(
        `${p.namespace}/${p.name} ${w.gated ? "gated, waits" : "waits running"} for cache ${w.cache} (${leader}${w.phase})` +
          `${w.until ? `; starts cold at ${w.until}` : ""}\n`,
      );
    }
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
  const server = program.command("server").description("release controller, operators' API and dashboard");
  serverOptions.register(server).action(async () => {
    const log = createLogger("server");
    const srv = await runServer(await defaultServerConfig(serverOptions.fromCommand(server)), { log });
    onShutdown({ log, closers: [{ name: "server", close: () => srv.stop() }] });
  });

  const cache = program
    .command("cache")
    .description("act on one cache: delete it and everything it created, or let it be elected again");
  cache
    .command("delete")
    .argument("<hash>", "the cache hash (full, or its first 16 hex characters)")
    .description(
      "delete a cache: its claims, PVs and snapshots in every namespace, the stored tree on every node (by their agents) and its record; retries what fails and reports what is left",
    )
    .option("--timeout <duration>", "how long to keep retrying before reporting what is left", "2m")
    .addOption(
      new Option("-o, --output <format>", "output format").choices(["table", "json"]).default("table"),
    )
    .action(async (hash: string, opts: { timeout: string; output: string }) => {
      const short = parseHash(hash);
      const timeoutMs = durationMs.parse(opts.timeout);
      const report = await deleteCache(await operatorKubeConfig(), short, timeoutMs, opts.output === "json");
      if (opts.output === "json")
        process.stdout.write(`${JSON.stringify({ hash: short, ...report }, null, 2)}\n`);
      if (!report.gone || report.left.length) process.exitCode = 1;
    });
  cache
    .command("retry")
    .argument("<hash>", "the cache hash (full, or its first 16 hex characters)")
    .description("clear a cache's failed-capture count, so the next pod of its hash is elected again")
    .action(async (hash: string) => {
      const short = parseHash(hash);
      const kc = await operatorKubeConfig();
      const records = new CacheRecords(promoteClients(kc).custom);
      let before = 0;
      const r = await records.transition(short, (c) => {
        before = Number(c.status?.failedCaptures ?? 0);
        return before ? { failedCaptures: 0, lastFailedElection: null } : undefined;
      });
      if (!r) throw new Error(`no cache ${short}`);
      process.stdout.write(
        before
          ? `cache ${short}: failed captures ${before} → 0; the next pod of its hash is elected again\n`
          : `cache ${short}: no failed capture counted; nothing to clear (phase ${r.cache.status?.phase ?? PHASE.Electing})\n`,
      );
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

/** A full hash or its short form (the record's name): the first 16 hex characters. */
function parseHash(hash: string): string {
  const h = normalizeHashRef(hash);
  if (!HASH_REF.test(h))
    throw new Error(`not a cache hash: "${hash}" (64 hex characters, or the first 16 of them)`);
  return shortHash(h);
}

/**
 * Runs deletion passes until the record is gone, or the timeout passes: each pass retries its
 * own failed calls, and anything a pass leaves is tried again by the next. Says what it removed
 * and what is left, and why.
 */
async function deleteCache(
  kc: KubeConfig,
  short: string,
  timeoutMs: number,
  quiet: boolean,
): Promise<DeleteReport> {
  const clients = promoteClients(kc);
  const log = createLogger("cache-delete", process.env.LOG_LEVEL ?? "warn");
  const out = (line: string): void => {
    if (!quiet) process.stdout.write(`${line}\n`);
  };
  const deadline = Date.now() + timeoutMs;
  const removed = new Set<string>();
  let wait = 500;
  let lastLeft = "";
  for (let pass = 1; ; pass++) {
    let report: DeleteReport;
    try {
      report = await deleteCachePass(clients, short, { log });
    } catch (err) {
      if (Date.now() > deadline) throw err;
      out(`pass ${pass}: ${(err as Error).message}; retrying`);
      await sleep(wait);
      wait = Math.min(wait * 2, 5_000);
      continue;
    }
    for (const i of report.items.filter((x) => x.state === "deleted")) {
      const key = `${i.kind} ${i.namespace ? `${i.namespace}/` : ""}${i.name}`;
      if (!removed.has(key)) out(`deleted ${key}`);
      removed.add(key);
    }
    const left = describeLeft(report.left).join("\n");
    if (report.gone && !report.left.length) {
      out(
        `cache ${short} deleted (${removed.size} object(s) removed; stored trees removed by their node agents)`,
      );
      return report;
    }
    if (left !== lastLeft) out(`left after pass ${pass}:\n${left.replace(/^/gm, "  ")}`);
    lastLeft = left;
    if (Date.now() > deadline) {
      out(
        `cache ${short}: not fully deleted after ${Math.round(timeoutMs / 1000)} s; run the command again to retry`,
      );
      return report;
    }
    await sleep(wait);
    wait = Math.min(wait * 2, 5_000);
  }
}
