/**
 * Where a promoted cache lives, recorded on its ModelCache (annotation ANN_CACHE_SOURCE) before it
 * turns Ready. It carries everything a later caller needs to mint claim `rox-<short>` in another
 * namespace (the webhook at admission, the node agent on resync), frozen at promote time so every
 * namespace gets the same volume whatever happens to the profiles afterwards.
 */
import { z } from "zod";
import { ANN_CACHE_SOURCE } from "../core/contract.js";
import { BACKENDS } from "./profiles.js";

export const CacheSourceSchema = z.object({
  backend: z.enum(BACKENDS),
  /** The profile key it was promoted under (for the restore's prewarm policy). */
  provisioner: z.string().min(1),
  volumeType: z.string().optional(),
  /** Data bytes of the tree (claims request at least this). */
  sizeBytes: z.number().int().nonnegative(),
  storageClassName: z.string().default(""),
  mountOptions: z.array(z.string()).default([]),
  /** host-path: the node holding the tree and the tree's absolute path there. */
  node: z.string().optional(),
  path: z.string().optional(),
  hostPathType: z.enum(["local", "hostPath"]).optional(),
  /** shared-volume: the store volume's CSI identity and the tree's directory inside it. */
  driver: z.string().optional(),
  /** node-store: the cache's full hash, the handle of every namespace's volume. */
  volumeHandle: z.string().optional(),
  fsType: z.string().optional(),
  /** The store volume's own CSI attributes, copied as they are. */
  volumeAttributes: z.record(z.string(), z.string()).optional(),
  /** The profile's extra attributes and handle, rendered per namespace. */
  attributeTemplates: z.record(z.string(), z.string()).optional(),
  handleTemplate: z.string().optional(),
  /** The tree's directory relative to the volume root ("" when the tree is the root). */
  subPath: z.string().optional(),
  /** shared-volume: each namespace's volume is the tree's folder itself (the profile narrows to it). */
  treeAtRoot: z.boolean().optional(),
  /** snapshot-clone: the snapshot every namespace's clone is pre-provisioned from. */
  snapshotHandle: z.string().optional(),
  snapshotClass: z.string().optional(),
  restoreSize: z.string().optional(),
});
export type CacheSource = z.infer<typeof CacheSourceSchema>;

/** The source recorded on a cache object, or undefined when none (or an unreadable one) is there. */
export function sourceOf(cache: {
  metadata?: { annotations?: Record<string, string> };
}): CacheSource | undefined {
  const raw = cache.metadata?.annotations?.[ANN_CACHE_SOURCE];
  if (!raw) return undefined;
  try {
    const parsed = CacheSourceSchema.safeParse(JSON.parse(raw));
    return parsed.success ? parsed.data : undefined;
  } catch {
    return undefined;
  }
}

export const encodeSource = (s: CacheSource): string => JSON.stringify(s);

/**
 * The tree's folder inside the volume a restore mounts: host-path and node-store volumes and
 * narrowed shared volumes are the tree itself ("." — the kubelet takes an empty expanded subPath
 * for a missing value).
 */
export function treeSubPath(source: CacheSource): string {
  const atRoot = source.backend === "host-path" || source.backend === "node-store" || source.treeAtRoot;
  return (atRoot ? "" : source.subPath) || ".";
}
