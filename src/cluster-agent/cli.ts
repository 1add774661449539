/** `warmstart cluster-agent`: the GPU-aware cluster agent as a long-running process. */
import type { Command } from "commander";
import { createLogger } from "../common/log.js";
import { onShutdown } from "../common/shutdown.js";
import { ClusterAgent } from "./agent.js";
import { clusterAgentOptions } from "./config.js";

export function registerClusterAgentCommands(program: Command): void {
  const cmd = program
    .command("cluster-agent")
    .description(
      "register this cluster's GPUs with the control plane and turn its deployment requests into workloads",
    );
  clusterAgentOptions.register(cmd);
  cmd.addHelpText(
    "after",
    "\nDurations: 500ms, 30s, 5m, 1h (a bare number is seconds). Every flag can also come from its environment variable.",
  );
  cmd.action(async () => {
    const config = clusterAgentOptions.load(clusterAgentOptions.fromCommand(cmd));
    const log = createLogger("cluster-agent");
    const agent = new ClusterAgent({
      config,
      log,
      onFatal: (err) => {
        log.error({ err }, "cannot go on; exiting");
        void shutdown.begin("fatal", 1);
      },
    });
    // Everything is stopped and flushed before the exit; sockets a peer keeps open are not waited on.
    const shutdown = onShutdown({ log, closers: [{ name: "agent", close: () => agent.stop() }] });
    await agent.start();
    process.stdout.write(`cluster agent listening on ${agent.url}\n`);
  });
}
