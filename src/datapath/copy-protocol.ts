/**
 * What the capture's main thread and its copier threads (copy-worker.ts) say to each other.
 * Kept apart from the worker so that importing it never runs the worker's code.
 */
import type { SkipReason } from "./beneath.js";
import type { DigestAlgorithm } from "./digest.js";

export interface CopyMember {
  /** A byte string (beneath.ts). */
  rel: string;
  atimeNs: bigint;
  mtimeNs: bigint;
  size: bigint;
  /** The inode the walk saw: what is opened must still be it. */
  dev: bigint;
  ino: bigint;
}

/** One inode: the first name is copied, the others become hard links to it. */
export type CopyTask = CopyMember[];

export interface CopyWorkerData {
  /** The source tree's root, opened by the main thread (descriptors are shared by threads). */
  rootFd: number;
  /** The staging directory, a byte string. */
  staging: string;
  chunkBytes: number;
  /** Clone (reflink) where the probe found the filesystem shares extents; otherwise the clone
   * attempt is skipped, since it would fail on every file. */
  clone: boolean;
  digest: DigestAlgorithm;
  /** The capture is flushed before commit: start each file's writeback as soon as it is copied,
   * so the disk writes while the copy goes on and the capture's one syncfs has little left to
   * wait for; without the native helpers (no syncfs), fsync each file instead. */
  durable: boolean;
  /** Write big files with O_DIRECT where the filesystem takes it (copy-worker.ts). */
  direct: boolean;
  /** Walk component by component even where openat2 exists. */
  noOpenat2: boolean;
  /** Ask the main thread before opening each file (a test hook), and wait for its answer. */
  askBeforeOpen: boolean;
  /** Int32 [files done], Int32 [stop: set when the capture must end now], BigInt64 [bytes read],
   * shared by every copier, for the progress line and the stop. */
  counters: SharedArrayBuffer;
  /** Int32 [hook answered]: this copier's own, so an answer to another copier never wakes it. */
  hook: SharedArrayBuffer;
}

export interface CopiedFile {
  /** A byte string. */
  path: string;
  size: number;
  digest: string;
  linkTo?: string;
}

export type FromWorker =
  | { kind: "more" }
  | { kind: "beforeOpen"; rel: string }
  | {
      kind: "done";
      files: CopiedFile[];
      skipped: { path: string; reason: SkipReason }[];
      digestMs: number;
      /** Bytes this copier wrote with O_DIRECT. */
      directBytes: number;
    }
  | { kind: "error"; message: string }
  | { kind: "stopped" };

/** Offsets into CopyWorkerData.counters. */
export const COUNTERS = { bytes: 16, files: 0, size: 24, stop: 4 } as const;
