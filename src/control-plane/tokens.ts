/**
 * Cluster registration tokens, each bound to one cluster id: a token registers, renews and reads
 * the queue of its own cluster only. They come from flags (`ID=TOKEN`) and from a token file of
 * `ID=TOKEN` lines, which the server re-reads when it changes, so a cluster can be added or its
 * token rotated without a restart. Files this module writes are owner-only (0600, in a 0700
 * folder when it creates the folder).
 */
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { chmodSync, statSync, readFileSync } from "node:fs";
import { mkdir, open, readFile, rename, rm, stat } from "node:fs/promises";
import { dirname } from "node:path";
import { z } from "zod";
import { ClusterId } from "./api.js";
import type { Logger } from "../common/log.js";

/** Bearer tokens: token68 characters (so they travel in a header and in a comma-separated env). */
export const Token = z
  .string()
  .min(16, { message: "must be at least 16 characters" })
  .max(512)
  .regex(/^[A-Za-z0-9._~+/=-]+$/, { message: "may only hold letters, digits and . _ ~ + / = -" });

export interface ClusterTokenEntry {
  clusterId: string;
  token: string;
}

/**
 * `ID=TOKEN`, or undefined when `text` is not in that form (a bare token). A token may itself hold
 * `=` (base64 padding), so the form counts only when both halves are valid on their own.
 */
export function splitEntry(text: string): ClusterTokenEntry | undefined {
  const i = text.indexOf("=");
  if (i <= 0) return undefined;
  const clusterId = text.slice(0, i).trim();
  const token = text.slice(i + 1).trim();
  return ClusterId.safeParse(clusterId).success && Token.safeParse(token).success
    ? { clusterId, token }
    : undefined;
}

/** Parses a token file; throws one error naming each bad line. Duplicated ids or tokens are refused. */
export function parseTokenFile(text: string, source: string): ClusterTokenEntry[] {
  const entries: ClusterTokenEntry[] = [];
  const problems: string[] = [];
  text.split("\n").forEach((raw, n) => {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) return;
    const e = splitEntry(line);
    if (!e) problems.push(`line ${n + 1}: expected CLUSTER_ID=TOKEN (a token of 16+ characters)`);
    else entries.push(e);
  });
  problems.push(...duplicates(entries));
  if (problems.length) throw new Error(`invalid cluster token file ${source}: ${problems.join("; ")}`);
  return entries;
}

/** Problems with a set of entries: an id given two tokens, or one token given to two ids. */
export function duplicates(entries: readonly ClusterTokenEntry[]): string[] {
  const out: string[] = [];
  const ids = new Set<string>();
  const tokens = new Map<string, string>();
  for (const e of entries) {
    if (ids.has(e.clusterId)) out.push(`cluster ${e.clusterId} has more than one token`);
    ids.add(e.clusterId);
    const other = tokens.get(e.token);
    if (other !== undefined) out.push(`clusters ${other} and ${e.clusterId} share a token`);
    tokens.set(e.token, e.clusterId);
  }
  return out;
}

export function formatTokenFile(entries: readonly ClusterTokenEntry[]): string {
  return [
    "# Cluster registration tokens, one CLUSTER_ID=TOKEN per line. Keep this file owner-only.",
    ...entries.map((e) => `${e.clusterId}=${e.token}`),
    "",
  ].join("\n");
}

/** A short, non-secret name for a token (to list tokens without printing them). */
export function fingerprint(token: string): string {
  return `sha256:${createHash("sha256").update(token).digest("hex").slice(0, 12)}`;
}

/** Whether a file's mode lets anyone but its owner read or write it. */
export function openToOthers(mode: number): boolean {
  return (mode & 0o077) !== 0;
}

const digest = (s: string): Buffer => createHash("sha256").update(s).digest();

/** Who a cluster token belongs to; answers in constant time over every known token. */
export class ClusterTokens {
  private fileEntries: { clusterId: string; digest: Buffer }[] = [];
  private fileStamp = "";
  private readonly fixed: { clusterId: string; digest: Buffer }[];

  constructor(
    private readonly o: {
      fixed: readonly ClusterTokenEntry[];
      file?: string | undefined;
      /** Tokens no cluster may use (the operator token). */
      reserved: readonly string[];
      log: Logger;
    },
  ) {
    this.fixed = o.fixed.map((e) => ({ clusterId: e.clusterId, digest: digest(e.token) }));
    if (o.file) this.reload(true);
  }

  /** The cluster id `token` was issued for, or undefined. */
  clusterOf(token: string): string | undefined {
    if (this.o.file) this.reload(false);
    const d = digest(token);
    let found: string | undefined;
    for (const e of [...this.fixed, ...this.fileEntries]) {
      if (timingSafeEqual(d, e.digest) && found === undefined) found = e.clusterId;
    }
    return found;
  }

  /** Re-reads the file when its size or modification time changed; a bad file keeps the last good one. */
  private reload(first: boolean): void {
    const file = this.o.file!;
    let stamp: string;
    let mode: number;
    try {
      const s = statSync(file);
      stamp = `${s.ino}:${s.size}:${s.mtimeMs}`;
      mode = s.mode;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "ENOENT") throw err;
      stamp = "absent";
      mode = 0;
    }
    if (stamp === this.fileStamp) return;
    try {
      const entries = stamp === "absent" ? [] : parseTokenFile(readFileSync(file, "utf8"), file);
      const reserved = new Set(this.o.reserved);
      const problems = duplicates([...this.o.fixed, ...entries]);
      if (entries.some((e) => reserved.has(e.token)))
        problems.push("a cluster token equals the operator token");
      if (problems.length) throw new Error(`cluster token file ${file}: ${problems.join("; ")}`);
      if (stamp !== "absent" && openToOthers(mode)) secureExisting(file, mode, this.o.log);
      this.fileEntries = entries.map((e) => ({ clusterId: e.clusterId, digest: digest(e.token) }));
      this.fileStamp = stamp;
      this.o.log.info({ file, clusters: entries.map((e) => e.clusterId) }, "cluster tokens read");
    } catch (err) {
      if (first) throw err;
      this.fileStamp = stamp;
      this.o.log.warn({ file, err }, "cannot reload the cluster token file; keeping the tokens read before");
    }
  }
}

/**
 * A secret file that others can read: made owner-only when this process may change it (warned),
 * else only warned about (a mounted Secret is read-only, and its mode is the mount's business).
 */
export function secureExisting(file: string, mode: number, log: Logger): void {
  const was = (mode & 0o777).toString(8);
  try {
    chmodSync(file, 0o600);
    log.warn({ file, mode: was }, "secret file was readable by others; made it owner-only (0600)");
  } catch (err) {
    log.warn(
      { file, mode: was, err },
      "secret file is readable by others and cannot be made owner-only; chmod 600 it",
    );
  }
}

/** Creates `dir` (and missing parents) as 0700 when missing; an existing folder is left as it is. */
export async function ensurePrivateDir(dir: string): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
}

/** Writes `text` to `file` owner-only, atomically (temp file and rename). */
export async function writePrivateFile(file: string, text: string): Promise<void> {
  await ensurePrivateDir(dirname(file));
  const tmp = `${file}.${randomBytes(4).toString("hex")}.tmp`;
  const fh = await open(tmp, "wx", 0o600);
  try {
    await fh.writeFile(text);
    await fh.sync();
  } finally {
    await fh.close();
  }
  try {
    await rename(tmp, file);
  } catch (err) {
    await rm(tmp, { force: true });
    throw err;
  }
}

export async function readTokenFile(file: string): Promise<ClusterTokenEntry[]> {
  try {
    return parseTokenFile(await readFile(file, "utf8"), file);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw err;
  }
}

export const mintToken = (): string => `wsc_${randomBytes(24).toString("base64url")}`;

/**
 * The token of `clusterId` in `file`, minted and added when it has none (`created`). With
 * `rotate`, a new token replaces the old one, which stops working once the server re-reads the file.
 */
export async function addClusterToken(
  file: string,
  clusterId: string,
  opts: { rotate?: boolean } = {},
): Promise<{ token: string; created: boolean }> {
  ClusterId.parse(clusterId);
  const entries = await readTokenFile(file);
  const existing = entries.find((e) => e.clusterId === clusterId);
  if (existing && !opts.rotate) return { token: existing.token, created: false };
  const token = mintToken();
  const next = [...entries.filter((e) => e.clusterId !== clusterId), { clusterId, token }];
  await writePrivateFile(file, formatTokenFile(next));
  return { token, created: true };
}

/** Removes the token of `clusterId`; false when it had none. */
export async function removeClusterToken(file: string, clusterId: string): Promise<boolean> {
  const entries = await readTokenFile(file);
  const next = entries.filter((e) => e.clusterId !== clusterId);
  if (next.length === entries.length) return false;
  await writePrivateFile(file, formatTokenFile(next));
  return true;
}

/** The mode bits of a file, or undefined when it does not exist. */
export async function fileMode(file: string): Promise<number | undefined> {
  try {
    return (await stat(file)).mode & 0o777;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw err;
  }
}
