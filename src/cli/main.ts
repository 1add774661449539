import { Command, CommanderError } from "commander";
import { registerClusterCommands } from "../localcluster/cli.js";
import { registerExplainCommands } from "./explain.js";
import { registerWebhookCommands } from "../webhook/cli.js";
import { registerServerCommands } from "../server/cli.js";
import { registerDemoCommands } from "../demo/cli.js";
import { registerControlPlaneCommands } from "../control-plane/cli.js";
import { registerDatapathCommands } from "../datapath/cli.js";
import { registerClusterAgentCommands } from "../cluster-agent/cli.js";
import { registerNodeAgentCommands } from "../node-agent/cli.js";

const program = new Command("warmstart")
  .description("Start GPU model-serving workloads warm on Kubernetes")
  .showHelpAfterError()
  .exitOverride();

registerClusterCommands(program);
registerExplainCommands(program);
registerWebhookCommands(program);
registerServerCommands(program);
registerDemoCommands(program);
registerControlPlaneCommands(program);
registerDatapathCommands(program);
registerClusterAgentCommands(program);
registerNodeAgentCommands(program);

try {
  await program.parseAsync(process.argv);
} catch (err) {
  if (err instanceof CommanderError) process.exit(err.exitCode);
  // Bad input and operational failures end in one line, never a stack trace.
  const msg = err instanceof Error ? err.message : String(err);
  process.stderr.write(`warmstart: ${msg}\n`);
  if (process.env.WARMSTART_DEBUG && err instanceof Error) process.stderr.write(`${err.stack}\n`);
  process.exit(1);
}
