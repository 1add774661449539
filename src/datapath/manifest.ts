/**
 * The manifest written into every captured tree (MANIFEST_FILE). It describes the tree, never the
 * pod: no env values, no args, nothing that could hold a secret. The schema is the one place
 * that says what a manifest holds; readers parse with it so a damaged file is a clear error.
 */
import { readFile } from "node:fs/promises";
import { z } from "zod";
import { MANIFEST_FILE } from "../core/contract.js";

export const MANIFEST_VERSION = 1;

const count = z.object({ files: z.number().int().nonnegative(), bytes: z.number().int().nonnegative() });

export const ManifestSchema = z.object({
  version: z.literal(MANIFEST_VERSION),
  hash: z.string(),
  model: z.string(),
  createdAt: z.string(),
  /** How the kernel copied the data: shared extents, in-kernel copy, or read/write. */
  captureMethod: z.enum(["reflink", "copy_file_range", "copy"]),
  /** True when access and modification times were set to the nanosecond. */
  exactTimes: z.boolean(),
  /** Regular file paths, hard links included. */
  fileCount: z.number().int().nonnegative(),
  /** Data bytes copied: each hard-linked inode counted once. */
  totalBytes: z.number().int().nonnegative(),
  dirCount: z.number().int().nonnegative(),
  /** `model/` (the hub cache), `cache/` (compile caches) and anything else at the root. */
  split: z.object({ model: count, cache: count, other: count }),
  files: z.array(
    z.object({
      path: z.string(),
      size: z.number().int().nonnegative(),
      sha256: z.string().regex(/^[0-9a-f]{64}$/),
      /** Set on a hard link: the path of the first name of the same inode in the tree. */
      linkTo: z.string().optional(),
    }),
  ),
  symlinks: z.array(z.object({ path: z.string(), target: z.string() })),
  skipped: z.array(
    z.object({
      path: z.string(),
      reason: z.enum(["fifo", "socket", "char-device", "block-device", "vanished", "reserved"]),
    }),
  ),
  /** Wall times of each phase. The digest runs alongside the copy: digestMs is the time spent
   * hashing, summed over the parallel copies, so it overlaps copyMs. */
  timings: z.object({
    scanMs: z.number(),
    copyMs: z.number(),
    digestMs: z.number(),
    commitMs: z.number(),
    totalMs: z.number(),
  }),
});

export type Manifest = z.infer<typeof ManifestSchema>;
export type Area = keyof Manifest["split"];

/** Which part of the cache root a relative path belongs to. */
export function areaOf(rel: string): Area {
  if (rel === "model" || rel.startsWith("model/")) return "model";
  if (rel === "cache" || rel.startsWith("cache/")) return "cache";
  return "other";
}

/** Reads and validates `<dir>/MANIFEST_FILE`. */
export async function readManifest(dir: string): Promise<Manifest> {
  const path = `${dir}/${MANIFEST_FILE}`;
  let raw: unknown;
  try {
    raw = JSON.parse(await readFile(path, "utf8"));
  } catch (err) {
    throw new Error(`cannot read manifest ${path}: ${(err as Error).message}`, { cause: err });
  }
  const parsed = ManifestSchema.safeParse(raw);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw new Error(`manifest ${path} is not valid: ${issue?.path.join(".") ?? ""} ${issue?.message ?? ""}`);
  }
  return parsed.data;
}
