/**
 * The pure half of replication: what a receiver checks in a manifest and in a source's metadata
 * before it writes anything, how a tree is cut into chunks, which source gets the next chunk,
 * and the small wire formats both sides share (names in URLs, byte ranges). No I/O here.
 *
 * Names are byte strings (one character per byte, as in datapath/beneath.ts), so a name that is
 * not valid UTF-8 travels exactly.
 */
import { z } from "zod";
import { MANIFEST_FILE, READY_MARKER } from "../../core/contract.js";
import { digestAvailable, digestOf, type DigestAlgorithm } from "../../datapath/digest.js";
import { nameOf, type Manifest } from "../../datapath/manifest.js";
import { staysInside } from "../../datapath/tree.js";

/** Response header on every answer of a peer server: streams it is sending right now. */
export const ACTIVE_STREAMS_HEADER = "x-warmstart-active-streams";
/** Default size of one ranged request. Large enough that per-request costs vanish against the
 * data, small enough that a dropped source loses little and several sources share one file. */
export const DEFAULT_CHUNK_BYTES = 16 * 1024 * 1024;

/** Paths of the peer protocol, below the server's base URL. */
export const paths = {
  manifest: (short: string): string => `/v1/trees/${short}/manifest`,
  meta: (short: string): string => `/v1/trees/${short}/meta`,
  have: (short: string): string => `/v1/trees/${short}/have`,
  file: (short: string, rel: string): string => `/v1/trees/${short}/files/${encodeRel(rel)}`,
  load: "/v1/load",
};

/** A byte-string path as a URL path: unreserved bytes and `/` as they are, every other byte
 * percent-encoded, so any name round-trips through decodeRel. */
export function encodeRel(rel: string): string {
  let out = "";
  for (let i = 0; i < rel.length; i++) {
    const c = rel.charCodeAt(i);
    const ch = rel[i] as string;
    out += /[A-Za-z0-9\-._~/]/.test(ch) && c < 128 ? ch : `%${c.toString(16).toUpperCase().padStart(2, "0")}`;
  }
  return out;
}

/** The byte string a URL path stands for; undefined when its escapes are malformed. */
export function decodeRel(enc: string): string | undefined {
  let out = "";
  for (let i = 0; i < enc.length; i++) {
    const ch = enc[i] as string;
    if (ch !== "%") {
      if (enc.charCodeAt(i) > 127) return undefined;
      out += ch;
      continue;
    }
    const hex = enc.slice(i + 1, i + 3);
    if (!/^[0-9A-Fa-f]{2}$/.test(hex)) return undefined;
    out += String.fromCharCode(parseInt(hex, 16));
    i += 2;
  }
  return out;
}

/** A relative path a tree may hold: no empty, `.` or `..` component, not absolute, no NUL, and
 * not one of the names a commit writes itself at the root. */
export function safeRel(rel: string): boolean {
  if (rel === "" || rel.length > 4096 || rel.includes("\0")) return false;
  const parts = rel.split("/");
  if (parts.some((p) => p === "" || p === "." || p === "..")) return false;
  return !(parts.length === 1 && (rel === READY_MARKER || rel === MANIFEST_FILE));
}

export type RangeAsk =
  { kind: "full" } | { kind: "range"; start: number; end: number } | { kind: "unsatisfiable" };

/** One `Range: bytes=...` header against a file of `size` bytes (RFC 9110 14.1.2). Several ranges
 * or another unit are ignored (a server may always answer with the whole file). */
export function parseRange(header: string | undefined, size: number): RangeAsk {
  if (header === undefined) return { kind: "full" };
  const m = /^bytes=(\d*)-(\d*)$/.exec(header.trim());
  if (!m || (m[1] === "" && m[2] === "")) return { kind: "full" };
  if (m[1] === "") {
    const suffix = Number(m[2]);
    if (suffix === 0 || size === 0) return { kind: "unsatisfiable" };
    return { kind: "range", start: Math.max(0, size - suffix), end: size - 1 };
  }
  const start = Number(m[1]);
  if (start >= size) return { kind: "unsatisfiable" };
  const end = m[2] === "" ? size - 1 : Math.min(Number(m[2]), size - 1);
  if (end < start) return { kind: "full" };
  return { kind: "range", start, end };
}

/** What a source says about each entry of its committed tree beyond the manifest: the kind,
 * mode, owner and nanosecond times (decimal strings) of every directory, file and symlink. */
export const TreeMetaSchema = z.object({
  hash: z.string(),
  entries: z.array(
    z.object({
      path: z.string(),
      pathBytes: z
        .string()
        .regex(/^[A-Za-z0-9+/]*={0,2}$/)
        .optional(),
      kind: z.enum(["dir", "file", "symlink"]),
      mode: z.number().int().min(0).max(0o7777),
      uid: z.number().int().nonnegative(),
      gid: z.number().int().nonnegative(),
      atimeNs: z.string().regex(/^-?\d{1,25}$/),
      mtimeNs: z.string().regex(/^-?\d{1,25}$/),
    }),
  ),
});
export type TreeMeta = z.infer<typeof TreeMetaSchema>;

const MAX_META_BYTES = 512 * 1024 * 1024;

/**
 * The most bytes the metadata of a tree with this manifest can take: a line per entry of the
 * manifest (its path again, escaped alike, plus fixed fields) and one per directory (a path of at
 * most PATH_MAX). A source sending more is not sending this tree's metadata.
 */
export function metaLimit(m: Manifest): number {
  const names =
    m.files.reduce((n, f) => n + f.path.length + (f.pathBytes?.length ?? 0), 0) +
    m.symlinks.reduce((n, l) => n + l.path.length + (l.pathBytes?.length ?? 0), 0);
  const entries = m.files.length + m.symlinks.length + m.dirCount + 1;
  return Math.min(MAX_META_BYTES, 6 * names + entries * 256 + (m.dirCount + 1) * 6 * 4096 + (1 << 20));
}

export interface EntryMeta {
  mode: number;
  uid: number;
  gid: number;
  atimeNs: bigint;
  mtimeNs: bigint;
}

/** A regular file whose data is fetched (a hard link's first name). */
export interface PlannedFile {
  rel: string;
  size: number;
  digest: string;
  meta: EntryMeta;
}

export interface Chunk {
  /** Index into TreePlan.chunks (what a have bitmap counts). */
  index: number;
  /** Index into TreePlan.files. */
  file: number;
  offset: number;
  length: number;
}

export interface TreePlan {
  digest: DigestAlgorithm;
  /** Every directory but the root, parents before children. */
  dirs: { rel: string; meta: EntryMeta }[];
  root: EntryMeta;
  files: PlannedFile[];
  /** Further names of a file's inode: `rel` is made a hard link to `to`. */
  links: { rel: string; to: string }[];
  symlinks: { rel: string; target: string; meta: EntryMeta }[];
  chunks: Chunk[];
  totalBytes: number;
}

const parentOf = (rel: string): string => {
  const i = rel.lastIndexOf("/");
  return i < 0 ? "" : rel.slice(0, i);
};

/**
 * Checks a manifest fetched from a peer for the tree of `hash`; throws with the first problem
 * found. The digest says the manifest is the leader's; this makes sure nothing in it can lead a
 * write out of the staging folder or describe an impossible tree.
 */
export function checkManifest(m: Manifest, hash: string): void {
  if (m.hash !== hash) throw new Error(`the manifest is for ${m.hash || "no hash"}, not ${hash}`);
  if (!digestAvailable(m.digest)) throw new Error(`this node cannot compute ${m.digest} digests`);
  if (m.fileCount !== m.files.length) throw new Error("the manifest's fileCount is not its file list");
  const empty = digestOf(m.digest, "");
  const seen = new Set<string>();
  const data = new Map<string, { size: number; digest: string }>();
  let total = 0;
  for (const f of m.files) {
    const rel = nameOf(f.path, f.pathBytes);
    if (!safeRel(rel) || seen.has(rel))
      throw new Error(`the manifest lists a bad or repeated path: ${f.path}`);
    seen.add(rel);
    // An empty file is never fetched, so its digest is checked here.
    if (f.size === 0 && f.digest !== empty) throw new Error(`empty file ${f.path} has another digest`);
    if (f.linkTo === undefined) {
      data.set(rel, f);
      total += f.size;
    }
  }
  for (const f of m.files) {
    if (f.linkTo === undefined) continue;
    const to = data.get(nameOf(f.linkTo, f.linkToBytes));
    if (!to || to.size !== f.size || to.digest !== f.digest)
      throw new Error(`hard link ${f.path} names no file of its size and digest`);
  }
  if (total !== m.totalBytes) throw new Error("the manifest's totalBytes is not the sum of its files");
  const links = new Map<string, string>();
  for (const s of m.symlinks) {
    const rel = nameOf(s.path, s.pathBytes);
    if (!safeRel(rel) || seen.has(rel))
      throw new Error(`the manifest lists a bad or repeated path: ${s.path}`);
    seen.add(rel);
    links.set(rel, nameOf(s.target, s.targetBytes));
  }
  for (const [rel, target] of links)
    if (target === "" || target.includes("\0") || !staysInside(rel, target, links))
      throw new Error(`symlink ${rel} leads out of the tree`);
}

const metaOf = (e: TreeMeta["entries"][number]): EntryMeta => ({
  mode: e.mode,
  uid: e.uid,
  gid: e.gid,
  atimeNs: BigInt(e.atimeNs),
  mtimeNs: BigInt(e.mtimeNs),
});

/**
 * The work of replicating a checked manifest: directories from the source's metadata (the
 * manifest counts them but does not list them), files cut into chunks of `chunkBytes`, hard
 * links and symlinks. The metadata must describe exactly the manifest's tree: every listed file
 * and symlink with its kind, nothing unlisted, every parent a directory, `dirCount` directories.
 */
export function planTree(m: Manifest, meta: TreeMeta, chunkBytes: number): TreePlan {
  if (!Number.isInteger(chunkBytes) || chunkBytes < 1)
    throw new Error(`chunkBytes must be a positive integer`);
  if (meta.hash !== m.hash) throw new Error("the metadata is for another tree");
  const byRel = new Map<string, TreeMeta["entries"][number]>();
  for (const e of meta.entries) {
    const rel = nameOf(e.path, e.pathBytes);
    if ((rel !== "" && !safeRel(rel)) || byRel.has(rel))
      throw new Error(`bad or repeated metadata path ${e.path}`);
    byRel.set(rel, e);
  }
  const rootEntry = byRel.get("");
  if (rootEntry?.kind !== "dir") throw new Error("the metadata has no root directory");
  for (const rel of byRel.keys())
    if (rel !== "" && byRel.get(parentOf(rel))?.kind !== "dir")
      throw new Error(`metadata path ${rel} has no parent directory`);
  const dirs = [...byRel].filter(([rel, e]) => rel !== "" && e.kind === "dir");
  if (dirs.length + 1 !== m.dirCount)
    throw new Error(`the metadata has ${dirs.length + 1} directories, the manifest ${m.dirCount}`);
  const want = (rel: string, kind: "file" | "symlink"): EntryMeta => {
    const e = byRel.get(rel);
    if (e?.kind !== kind) throw new Error(`the metadata does not list ${rel} as a ${kind}`);
    return metaOf(e);
  };

  const files: PlannedFile[] = [];
  const links: TreePlan["links"] = [];
  const chunks: Chunk[] = [];
  for (const f of m.files) {
    const rel = nameOf(f.path, f.pathBytes);
    const fm = want(rel, "file");
    if (f.linkTo !== undefined) {
      links.push({ rel, to: nameOf(f.linkTo, f.linkToBytes) });
      continue;
    }
    const index = files.push({ rel, size: f.size, digest: f.digest, meta: fm }) - 1;
    for (let offset = 0; offset < f.size; offset += chunkBytes)
      chunks.push({
        index: chunks.length,
        file: index,
        offset,
        length: Math.min(chunkBytes, f.size - offset),
      });
  }
  const symlinks = m.symlinks.map((s) => {
    const rel = nameOf(s.path, s.pathBytes);
    return { rel, target: nameOf(s.target, s.targetBytes), meta: want(rel, "symlink") };
  });
  const listed = files.length + links.length + symlinks.length;
  if (listed + dirs.length + 1 !== byRel.size)
    throw new Error("the metadata lists entries the manifest does not");
  const depth = (rel: string): number => rel.split("/").length;
  return {
    digest: m.digest,
    root: metaOf(rootEntry),
    dirs: dirs.map(([rel, e]) => ({ rel, meta: metaOf(e) })).sort((a, b) => depth(a.rel) - depth(b.rel)),
    files,
    links,
    symlinks,
    chunks,
    totalBytes: m.totalBytes,
  };
}

/** What the receiver knows of one source when it picks where the next chunk goes. */
export interface SourceLoad {
  alive: boolean;
  /** Our requests to it now. */
  inflight: number;
  /** Streams it last said it was sending to others. */
  others: number;
  /** Bytes it has sent us so far. */
  bytes: number;
}

/**
 * The least busy live source: fewest streams in total (ours plus what it serves others), then
 * fewest of ours, then fewest bytes sent to us, so work spreads over equal sources. `avoid`
 * sources are taken only when nothing else is left. Returns an index, or undefined.
 */
export function pickSource(
  loads: readonly SourceLoad[],
  avoid: ReadonlySet<number> = new Set(),
): number | undefined {
  let best: number | undefined;
  const key = (i: number): [number, number, number, number] => {
    const l = loads[i] as SourceLoad;
    return [avoid.has(i) ? 1 : 0, l.inflight + l.others, l.inflight, l.bytes];
  };
  for (let i = 0; i < loads.length; i++) {
    if (!loads[i]?.alive) continue;
    if (best === undefined) {
      best = i;
      continue;
    }
    const a = key(i);
    const b = key(best);
    for (let k = 0; k < a.length; k++) {
      if ((a[k] as number) === (b[k] as number)) continue;
      if ((a[k] as number) < (b[k] as number)) best = i;
      break;
    }
  }
  return best;
}
