import type { Command } from "commander";
import { loadKubeConfig } from "../common/kube.js";
import { createLogger } from "../common/log.js";
import { onShutdown } from "../common/shutdown.js";
import { NodeAgent } from "./agent.js";
import { nodeAgentOptions } from "./config.js";
import { startHttp } from "./http.js";

export function registerNodeAgentCommands(program: Command): void {
  const cmd = program
    .command("node-agent")
    .description(
      "per-node capture agent: captures each Ready leader's cache and promotes it to rox-<short> claims",
    );
  nodeAgentOptions.register(cmd).action(async () => {
    const cfg = nodeAgentOptions.load(nodeAgentOptions.fromCommand(cmd));
    const log = createLogger("node-agent");
    const agent = new NodeAgent({ cfg, kc: loadKubeConfig(), log });
    const http = await startHttp({
      host: cfg.host,
      port: cfg.port,
      metricsRemote: cfg.metricsRemote,
      registry: agent.metrics.registry,
      health: () => agent.health(),
      log,
    });
    onShutdown({
      log,
      closers: [
        { name: "agent", close: () => agent.stop() },
        { name: "http", close: () => http.close() },
      ],
    });
    await agent.start();
    log.info({ url: http.url }, "node agent serving /metrics and /healthz");
  });
}
