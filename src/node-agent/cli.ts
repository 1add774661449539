import type { Command } from "commander";
import { loadKubeConfig } from "../common/kube.js";
import { createLogger } from "../common/log.js";
import { NodeAgent } from "./agent.js";
import { loadNodeAgentConfig } from "./config.js";
import { startHttp } from "./http.js";

export function registerNodeAgentCommands(program: Command): void {
  program
    .command("node-agent")
    .description(
      "per-node capture agent: captures each Ready leader's cache and promotes it to rox-<short> claims",
    )
    .option("--node <name>", "this node's name (env NODE_NAME)")
    .option("--kubelet-root <dir>", "the kubelet's root directory as mounted here (holds pods/<uid>/volumes)")
    .option("--store <dir>", "the node's cache store: committed trees go to <store>/<short>")
    .option("--store-claim <ns/name>", "the claim the store is mounted from (shared-volume, snapshot-clone)")
    .option(
      "--store-provisioner <name>",
      "storage profile key of the store (default: the claim's provisioner, or host-path)",
    )
    .option("--store-volume-type <type>", "volume type of the store, for per-type profile overrides")
    .option("--warmup <duration>", "how long a leader stays Ready before capture (default 30s)")
    .option("--concurrency <n>", "captures at once on this node (default 2)")
    .option("--capture-parallel <n>", "files copied at once within one capture (default 8)")
    .option("--capture-deadline <duration>", "a capture taking longer fails cleanly (default 30m; 0: none)")
    .option(
      "--store-budget <size>",
      "bytes the store may hold, e.g. 500Gi (default: no limit); unused caches make room, least recently restored first",
    )
    .option("--no-durable", "do not flush captured data to disk before committing (throwaway stores only)")
    .option("--resync <duration>", "how often pods and promoted claims are looked at again (default 60s)")
    .option(
      "--snapshot-timeout <duration>",
      "snapshot-clone: how long a snapshot may take to be ready (default 10m)",
    )
    .option("--host <host>", "metrics and health listen address (default 0.0.0.0)")
    .option("--port <port>", "metrics and health port (0 = any free port; default 9464)")
    .action(async (flags: Record<string, string | boolean | undefined>) => {
      const cfg = loadNodeAgentConfig({
        node: flags.node,
        kubeletRoot: flags.kubeletRoot,
        store: flags.store,
        storeClaim: flags.storeClaim,
        storeProvisioner: flags.storeProvisioner,
        storeVolumeType: flags.storeVolumeType,
        warmupMs: flags.warmup,
        concurrency: flags.concurrency,
        captureParallel: flags.captureParallel,
        captureDeadlineMs: flags.captureDeadline,
        storeBudget: flags.storeBudget,
        durable: flags.durable === false ? false : undefined,
        resyncMs: flags.resync,
        snapshotTimeoutMs: flags.snapshotTimeout,
        host: flags.host,
        port: flags.port,
      });
      const log = createLogger("node-agent");
      const agent = new NodeAgent({ cfg, kc: loadKubeConfig(), log });
      const http = await startHttp({
        host: cfg.host,
        port: cfg.port,
        registry: agent.metrics.registry,
        health: () => agent.health(),
        log,
      });
      await agent.start();
      log.info({ url: http.url }, "node agent serving /metrics and /healthz");
      const shutdown = (): void => {
        Promise.all([agent.stop(), http.close()]).then(
          () => process.exit(0),
          () => process.exit(1),
        );
      };
      process.once("SIGTERM", shutdown);
      process.once("SIGINT", shutdown);
    });
}
