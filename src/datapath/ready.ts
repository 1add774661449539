/**
 * The ready marker: a file written last into a committed tree, whose presence is the only signal
 * that the tree is complete. Followers wait for it before starting a workload.
 */
import { constants as fsc } from "node:fs";
import { lstat, open } from "node:fs/promises";
import { setTimeout as sleep } from "node:timers/promises";
import { READY_MARKER } from "../core/contract.js";
import { isMissing } from "./tree.js";

export async function isReady(dir: string): Promise<boolean> {
  try {
    return (await lstat(`${dir}/${READY_MARKER}`)).isFile();
  } catch (err) {
    if (isMissing(err)) return false;
    throw err;
  }
}

/** Flushes a directory's entries (a rename or a new name in it) to disk. */
export async function fsyncDir(dir: string): Promise<void> {
  const fh = await open(dir, fsc.O_RDONLY | fsc.O_DIRECTORY);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

/** Writes the marker (failing if one is there), fsyncs it and the directory that holds it. */
export async function writeReadyMarker(dir: string, body: string): Promise<void> {
  const fh = await open(`${dir}/${READY_MARKER}`, "wx", 0o444);
  try {
    await fh.writeFile(body);
    await fh.sync();
  } finally {
    await fh.close();
  }
  await fsyncDir(dir);
}

export interface WaitOptions {
  intervalMs?: number;
  signal?: AbortSignal;
  /** Called about every `noticeMs` while still waiting, with the seconds waited so far. */
  onWaiting?: (waitedS: number) => void;
  noticeMs?: number;
}

/**
 * Resolves once `<dir>/READY_MARKER` exists; rejects with a one-line error after `timeoutMs`
 * (0 or less: wait without limit) or when `signal` aborts.
 */
export async function waitForReady(dir: string, timeoutMs: number, opts: WaitOptions = {}): Promise<void> {
  const start = Date.now();
  const interval = opts.intervalMs ?? 500;
  const notice = opts.noticeMs ?? 30_000;
  let lastNotice = start;
  for (;;) {
    if (await isReady(dir)) return;
    const now = Date.now();
    if (timeoutMs > 0 && now - start >= timeoutMs) {
      throw new Error(`timed out after ${Math.round(timeoutMs / 1000)}s waiting for ${dir}/${READY_MARKER}`);
    }
    if (opts.onWaiting && now - lastNotice >= notice) {
      lastNotice = now;
      opts.onWaiting(Math.round((now - start) / 1000));
    }
    const left = timeoutMs > 0 ? timeoutMs - (now - start) : interval;
    try {
      await sleep(Math.max(1, Math.min(interval, left)), undefined, { signal: opts.signal });
    } catch {
      throw new Error(`stopped waiting for ${dir}/${READY_MARKER}`);
    }
  }
}

/** What a waiting follower's wait ended with: its tree, or a cold start and why. */
export type FillOutcome =
  { kind: "ready"; waitedMs: number } | { kind: "cold"; reason: string; waitedMs: number };

/** Longest cold reason read from a marker (the node agent writes one line). */
const MAX_REASON = 1024;

/**
 * A waiting follower's wait (SPEC 1.3 "Groups and gangs"): its pod runs at once and its node's
 * agent fills `tree` (committed there by a rename, ready marker inside) or, when no cache will
 * come, writes `coldMarker` with the reason. Past `untilMs` (epoch ms) the pod stops waiting and
 * starts cold, so a dead or absent agent never holds it longer than the deadline. Never throws for
 * a missing folder: the kubelet made the volume, the agent makes what is inside it.
 */
export async function waitForFill(
  tree: string,
  coldMarker: string,
  untilMs: number,
  opts: WaitOptions & { now?: () => number } = {},
): Promise<FillOutcome> {
  const now = opts.now ?? Date.now;
  const start = now();
  const interval = opts.intervalMs ?? 500;
  const notice = opts.noticeMs ?? 30_000;
  let lastNotice = start;
  for (;;) {
    if (await isReady(tree)) return { kind: "ready", waitedMs: now() - start };
    const cold = await readColdMarker(coldMarker);
    if (cold !== undefined) return { kind: "cold", reason: cold, waitedMs: now() - start };
    const t = now();
    if (t >= untilMs)
      return {
        kind: "cold",
        reason: `no cache within the wait deadline (${new Date(untilMs).toISOString()})`,
        waitedMs: t - start,
      };
    if (opts.onWaiting && t - lastNotice >= notice) {
      lastNotice = t;
      opts.onWaiting(Math.round((t - start) / 1000));
    }
    try {
      await sleep(Math.max(1, Math.min(interval, untilMs - t)), undefined, { signal: opts.signal });
    } catch {
      throw new Error(`stopped waiting for ${tree}/${READY_MARKER}`);
    }
  }
}

/** The reason in a cold marker (a regular file, never followed through a symlink); undefined when absent. */
async function readColdMarker(path: string): Promise<string | undefined> {
  let fh;
  try {
    fh = await open(path, fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK);
  } catch (err) {
    if (isMissing(err)) return undefined;
    // Anything in the way that is not a plain file still says the agent gave up: start cold.
    return `the cache cannot be filled (${(err as NodeJS.ErrnoException).code ?? "unreadable marker"})`;
  }
  try {
    if (!(await fh.stat()).isFile()) return "the cache cannot be filled (marker is not a file)";
    const buf = Buffer.alloc(MAX_REASON);
    const { bytesRead } = await fh.read(buf, 0, MAX_REASON, 0);
    const reason = buf.subarray(0, bytesRead).toString("utf8").trim();
    return reason || "the cache cannot be filled";
  } finally {
    await fh.close();
  }
}
