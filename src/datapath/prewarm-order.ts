/**
 * The order a prewarm reads a tree in: the order an engine loads it. Config, tokenizer and
 * weight-index files first (small, and the first thing an engine opens), then the weight shards
 * an index names, in the order transformers and vLLM load them (the index's file names, sorted),
 * then every other file in walk order (directory order, close to the order on disk).
 *
 * A hub cache names its files through symlinks (`snapshots/<rev>/config.json` ->
 * `../../blobs/<digest>`), and only the blobs are read, so a file's names are its own and those
 * of the symlinks in the tree that point at it.
 */
import {
  closeSync,
  fstatSync,
  constants as fsc,
  openSync,
  readdirSync,
  readlinkSync,
  readSync,
} from "node:fs";
import { dirname, resolve } from "node:path";

/** Read first: what an engine opens before any weight. */
const META_NAMES = new Set(["merges.txt", "vocab.txt", "tokenizer.model", "spiece.model"]);
const isMeta = (name: string): boolean =>
  name.endsWith(".json") ||
  name.startsWith("tokenizer") ||
  name.endsWith(".tiktoken") ||
  META_NAMES.has(name);
const isIndex = (name: string): boolean => name.endsWith(".index.json");
/** An index bigger than this is not an index anyone wrote by hand or by a library: ignored. */
const MAX_INDEX_BYTES = 16 << 20;

export interface Listing {
  /** Regular files, in walk order. */
  files: string[];
  /** Symlinks in the tree that lead to one of `files`: link path -> file path. */
  aliases: Map<string, string>;
}

/**
 * Every regular file under `dir` (symlinks not followed: their targets in the tree are listed
 * themselves), depth first in directory order, and the symlinks that name one of them.
 */
export function listTree(dir: string, note: (path: string, err: unknown) => void): Listing {
  const files: string[] = [];
  const links: string[] = [];
  const walk = (d: string): void => {
    let entries;
    try {
      entries = readdirSync(d, { withFileTypes: true });
    } catch (err) {
      note(d, err);
      return;
    }
    for (const e of entries) {
      const p = `${d}/${e.name}`;
      if (e.isDirectory()) walk(p);
      else if (e.isFile()) files.push(p);
      else if (e.isSymbolicLink()) links.push(p);
    }
  };
  walk(dir);
  const known = new Set(files);
  const aliases = new Map<string, string>();
  for (const l of links) {
    try {
      const target = resolve(dirname(l), readlinkSync(l));
      if (known.has(target)) aliases.set(l, target);
    } catch {
      // A link that went away or cannot be read only loses its name for the ordering.
    }
  }
  return { files, aliases };
}

/** Parses a weight index (`weight_map: { tensor: file }`); its file names, sorted, or none. */
function indexedFiles(path: string): string[] {
  let fd: number | undefined;
  try {
    fd = openSync(path, fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK);
    const size = fstatSync(fd).size;
    if (size > MAX_INDEX_BYTES) return [];
    const buf = Buffer.alloc(size);
    for (let off = 0; off < size;) {
      const n = readSync(fd, buf, off, size - off, off);
      if (n === 0) break;
      off += n;
    }
    const map = (JSON.parse(buf.toString("utf8")) as { weight_map?: unknown }).weight_map;
    if (typeof map !== "object" || map === null) return [];
    const names = new Set<string>();
    for (const v of Object.values(map)) if (typeof v === "string") names.add(v);
    return [...names].sort();
  } catch {
    return [];
  } finally {
    if (fd !== undefined) closeSync(fd);
  }
}

/** The files of `listing` in the order an engine loads them (see the module comment). */
export function loadOrder(listing: Listing): string[] {
  // The names other than its own that a file goes by: those of the links that lead to it.
  const linksTo = new Map<string, string[]>();
  for (const [link, file] of listing.aliases) {
    const l = linksTo.get(file);
    if (l) l.push(link);
    else linksTo.set(file, [link]);
  }
  const known = new Set(listing.files);
  const fileOf = (p: string): string | undefined => (known.has(p) ? p : listing.aliases.get(p));
  const nameOf = (p: string): string => p.slice(p.lastIndexOf("/") + 1);

  const shardRank = new Map<string, number>();
  const rank = (file: string, indexPath: string): void => {
    for (const shard of indexedFiles(file)) {
      const f = fileOf(resolve(dirname(indexPath), shard));
      if (f !== undefined && !shardRank.has(f)) shardRank.set(f, shardRank.size);
    }
  };
  for (const f of listing.files) {
    if (isIndex(nameOf(f))) rank(f, f);
    for (const l of linksTo.get(f) ?? []) if (isIndex(nameOf(l))) rank(f, l);
  }
  const meta: string[] = [];
  const rest: string[] = [];
  for (const f of listing.files) {
    if (shardRank.has(f)) continue;
    const isM = isMeta(nameOf(f)) || (linksTo.get(f)?.some((l) => isMeta(nameOf(l))) ?? false);
    (isM ? meta : rest).push(f);
  }
  return [...meta, ...shardRank.keys(), ...rest];
}
