import { Command, CommanderError } from "commander";

type Register = (program: Command) => void;

/**
 * Every subcommand, by the module that registers it. Only the module of the command being run is
 * loaded, so the data-path steps that run in every restored pod's init containers (seed,
 * prewarm, wait-ready) start without loading the Kubernetes client.
 */
const MODULES: { commands: string[]; load: () => Promise<Register> }[] = [
  {
    commands: ["cluster"],
    load: async () => (await import("../localcluster/cli.js")).registerClusterCommands,
  },
  { commands: ["explain"], load: async () => (await import("./explain.js")).registerExplainCommands },
  { commands: ["webhook"], load: async () => (await import("../webhook/cli.js")).registerWebhookCommands },
  {
    commands: ["server", "caches", "elections", "pods", "cache"],
    load: async () => (await import("../server/cli.js")).registerServerCommands,
  },
  { commands: ["demo"], load: async () => (await import("../demo/cli.js")).registerDemoCommands },
  {
    commands: ["control-plane", "submit", "requests", "clusters", "terminate"],
    load: async () => (await import("../control-plane/cli.js")).registerControlPlaneCommands,
  },
  {
    commands: ["capture", "seed", "prewarm", "wait-ready"],
    load: async () => (await import("../datapath/cli.js")).registerDatapathCommands,
  },
  {
    commands: ["cluster-agent"],
    load: async () => (await import("../cluster-agent/cli.js")).registerClusterAgentCommands,
  },
  {
    commands: ["node-agent"],
    load: async () => (await import("../node-agent/cli.js")).registerNodeAgentCommands,
  },
];

const program = new Command("warmstart")
  .description("Start GPU model-serving workloads warm on Kubernetes")
  .showHelpAfterError()
  .exitOverride();

try {
  const wanted = process.argv[2];
  const owner = MODULES.find((m) => m.commands.includes(wanted ?? ""));
  for (const m of owner ? [owner] : MODULES) (await m.load())(program);
  await program.parseAsync(process.argv);
} catch (err) {
  if (err instanceof CommanderError) process.exit(err.exitCode);
  // Bad input and operational failures end in one line, never a stack trace.
  const msg = err instanceof Error ? err.message : String(err);
  process.stderr.write(`warmstart: ${msg}\n`);
  if (process.env.WARMSTART_DEBUG && err instanceof Error) process.stderr.write(`${err.stack}\n`);
  process.exit(1);
}
