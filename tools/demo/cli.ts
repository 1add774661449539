import type { Command } from "commander";
import { runDemo } from "./demo.js";

export function registerDemoCommands(program: Command): void {
  program
    .command("demo")
    .description(
      "the whole story in real containers on the local cluster: one download, capture, release, warm scale-up",
    )
    .option(
      "--vllm",
      "real vLLM (its CPU build) instead of the engine stand-in: a cluster with `cluster up --vllm`",
    )
    .action(async (o: { vllm?: boolean }) => {
      await runDemo({ vllm: Boolean(o.vllm) });
      process.exit(0);
    });
}
