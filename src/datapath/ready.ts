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
