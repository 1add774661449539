/**
 * What replicateTree takes and gives back (receiver.ts), and how it fails.
 */
import type { Logger } from "../../common/log.js";
import type { ReplicationMetrics } from "../metrics.js";
import type { FillingTree, TlsMaterial } from "./server.js";
import type { DropReason } from "./source.js";

/** The drop reasons that mean a peer served another tree than the record's. */
export type TamperReason = Extract<DropReason, "manifest" | "corrupt">;
export const TAMPER_REASONS: ReadonlySet<DropReason> = new Set<TamperReason>(["manifest", "corrupt"]);

export interface ReplicaSource {
  /** The node holding a committed copy (for logs and metrics). */
  node: string;
  /** Its peer server's base URL, `https://<address>:<port>`. */
  url: string;
  /** A copy still filling: it serves the chunks it holds, and says which (have.ts). */
  filling?: boolean;
}

export interface ReplicateOptions {
  /** The full hash of the tree. */
  hash: string;
  /** sha256 (hex) of the manifest's bytes, from the record (manifestDigestOf on the leader). */
  expectedManifestDigest: string;
  sources: readonly ReplicaSource[];
  /** This node's store: the tree lands at `<storeDir>/<short>`. */
  storeDir: string;
  tls: TlsMaterial;
  /** Chunks in flight at once, over all sources (default 8). */
  streams?: number;
  /** Bytes per ranged request (default 16 MiB). */
  chunkBytes?: number;
  /** A request that receives nothing for this long drops its source (default 30 s). */
  stallMs?: number;
  /** Flush the tree to disk before it is committed (default true). */
  durable?: boolean;
  signal?: AbortSignal;
  /** Called once at the start with a function that adds a source (a copy that appeared in the
   * record, or one that committed since it was given as filling); returns an unsubscribe. */
  watchSources?: (add: (s: ReplicaSource) => void) => () => void;
  /** Called once the staging folder exists, so this node serves what it holds while it fills
   * (PeerServer.serveFilling); returns the function that stops it, called before the commit. */
  serveFilling?: (tree: FillingTree) => () => void;
  /** Where in the tree this node starts, 0 to 1 (default 0): nodes filling at once start apart. */
  startAt?: number;
  /** How often a filling source not heard from is asked what it holds (default 500 ms). */
  havePollMs?: number;
  onProgress?: (p: { doneBytes: number; totalBytes: number }) => void;
  /** A source served a tree other than the record's (a manifest off the digest, bytes off the
   * manifest): tampering, not a fault; the source is dropped and this says so (once per source). */
  onTampered?: (t: { source: string; reason: TamperReason; message: string }) => void;
  log?: Logger;
  metrics?: ReplicationMetrics;
}

export interface ReplicateResult {
  hash: string;
  dest: string;
  /** True when the store already held this tree: nothing was fetched. */
  present: boolean;
  /** Data bytes of the tree. */
  totalBytes: number;
  /** Bytes received, re-fetches included. */
  receivedBytes: number;
  bySource: Record<string, number>;
  dropped: { node: string; reason: DropReason }[];
  durationMs: number;
  bytesPerSecond: number;
}

/** The replication failed; nothing was committed. */
export class ReplicationError extends Error {
  constructor(
    message: string,
    readonly dropped: { node: string; reason: DropReason }[] = [],
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}
