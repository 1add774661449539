import { Command, Option } from "commander";
import { runDemo } from "./demo.js";

export function registerDemoCommands(program: Command): void {
  program
    .command("demo")
    .description("the whole story on the local cluster: one download, capture, release, warm scale-up")
    .addOption(
      new Option("--shard-mib <n>", "size of each of the 4 simulated weight shards")
        .default(64)
        .argParser(Number),
    )
    .action(async (opts: { shardMib: number }) => {
      await runDemo({ shardMiB: opts.shardMib });
      process.exit(0);
    });
}
