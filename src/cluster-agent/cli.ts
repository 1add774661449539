/** `warmstart cluster-agent`: the GPU-aware cluster agent as a long-running process. */
import { Option, type Command } from "commander";
import { createLogger } from "../common/log.js";
import { ClusterAgent } from "./agent.js";
import { loadConfig, OPTIONS } from "./config.js";

export function registerClusterAgentCommands(program: Command): void {
  const cmd = program
    .command("cluster-agent")
    .description(
      "register this cluster's GPUs with the control plane and turn its deployment requests into workloads",
    );
  for (const o of OPTIONS) {
    const dflt = o.defaultText ? ` (default: ${o.defaultText})` : "";
    cmd.addOption(new Option(o.flag, `${o.help}${dflt} [$${o.env}]`));
  }
  cmd.addHelpText(
    "after",
    "\nDurations: 500ms, 30s, 5m, 1h (a bare number is seconds). Every flag can also come from its environment variable.",
  );
  cmd.action(async (flags: Record<string, unknown>) => {
    const config = loadConfig(flags);
    const log = createLogger("cluster-agent");
    let finish: (code: number) => void = () => undefined;
    const done = new Promise<number>((resolve) => (finish = resolve));
    process.once("SIGTERM", () => finish(0));
    process.once("SIGINT", () => finish(0));
    const agent = new ClusterAgent({
      config,
      log,
      onFatal: (err) => {
        log.error({ err: err.message }, "cannot go on; exiting");
        finish(1);
      },
    });
    await agent.start();
    process.stdout.write(`cluster agent listening on ${agent.url}\n`);
    const code = await done;
    await agent.stop();
    // Everything is stopped and flushed; do not wait on sockets a peer keeps open.
    process.exit(code);
  });
}
