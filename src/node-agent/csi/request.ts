/**
 * What the `store.warmstart.dev` driver accepts, and what a publish does, without any I/O: the
 * volume handle (the full cache hash, strictly), the fields a publish and an unpublish need, and
 * the decision a publish takes from what the node holds and what is mounted at the target.
 *
 * Every request comes from the kubelet, but the handle comes from a PersistentVolume anyone with
 * rights on PVs may write: it is checked to be exactly 64 lower-case hex digits before it names
 * anything on disk, so it can never reach a staging folder, the store root or outside the store.
 */
import { isAbsolute, normalize } from "node:path";
import { status } from "@grpc/grpc-js";

/** A gRPC error with the status code CSI asks for. */
export class CsiError extends Error {
  constructor(
    readonly code: status,
    message: string,
  ) {
    super(message);
    this.name = "CsiError";
  }
}

export const invalid = (message: string): CsiError => new CsiError(status.INVALID_ARGUMENT, message);

const FULL_HASH = /^[0-9a-f]{64}$/;

/** The full cache hash a volume handle names; INVALID_ARGUMENT for anything else. */
export function parseVolumeHandle(handle: unknown): string {
  if (typeof handle !== "string" || handle === "") throw invalid("volume_id is required");
  if (!FULL_HASH.test(handle))
    throw invalid(
      `volume_id must be a full cache hash (64 lower-case hex digits), got ${JSON.stringify(handle.slice(0, 80))}`,
    );
  return handle;
}

/** An absolute, normalized path without NUL or `..` (the kubelet's target paths are). */
export function parseTargetPath(path: unknown, field = "target_path"): string {
  if (typeof path !== "string" || path === "") throw invalid(`${field} is required`);
  if (path.includes("\0")) throw invalid(`${field} holds a NUL byte`);
  if (!isAbsolute(path)) throw invalid(`${field} must be absolute, got ${JSON.stringify(path)}`);
  if (path.split("/").includes("..")) throw invalid(`${field} must not hold "..": ${JSON.stringify(path)}`);
  const clean = normalize(path);
  return clean.length > 1 && clean.endsWith("/") ? clean.slice(0, -1) : clean;
}

export interface PublishRequest {
  hash: string;
  target: string;
  /** What the request asked, for the log only: the mount is read-only whatever it says. */
  asked: { readonly: boolean; accessMode: string };
}

type Req = Record<string, unknown>;

interface Capability {
  mount?: unknown;
  block?: unknown;
  access_type?: string;
  access_mode?: { mode?: string } | null;
}

/**
 * The fields of a NodePublishVolume, checked in the order csi-sanity expects (volume id, target
 * path, capability). Only filesystem volumes exist here; whatever the request's `readonly` flag,
 * mount flags or access mode, the publish is read-only (SPEC 1.9), so they are not refused, only
 * ignored.
 */
export function publishRequest(r: Req): PublishRequest {
  if (typeof r.volume_id !== "string" || r.volume_id === "") throw invalid("volume_id is required");
  const target = parseTargetPath(r.target_path);
  const cap = r.volume_capability as Capability | null | undefined;
  if (!cap) throw invalid("volume_capability is required");
  if (cap.block || cap.access_type === "block")
    throw invalid("block volumes are not supported: store.warmstart.dev publishes a folder");
  if (!cap.mount && cap.access_type !== "mount")
    throw invalid("volume_capability needs an access type (mount)");
  const hash = parseVolumeHandle(r.volume_id);
  return {
    hash,
    target,
    asked: { readonly: r.readonly === true, accessMode: cap.access_mode?.mode ?? "UNKNOWN" },
  };
}

/**
 * The fields of a NodeUnpublishVolume. Only its target counts: whatever the volume id (even one
 * this driver would never have published), what is mounted there goes, so a pod is never stuck
 * terminating.
 */
export function unpublishRequest(r: Req): { target: string } {
  if (typeof r.volume_id !== "string" || r.volume_id === "") throw invalid("volume_id is required");
  return { target: parseTargetPath(r.target_path) };
}

/** What is mounted at a publish's target now (the topmost mount, when there are several). */
export type TargetMount =
  | { kind: "none" }
  /** The volume's own committed tree (same device and inode as its root). */
  | { kind: "tree"; readOnly: boolean }
  /** Anything else. */
  | { kind: "other"; source: string };

export type PublishAction =
  /** Mounted already, read-only: nothing to do (a retried publish). */
  | "done"
  /** Our tree is bound there but writable (a publish cut short between its two steps). */
  | "remount-read-only"
  /** Something else is mounted at the target: ALREADY_EXISTS, never mounted over. */
  | "conflict"
  /** The tree is committed here: bind it, then make the bind read-only. */
  | "mount"
  /** The node lacks the committed tree: have it (replication), then mount it. */
  | "fetch-then-mount";

export function decidePublish(s: { committed: boolean; mount: TargetMount }): PublishAction {
  switch (s.mount.kind) {
    case "tree":
      return s.mount.readOnly ? "done" : "remount-read-only";
    case "other":
      return "conflict";
    case "none":
      return s.committed ? "mount" : "fetch-then-mount";
  }
}
