/**
 * One long step of building or installing the local cluster's parts: a command whose chosen
 * output lines are shown as progress (with the time so far, and a heartbeat so a long compile
 * never looks hung), and whose last output is kept for the error when it fails.
 */
import { spawn } from "node:child_process";

export interface StepOptions {
  /** Extra environment on top of this process's own. */
  env?: Record<string, string>;
  /** Lines worth showing, turned into what is shown (undefined: not shown). */
  show?: (line: string) => string | undefined;
  progress?: (line: string) => void;
  /** What the heartbeat says while nothing is shown (default: no heartbeat). */
  heartbeat?: string;
}

export function runStep(cmd: string, args: string[], o: StepOptions = {}): Promise<void> {
  const started = Date.now();
  const elapsed = (): string => {
    const s = Math.round((Date.now() - started) / 1000);
    return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  };
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { env: { ...process.env, ...o.env }, stdio: ["ignore", "pipe", "pipe"] });
    let tail = "";
    const onData = (d: Buffer): void => {
      const text = d.toString();
      tail = (tail + text).slice(-4000);
      for (const line of text.split("\n")) {
        const shown = line && o.show?.(line);
        if (shown) o.progress?.(`${shown} [${elapsed()}]`);
      }
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    const beat = o.heartbeat
      ? setInterval(() => o.progress?.(`${o.heartbeat} [${elapsed()}]`), 60_000)
      : undefined;
    child.on("error", (err) => {
      clearInterval(beat);
      reject(new Error(`${cmd}: ${err.message}`));
    });
    child.on("close", (code) => {
      clearInterval(beat);
      if (code === 0) resolve();
      else reject(new Error(`${cmd} ${args.join(" ")} failed (exit ${code}):\n${tail.trim()}`));
    });
  });
}

/** The `==> ` lines the build scripts print for each step. */
export const buildScriptSteps = (line: string): string | undefined =>
  line.startsWith("==> ") ? line.slice(4) : undefined;
