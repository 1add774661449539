/**
 * The manifest written into every captured tree (MANIFEST_FILE). It describes the tree, never the
 * pod: no env values, no args, nothing that could hold a secret. The schema is the one place
 * that says what a manifest holds; readers parse with it so a damaged file is a clear error.
 */
import { isUtf8 } from "node:buffer";
import { readFile } from "node:fs/promises";
import { z } from "zod";
import { MANIFEST_FILE } from "../core/contract.js";

/** 2: digests name their algorithm (BLAKE3 by default); names that are not UTF-8 carry their
 * bytes. Version 1 manifests (sha256 digests) are still read, converted to this shape. */
export const MANIFEST_VERSION = 2;

const count = z.object({ files: z.number().int().nonnegative(), bytes: z.number().int().nonnegative() });
const hex64 = z.string().regex(/^[0-9a-f]{64}$/);
/** Base64 of a name's bytes, present only when they are not valid UTF-8 (the plain field then
 * shows them with U+FFFD and is for people, not for finding the file). */
const rawBytes = z
  .string()
  .regex(/^[A-Za-z0-9+/]*={0,2}$/)
  .optional();
const skipReason = z.enum([
  "credential",
  "fifo",
  "socket",
  "char-device",
  "block-device",
  "vanished",
  "reserved",
  "outside",
  "replaced",
]);
const timings = z.object({
  scanMs: z.number(),
  copyMs: z.number(),
  digestMs: z.number(),
  commitMs: z.number(),
  totalMs: z.number(),
});
const common = {
  hash: z.string(),
  model: z.string(),
  createdAt: z.string(),
  /** How the kernel copied the data: shared extents, in-kernel copy, or read/write. */
  captureMethod: z.enum(["reflink", "copy_file_range", "copy"]),
  /** Bytes of big files written with O_DIRECT instead (absent in manifests from before it). */
  directBytes: z.number().int().nonnegative().optional(),
  /** True when access and modification times were set to the nanosecond. */
  exactTimes: z.boolean(),
  /** Regular file paths, hard links included. */
  fileCount: z.number().int().nonnegative(),
  /** Data bytes copied: each hard-linked inode counted once. */
  totalBytes: z.number().int().nonnegative(),
  /** Directories, the root included. */
  dirCount: z.number().int().nonnegative(),
  /** `model/` (the hub cache), `cache/` (compile caches) and anything else at the root. */
  split: z.object({ model: count, cache: count, other: count }),
  /** Wall times of each phase. The digest runs alongside the copy: digestMs is the time spent
   * hashing, summed over the parallel copies, so it overlaps copyMs. */
  timings,
};

export const ManifestSchema = z.object({
  version: z.literal(MANIFEST_VERSION),
  ...common,
  /** The algorithm of every `files[].digest`. */
  digest: z.enum(["blake3", "sha256"]),
  files: z.array(
    z.object({
      path: z.string(),
      pathBytes: rawBytes,
      size: z.number().int().nonnegative(),
      digest: hex64,
      /** Set on a hard link: the path of the first name of the same inode in the tree. */
      linkTo: z.string().optional(),
      linkToBytes: rawBytes,
    }),
  ),
  symlinks: z.array(
    z.object({ path: z.string(), pathBytes: rawBytes, target: z.string(), targetBytes: rawBytes }),
  ),
  /** What the capture left out, and why (nothing here ever fails a capture). */
  skipped: z.array(z.object({ path: z.string(), pathBytes: rawBytes, reason: skipReason })),
});

const ManifestV1Schema = z.object({
  version: z.literal(1),
  ...common,
  files: z.array(
    z.object({
      path: z.string(),
      size: z.number().int().nonnegative(),
      sha256: hex64,
      linkTo: z.string().optional(),
    }),
  ),
  symlinks: z.array(z.object({ path: z.string(), target: z.string() })),
  skipped: z.array(z.object({ path: z.string(), reason: skipReason })),
});

export type Manifest = z.infer<typeof ManifestSchema>;
export type Area = keyof Manifest["split"];

/** Which part of the cache root a relative path belongs to. */
export function areaOf(rel: string): Area {
  if (rel === "model" || rel.startsWith("model/")) return "model";
  if (rel === "cache" || rel.startsWith("cache/")) return "cache";
  return "other";
}

/** A name (a byte string, see beneath.ts) as manifest fields: `{ path }`, plus `pathBytes` when
 * the bytes are not UTF-8. `key` renames the pair (`target`/`targetBytes`...). */
export function nameFields<K extends string>(
  bin: string,
  key: K,
): Record<K, string> & Partial<Record<`${K}Bytes`, string>> {
  const b = Buffer.from(bin, "latin1");
  const out: Record<string, string> = { [key]: b.toString("utf8") };
  if (!isUtf8(b)) out[`${key}Bytes`] = b.toString("base64");
  return out as Record<K, string> & Partial<Record<`${K}Bytes`, string>>;
}

/** The byte string a manifest name stands for. */
export const nameOf = (plain: string, raw: string | undefined): string =>
  raw === undefined
    ? Buffer.from(plain, "utf8").toString("latin1")
    : Buffer.from(raw, "base64").toString("latin1");

/** Parses and validates manifest text; `where` names it in errors. Version 1 comes back converted. */
export function parseManifest(text: string, where: string): Manifest {
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new Error(`manifest ${where} is not valid JSON: ${(err as Error).message}`, { cause: err });
  }
  const v1 = (raw as { version?: unknown } | null)?.version === 1;
  const parsed = v1 ? ManifestV1Schema.safeParse(raw) : ManifestSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new Error(`manifest ${where} is not valid: ${issue?.path.join(".") ?? ""} ${issue?.message ?? ""}`);
  }
  if (!v1) return parsed.data as Manifest;
  const old = parsed.data as z.infer<typeof ManifestV1Schema>;
  return {
    ...old,
    version: MANIFEST_VERSION,
    digest: "sha256",
    files: old.files.map(({ sha256, ...f }) => ({ ...f, digest: sha256 })),
  };
}

/** Reads and validates `<dir>/MANIFEST_FILE`. */
export async function readManifest(dir: string): Promise<Manifest> {
  const path = `${dir}/${MANIFEST_FILE}`;
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (err) {
    throw new Error(`cannot read manifest ${path}: ${(err as Error).message}`, { cause: err });
  }
  return parseManifest(text, path);
}
