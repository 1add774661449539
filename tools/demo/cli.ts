import type { Command } from "commander";
import { runDemo } from "./demo.js";

export function registerDemoCommands(program: Command): void {
  program
    .command("demo")
    .description(
      "the whole story in real containers on the local cluster: one download, capture, release, warm scale-up",
    )
    .action(async () => {
      await runDemo();
      process.exit(0);
    });
}
