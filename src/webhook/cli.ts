import { Command, Option } from "commander";
import { loadWebhookConfig } from "./config.js";
import { runWebhook } from "./run.js";

export function registerWebhookCommands(program: Command): void {
  program
    .command("webhook")
    .description("the admission webhook: elects one downloader per cache hash and decorates pods")
    .option("--host <host>", "listen address")
    .option("--port <port>", "listen port (0 = any free port)")
    .option("--cert-file <file>", "serving certificate (PEM); reloaded when it changes")
    .option("--key-file <file>", "serving key (PEM)")
    .option("--ca-file <file>", "CA bundle for the registration (default: the certificate)")
    .option(
      "--client-ca-file <file>",
      "answer only callers whose client certificate this CA signed (the API server's webhook client)",
    )
    .option("--client-name <names>", "accepted client certificate names, comma-separated (CN or DNS)")
    .option("--register-url <url>", "register a MutatingWebhookConfiguration pointing at this URL")
    .option("--election-enabled [bool]", "elect one downloader per hash (default false: admit cold)")
    .option("--election-deadline <duration>", "how long an election may take before it is retired (e.g. 60m)")
    .option("--image <image>", "the warmstart image for init containers")
    .option("--timeout-seconds <n>", "the API server's webhook timeout")
    .option("--sharing-scope <scope>", "who shares a cache: cluster (default), namespace or group")
    .option(
      "--max-failed-captures <n>",
      "failed captures of a hash after which its pods start cold (default 3)",
    )
    .option("--cache-size-limit <size>", "the leader's capture volume size limit (default 200Gi)")
    .option(
      "--max-cache-size-limit <size>",
      "the most a pod may ask for with warmstart.dev/cache-size-limit (default 1Ti)",
    )
    .option(
      "--store-provisioner <name>",
      "storage profile key of the node agents' cache stores (followers prewarm by it; default host-path)",
    )
    .option("--store-volume-type <type>", "volume type of the node agents' cache stores")
    .addOption(new Option("--url-file <file>", "write the serving URL here once listening").hideHelp())
    .action(async (flags: Record<string, string | boolean | undefined>) => {
      const cfg = loadWebhookConfig({
        host: flags.host,
        port: flags.port,
        certFile: flags.certFile,
        keyFile: flags.keyFile,
        caFile: flags.caFile,
        clientCaFile: flags.clientCaFile,
        clientNames: flags.clientName,
        sharingScope: flags.sharingScope,
        maxFailedCaptures: flags.maxFailedCaptures,
        cacheSizeLimit: flags.cacheSizeLimit,
        maxCacheSizeLimit: flags.maxCacheSizeLimit,
        registerUrl: flags.registerUrl,
        electionEnabled: flags.electionEnabled === true ? "true" : flags.electionEnabled,
        electionDeadline: flags.electionDeadline,
        image: flags.image,
        timeoutSeconds: flags.timeoutSeconds,
        storeProvisioner: flags.storeProvisioner,
        storeVolumeType: flags.storeVolumeType,
      });
      const hook = await runWebhook(cfg);
      if (typeof flags.urlFile === "string") {
        const { writeFile } = await import("node:fs/promises");
        await writeFile(flags.urlFile, hook.url);
      }
      const shutdown = (): void => {
        hook.stop().then(
          () => process.exit(0),
          () => process.exit(1),
        );
      };
      process.once("SIGTERM", shutdown);
      process.once("SIGINT", shutdown);
    });
}
