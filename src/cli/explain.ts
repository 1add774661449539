import { readFileSync } from "node:fs";
import { FOLLOWER_MODES } from "../core/gangs.js";
import { Option, type Command } from "commander";
import { compare, explain, subjectsFromText, type ExplainOptions, type Subject } from "../core/explain.js";
import { SHARING_SCOPES } from "../core/scope.js";

/** Reads a manifest from a path, or stdin for `-`, with a one-line error when it cannot. */
function readManifest(path: string): string {
  try {
    return readFileSync(path === "-" ? 0 : path, "utf8");
  } catch (err) {
    const e = err as NodeJS.ErrnoException;
    const why =
      e.code === "ENOENT"
        ? "no such file"
        : e.code === "EISDIR"
          ? "is a directory"
          : e.code === "EACCES"
            ? "permission denied"
            : (e.message ?? String(err)).split("\n")[0];
    throw new Error(`cannot read ${path === "-" ? "stdin" : path}: ${why}`, { cause: err });
  }
}

function load(path: string): Subject[] {
  return subjectsFromText(readManifest(path), path === "-" ? "stdin" : path);
}

/** One subject's view as the object it always was; several (a multi-document file, a LeaderWorkerSet) as a list, each named. */
const oneOrList = <T>(items: T[]): T | T[] => (items.length === 1 ? (items[0] as T) : items);

export function registerExplainCommands(program: Command): void {
  program
    .command("explain")
    .description(
      "print the admission view of a pod or workload as JSON (downloader, reason, model, scope, hash); " +
        "with a second file, show which hash inputs differ and which look per-run. No cluster needed.",
    )
    .argument(
      "<file>",
      "Pod, Deployment, StatefulSet, Job, CronJob, ReplicaSet, DaemonSet, LeaderWorkerSet or any workload " +
        "with a pod template, one or many documents (each workload is explained); YAML or JSON; - for stdin",
    )
    .argument("[file2]", "a second pod, workload or ModelCache record to compare with")
    .addOption(
      new Option(
        "--sharing-scope <scope>",
        "the webhook's --sharing-scope: who shares a cache (the local cluster's; the chart's is namespace)",
      )
        .choices(SHARING_SCOPES)
        .default("cluster"),
    )
    .option(
      "--namespace <namespace>",
      "the namespace the pods are created in (default: the manifest's, else default)",
    )
    .option(
      "--share-group <name>",
      "that namespace's warmstart.dev/share-group label (--sharing-scope group)",
    )
    .addOption(
      new Option(
        "--follower-mode <mode>",
        "the webhook's --follower-mode (election.followerMode): how a follower of each pod's hash waits",
      )
        .choices(FOLLOWER_MODES)
        .default("auto"),
    )
    .action((file: string, file2: string | undefined, flags: ExplainOptions) => {
      if (file === "-" && file2 === "-") throw new Error("stdin can be read only once");
      if (flags.shareGroup !== undefined && flags.sharingScope !== "group")
        throw new Error("--share-group applies to --sharing-scope group only");
      const a = load(file);
      let out: unknown;
      if (file2 === undefined) out = oneOrList(a.map((s) => explain(s, flags)));
      else {
        const b = load(file2);
        if (a.length !== b.length) {
          const names = (l: Subject[]): string => l.map((s) => s.name).join(", ");
          throw new Error(
            `cannot pair ${a.length} subject(s) of ${file} (${names(a)}) with ${b.length} of ${file2} (${names(b)}): ` +
              "compare files of one workload each",
          );
        }
        out = oneOrList(a.map((s, k) => compare(s, b[k] as Subject, flags)));
      }
      process.stdout.write(`${JSON.stringify(out, null, 2)}\n`);
    });
}
