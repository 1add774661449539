/**
 * The data-path commands: capture, seed, prewarm and wait-ready. Each is a thin shell over the
 * library function of the same name; flags are checked here so bad input ends in one line.
 */
import type { Command } from "commander";
import {
  AlreadyCapturedError,
  capture,
  DEFAULT_CAPTURE_DEADLINE_MS,
  DEFAULT_CAPTURE_PARALLEL,
} from "./capture.js";
import { exactTimes } from "./native.js";
import { DEFAULT_PREWARM_PARALLEL, describePrewarm, prewarm } from "./prewarm.js";
import { formatBytes } from "./progress.js";
import { chmod, mkdir, stat, writeFile } from "node:fs/promises";
import type { SeedOutcome } from "../core/contract.js";
import { waitForFill, waitForReady } from "./ready.js";
import { seed } from "./seed.js";

function intFlag(name: string, raw: string | undefined, dflt: number, min = 1, max = 256): number {
  if (raw === undefined) return dflt;
  const n = Number(raw);
  if (!/^\d+$/.test(raw.trim()) || !Number.isInteger(n) || n < min || n > max) {
    throw new Error(`${name} must be an integer from ${min} to ${max}, got "${raw}"`);
  }
  return n;
}

function checkHash(hash: string | undefined, flag = "--hash"): void {
  if (hash !== undefined && !/^[0-9a-f]{64}$/.test(hash))
    throw new Error(`${flag} must be a sha256 in lowercase hex (64 characters), got "${hash}"`);
}

export function registerDatapathCommands(program: Command): void {
  program
    .command("capture")
    .description("copy a warmed cache root into the cache store, atomically, times to the nanosecond")
    .argument("<src>", "the cache root to capture")
    .argument("<dest>", "where the committed tree goes (must not exist yet)")
    .option("--hash <hash>", "cache hash recorded in the manifest (sha256 hex)")
    .option("--model <model>", "model name recorded in the manifest")
    .option(
      "--parallel <n>",
      `most files copied at once (default ${DEFAULT_CAPTURE_PARALLEL}; no more copiers than CPUs)`,
    )
    .option("--no-sync", "do not flush the copy to disk before committing (faster, not crash-safe)")
    .option(
      "--no-direct",
      "write big files through the page cache instead of O_DIRECT (the copy stays in memory; more CPU)",
    )
    .option(
      "--deadline <seconds>",
      `fail cleanly (nothing committed) after this long (default ${DEFAULT_CAPTURE_DEADLINE_MS / 1000}; 0: no limit)`,
    )
    .action(
      async (
        src: string,
        dest: string,
        o: {
          hash?: string;
          model?: string;
          parallel?: string;
          sync: boolean;
          direct: boolean;
          deadline?: string;
        },
      ) => {
        checkHash(o.hash);
        const parallel = intFlag("--parallel", o.parallel, DEFAULT_CAPTURE_PARALLEL);
        const deadlineS = intFlag(
          "--deadline",
          o.deadline,
          DEFAULT_CAPTURE_DEADLINE_MS / 1000,
          0,
          7 * 24 * 3600,
        );
        if (!exactTimes)
          process.stderr.write("warmstart: utimensat unavailable; times are kept to the microsecond\n");
        // Ctrl-C or a container stop ends the capture cleanly: no staging left, nothing committed.
        const ac = new AbortController();
        const onSignal = (sig: NodeJS.Signals): void => ac.abort(`received ${sig}`);
        process.once("SIGINT", onSignal).once("SIGTERM", onSignal);
        try {
          const m = await capture({
            src,
            dest,
            hash: o.hash,
            model: o.model,
            parallel,
            durable: o.sync,
            directIo: o.direct,
            deadlineMs: deadlineS * 1000,
            signal: ac.signal,
          });
          const secs = m.timings.totalMs / 1000;
          process.stdout.write(
            `captured ${dest}: ${m.fileCount} files, ${formatBytes(m.totalBytes)} ` +
              `(model ${formatBytes(m.split.model.bytes)}, cache ${formatBytes(m.split.cache.bytes)}) ` +
              `in ${secs.toFixed(2)} s (${(m.totalBytes / 1e6 / Math.max(secs, 1e-3)).toFixed(0)} MB/s, ` +
              `${m.captureMethod}${m.directBytes ? `, ${formatBytes(m.directBytes)} with O_DIRECT` : ""})` +
              `${m.skipped.length ? `, ${m.skipped.length} skipped` : ""}\n`,
          );
        } catch (err) {
          // Already there is success for a retry: the committed tree is never touched.
          if (!(err instanceof AlreadyCapturedError)) throw err;
          process.stdout.write(`${err.message}\n`);
        } finally {
          process.off("SIGINT", onSignal).off("SIGTERM", onSignal);
        }
      },
    );

  program
    .command("seed")
    .description("build a writable per-pod shadow of a read-only captured tree")
    .requiredOption("--from <ro>", "the read-only captured tree")
    .requiredOption("--to <dir>", "the writable shadow (the pod's cache root)")
    .option("--hash <sha256>", "refuse the tree unless its manifest says it was captured for this hash")
    .option(
      "--manifest-digest <sha256>",
      "refuse the tree unless its manifest's bytes hash to this (the digest on the cache's record)",
    )
    .option("--any-uid", "make the shadow writable by any UID (the workload's UID is not known in advance)")
    .option(
      "--wait <seconds>",
      "first wait this long for the tree's ready marker (0: without limit); without it, a tree not ready fails at once",
    )
    .option(
      "--fill-until <time>",
      "a waiting follower: wait until this time (ISO 8601) for its node's agent to fill the tree, or to write the cold marker; then start cold",
    )
    .option(
      "--cold-marker <file>",
      "with --fill-until: the file whose presence says to start cold (its text is why)",
    )
    .option(
      "--outcome-file <file>",
      "write the outcome here as one line of JSON (the pod's termination message)",
    )
    .action(async (o: SeedFlags) => {
      checkHash(o.hash);
      checkHash(o.manifestDigest, "--manifest-digest");
      if (o.fillUntil !== undefined) {
        const until = Date.parse(o.fillUntil);
        if (!Number.isFinite(until))
          throw new Error(`--fill-until must be an ISO 8601 time, got "${o.fillUntil}"`);
        if (!o.coldMarker) throw new Error("--fill-until needs --cold-marker");
        const waited = await waitForFill(o.from, o.coldMarker, until, {
          onWaiting: (s) => process.stderr.write(`still waiting for the cache to fill ${o.from} (${s}s)\n`),
        });
        if (waited.kind === "cold") {
          // The shadow is the engine's cache root all the same: it downloads and compiles there.
          await mkdir(o.to, { recursive: true, mode: o.anyUid ? 0o777 : 0o755 });
          // The kubelet makes an emptyDir 0777 already; a folder this process made it opens up itself.
          if (o.anyUid && ((await stat(o.to)).mode & 0o777) !== 0o777) await chmod(o.to, 0o777);
          await writeOutcome(o.outcomeFile, {
            outcome: "cold",
            reason: waited.reason,
            waitedMs: waited.waitedMs,
          });
          process.stdout.write(
            `starting cold after ${Math.round(waited.waitedMs / 1000)}s: ${waited.reason}\n`,
          );
          return;
        }
        process.stdout.write(`${o.from} filled after ${Math.round(waited.waitedMs / 1000)}s\n`);
        o.waitedMs = waited.waitedMs;
      } else if (o.wait !== undefined) {
        // A restore's first init container both waits and seeds: one container start less.
        const secs = intFlag("--wait", o.wait, 3600, 0, 7 * 24 * 3600);
        await waitUntilReady(o.from, secs);
      }
      const r = await seed({
        from: o.from,
        to: o.to,
        hash: o.hash,
        ...(o.manifestDigest ? { manifestDigest: o.manifestDigest } : {}),
        anyUid: o.anyUid ?? false,
      });
      process.stdout.write(
        `seeded ${o.to} from ${o.from}: ${r.linked} model files linked in place, ${r.copied} files copied ` +
          `(${formatBytes(r.bytesCopied)}), ${r.dirs} dirs, ${r.symlinks} symlinks, ${r.kept} kept` +
          `${r.replaced ? `, ${r.replaced} symlinks in the way replaced` : ""}\n`,
      );
      await writeOutcome(o.outcomeFile, { outcome: "restored", waitedMs: o.waitedMs ?? 0 });
    });

  program
    .command("prewarm")
    .description("read a tree with parallel readers to warm the page cache (best effort, never fails)")
    .argument("<dir>", "the tree to read")
    .option("--parallel <n>", `parallel readers (default ${DEFAULT_PREWARM_PARALLEL})`)
    .option(
      "--respect-env <name>",
      "an env var that turns the prewarm off (0/false/no/off) or on (1/true/yes/on)",
    )
    .option("--default <on|off>", "what to do when that env var is unset", "on")
    .option("--skip", "do nothing (the workload starts cold from the volume)")
    .option(
      "--seeded",
      "the tree was just seeded into this pod's shadow: read only the model files seed left in place",
    )
    .action(
      async (
        dir: string,
        o: { parallel?: string; respectEnv?: string; default: string; skip?: boolean; seeded?: boolean },
      ) => {
        const parallel = intFlag("--parallel", o.parallel, DEFAULT_PREWARM_PARALLEL);
        if (o.default !== "on" && o.default !== "off")
          throw new Error(`--default must be on or off, got "${o.default}"`);
        const r = await prewarm({
          dir,
          parallel,
          skip: o.skip ?? false,
          respectEnv: o.respectEnv,
          defaultOn: o.default === "on",
          seeded: o.seeded ?? false,
        });
        process.stdout.write(`${describePrewarm(r)}\n`);
      },
    );

  program
    .command("wait-ready")
    .description("wait until a captured tree carries its ready marker; non-zero exit on timeout")
    .argument("<dir>", "the captured tree")
    .option("--timeout <seconds>", "give up after this long (0: wait forever)", "3600")
    .action(async (dir: string, o: { timeout: string }) => {
      await waitUntilReady(dir, intFlag("--timeout", o.timeout, 3600, 0, 7 * 24 * 3600));
    });
}

interface SeedFlags {
  from: string;
  to: string;
  hash?: string;
  manifestDigest?: string;
  anyUid?: boolean;
  wait?: string;
  fillUntil?: string;
  coldMarker?: string;
  outcomeFile?: string;
  waitedMs?: number;
}

/**
 * The seed's outcome for whoever reads the pod (the release controller reads it from the init
 * container's termination message): best effort, a file that cannot be written changes nothing.
 */
async function writeOutcome(file: string | undefined, outcome: SeedOutcome): Promise<void> {
  if (!file) return;
  await writeFile(file, JSON.stringify(outcome)).catch((err: unknown) =>
    process.stderr.write(`could not write the outcome to ${file}: ${(err as Error).message}\n`),
  );
}

async function waitUntilReady(dir: string, secs: number): Promise<void> {
  await waitForReady(dir, secs * 1000, {
    onWaiting: (s) => process.stderr.write(`still waiting for ${dir} to be ready (${s}s)\n`),
  });
  process.stdout.write(`${dir} is ready\n`);
}
