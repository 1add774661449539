import { Option, type Command } from "commander";
import { createLogger } from "../common/log.js";
import { onShutdown } from "../common/shutdown.js";
import { webhookOptions } from "./config.js";
import { runWebhook } from "./run.js";

export function registerWebhookCommands(program: Command): void {
  const cmd = program
    .command("webhook")
    .description("the admission webhook: elects one downloader per cache hash and decorates pods");
  webhookOptions
    .register(cmd)
    .addOption(new Option("--url-file <file>", "write the serving URL here once listening").hideHelp())
    .action(async (flags: { urlFile?: string }) => {
      const cfg = webhookOptions.load(webhookOptions.fromCommand(cmd));
      const log = createLogger("webhook");
      const hook = await runWebhook(cfg, { log });
      onShutdown({ log, closers: [{ name: "webhook", close: () => hook.stop() }] });
      if (typeof flags.urlFile === "string") {
        const { writeFile } = await import("node:fs/promises");
        await writeFile(flags.urlFile, hook.url);
      }
    });
}
