import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { Command, CommanderError } from "commander";

type Register = (program: Command) => void;

/**
 * The development tools (`cluster`, `demo`) are a build of their own under tools/, beside the
 * product's in dist/: present in a checkout after `npm install`, absent from the product image.
 * Loaded by a computed URL so that the product's build never compiles them.
 */
const TOOLS = new URL("../../tools/", import.meta.url);

async function loadTool(module: string, name: string, command: string): Promise<Register | undefined> {
  const url = new URL(module, TOOLS);
  if (!existsSync(fileURLToPath(url))) return undefined;
  const mod = (await import(url.href)) as Record<string, Register | undefined>;
  const register = mod[name];
  if (!register) throw new Error(`${command}: ${fileURLToPath(url)} does not export ${name}`);
  return register;
}

/** Registers a stand-in that explains, when run, that the tools are not in this installation. */
function absentTool(command: string): Register {
  return (program) => {
    program
      .command(command, { hidden: true })
      .allowUnknownOption()
      .allowExcessArguments()
      .helpOption(false)
      .action(() => {
        throw new Error(
          `\`${command}\` is development tooling, not part of this installation (the product image ` +
            "carries only the product); run it from a checkout of the repository after `npm install`",
        );
      });
  };
}

const tool =
  (module: string, name: string, command: string): (() => Promise<Register>) =>
  async () =>
    (await loadTool(module, name, command)) ?? absentTool(command);

/**
 * Every subcommand, by the module that registers it. Only the module of the command being run is
 * loaded, so the data-path steps that run in every restored pod's init containers (seed,
 * prewarm, wait-ready) start without loading the Kubernetes client.
 */
const MODULES: { commands: string[]; load: () => Promise<Register> }[] = [
  {
    commands: ["cluster"],
    load: tool("localcluster/cli.js", "registerClusterCommands", "cluster"),
  },
  { commands: ["explain"], load: async () => (await import("./explain.js")).registerExplainCommands },
  { commands: ["webhook"], load: async () => (await import("../webhook/cli.js")).registerWebhookCommands },
  {
    commands: ["server", "caches", "elections", "pods", "cache"],
    load: async () => (await import("../server/cli.js")).registerServerCommands,
  },
  { commands: ["demo"], load: tool("demo/cli.js", "registerDemoCommands", "demo") },
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
