/**
 * Which files of a captured tree a restored pod reads from the read-only volume itself. Seed
 * (seed.ts) links these into the pod's shadow and copies the rest; prewarm run after it
 * (`--seeded`) warms only these, since the copied ones were just read by the seed and the engine
 * reads its own copies of them.
 */

/** The folder of the tree that holds what is used in place. */
export const IN_PLACE_ROOT = "model";

/**
 * Files under `model/` that are used in place; the rest of the tree is copied. Copied too, because
 * the hub client rewrites them: the hub cache's `.locks` and `refs`, and a local folder's own
 * download metadata (`.cache/huggingface/`, a storage initializer's `local_dir`) and lock files.
 */
export function usedInPlace(rel: string): boolean {
  if (!rel.startsWith(`${IN_PLACE_ROOT}/`)) return false;
  const parts = rel.split("/");
  const localDirMeta = parts.some((p, i) => p === ".cache" && parts[i + 1] === "huggingface");
  return !parts.includes(".locks") && !parts.includes("refs") && !localDirMeta && !rel.endsWith(".lock");
}
