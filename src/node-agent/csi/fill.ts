/**
 * A tree this node lacks, filled from the peers the record names before the driver mounts it
 * (ADR 0010's receiver): room made under the store budget first, the copy checked against the
 * record's manifest digest, served to the other nodes while it fills (they find it, and its
 * progress, on the record), and nodes that start filling later are taken as sources too.
 */
import { PHASE } from "../../api/index.js";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { status } from "@grpc/grpc-js";
import { liveReplicas } from "../../api/modelcache.js";
import type { ModelCacheObject } from "../../common/modelcache.js";
import { shortHash } from "../../core/contract.js";
import { StoreFullError, type StoreBudget } from "../budget.js";
import type { NodeAgentConfig } from "../config.js";
import { postCacheEvent } from "../../common/events.js";
import { COMPONENT, dropFinalizerIfEmpty, type AgentParts } from "../parts.js";
import type { PeerServing } from "../peers.js";
import { replicateTree, type ReplicaSource } from "../replication/receiver.js";
import type { TlsMaterial } from "../replication/server.js";
import { CsiError } from "./request.js";

/** How often the record is looked at for new sources, and at most how often progress is written. */
const WATCH_MS = 1000;
const PROGRESS_MS = 2000;
/** Well inside STALE_FILLING_MS: a live fill's entry never looks stale. */
const HEARTBEAT_MS = 20_000;

/** What a fill needs beside the agent's parts: the store budget, and who to tell when it is done. */
export interface FillDeps {
  budget: Pick<StoreBudget, "makeRoom" | "release">;
  fetched: (short: string) => void;
  /** This node's peer server: a filling copy is served and recorded through it. */
  peers?: Pick<PeerServing, "serveFilling" | "recordFilling">;
}

/**
 * Where a replication of `hash` may come from, by the record (pure): its full hash, Ready, the
 * leader's manifest digest, and the copies other nodes recorded. A CsiError says why not.
 */
export function replicationSources(
  cache: ModelCacheObject | undefined,
  hash: string,
  node: string,
): { digest: string; sources: ReplicaSource[] } {
  const short = shortHash(hash);
  if (!cache || cache.spec.hash !== hash)
    throw new CsiError(status.NOT_FOUND, `no cache record holds hash ${short}...: nothing to fetch`);
  const phase = cache.metadata.deletionTimestamp ? "being deleted" : (cache.status?.phase ?? "new");
  if (phase !== PHASE.Ready)
    throw new CsiError(
      status.UNAVAILABLE,
      `cache ${short} is ${phase}, not Ready: its tree is not replicated`,
    );
  const digest = cache.status?.manifestDigest;
  if (!digest)
    throw new CsiError(
      status.FAILED_PRECONDITION,
      `cache ${short} has no manifest digest: a copy could not be checked, so none is fetched`,
    );
  const sources = recordedCopies(cache, node);
  if (!sources.length)
    throw new CsiError(status.UNAVAILABLE, `no other node has recorded a copy of cache ${short} yet`);
  return { digest, sources };
}

/** The copies other nodes recorded, committed or still filling (they serve what they hold). */
function recordedCopies(cache: ModelCacheObject | undefined, node: string): ReplicaSource[] {
  // The record is written by node agents only, but a URL that does not parse must not throw later.
  return liveReplicas(cache, Date.now())
    .filter(([n, r]) => n !== node && r.url.startsWith("https://") && URL.canParse(r.url))
    .map(([n, r]) => ({ node: n, url: r.url, ...(r.filling ? { filling: true } : {}) }));
}

async function peerTls(cfg: NodeAgentConfig, short: string): Promise<TlsMaterial> {
  if (!cfg.peerCert || !cfg.peerKey || !cfg.peerCa)
    throw new CsiError(
      status.FAILED_PRECONDITION,
      `this node lacks the tree of cache ${short} and has no peer certificate to fetch it (--peer-cert, --peer-key, --peer-ca)`,
    );
  // Read at each fetch: the files are a mounted Secret that may be renewed.
  const [cert, key, ca] = await Promise.all([cfg.peerCert, cfg.peerKey, cfg.peerCa].map((f) => readFile(f)));
  const tokenFile = cfg.peerTokenFile;
  return { cert: cert!, key: key!, ca: ca!, ...(tokenFile ? { token: () => readPeerToken(tokenFile) } : {}) };
}

/**
 * Replicates the committed tree of `hash` into the store from the nodes the record names, after
 * making room for it under the store budget as a capture does (unused caches go first; a store
 * that cannot hold it refuses the publish with RESOURCE_EXHAUSTED, and the kubelet retries).
 */
export async function fetchTree(
  p: AgentParts,
  hash: string,
  signal: AbortSignal,
  o: FillDeps,
): Promise<string> {
  const short = shortHash(hash);
  const cache = p.record(short);
  const { digest, sources } = replicationSources(cache, hash, p.cfg.node);
  const tls = await peerTls(p.cfg, short);
  const log = p.log.child({ component: "replication", hash: short });
  await o.budget.makeRoom(short, cache?.status?.sizeBytes ?? 0, log).catch((err: unknown) => {
    if (!(err instanceof StoreFullError)) throw err;
    const refused = new CsiError(
      status.RESOURCE_EXHAUSTED,
      `no room for cache ${short} in this node's store: ${err.message}`,
    );
    // A waiting follower tells a scope over its fair share from a full store by this.
    refused.cause = err;
    throw refused;
  });
  try {
    return await fill(p, { hash, short, digest, sources, tls, signal, log }, o);
  } finally {
    // Committed, it counts as stored (and the pod waiting for it keeps it); failed, it needs nothing.
    o.budget.release(short);
  }
}

async function fill(
  p: AgentParts,
  f: {
    hash: string;
    short: string;
    digest: string;
    sources: ReplicaSource[];
    tls: TlsMaterial;
    signal: AbortSignal;
    log: AgentParts["log"];
  },
  o: FillDeps,
): Promise<string> {
  const { hash, short, digest, sources, tls, signal, log } = f;
  // As before a capture: the record is not deleted while this store holds its tree unaccounted.
  await p.records.addFinalizer(short, p.finalizer);
  const m = p.metrics.replication;
  const progress = new ProgressOnRecord(p, short, o.peers);
  const r = await replicateTree({
    hash,
    expectedManifestDigest: digest,
    sources,
    storeDir: p.cfg.store,
    tls,
    durable: p.cfg.durable,
    signal,
    log,
    metrics: m,
    // Nodes filling at once start on different parts of the tree, and feed each other.
    startAt: parseInt(createHash("sha256").update(p.cfg.node).digest("hex").slice(0, 8), 16) / 2 ** 32,
    watchSources: (add) => {
      const look = (): void => {
        try {
          recordedCopies(p.record(short), p.cfg.node).forEach(add);
        } catch (err) {
          log.warn({ err }, "could not take a recorded copy as a source");
        }
      };
      const timer = setInterval(look, WATCH_MS);
      return () => clearInterval(timer);
    },
    ...(o.peers ? { serveFilling: (tree) => o.peers!.serveFilling(short, tree) } : {}),
    onTampered: ({ message }) => reportTampered(p, short, message),
    onProgress: ({ doneBytes, totalBytes }) => {
      m.fillingBytes.set({ hash: short }, doneBytes);
      m.fillingTotalBytes.set({ hash: short }, totalBytes);
      progress.report({ doneBytes, totalBytes });
    },
  })
    .catch(async (err: unknown) => {
      await progress.end(false);
      await dropFinalizerIfEmpty(p, hash);
      throw err;
    })
    .finally(() => {
      m.fillingBytes.remove({ hash: short });
      m.fillingTotalBytes.remove({ hash: short });
    });
  await progress.end(true);
  log.info(
    {
      present: r.present,
      bytes: r.totalBytes,
      seconds: r.durationMs / 1000,
      bySource: r.bySource,
      dropped: r.dropped,
    },
    r.present ? "the tree was here already" : "replicated the tree from peers",
  );
  o.fetched(short);
  return r.dest;
}

/**
 * A filling copy on the record (`status.replicas[<node>].filling`): where peers find it while it
 * fills and what `warmstart caches` shows. Written at most every PROGRESS_MS when chunks land, and
 * at least every HEARTBEAT_MS while the fill runs (a slow chunk must not make it look stale), one
 * write at a time; a failed fill takes its entry away, a committed one is left to the cache
 * reconciler, which records the checked copy in its place.
 */
class ProgressOnRecord {
  private writing: Promise<void> = Promise.resolve();
  private lastAt = 0;
  private last: { doneBytes: number; totalBytes: number } | undefined;
  private ended = false;
  private readonly heartbeat: NodeJS.Timeout | undefined;

  constructor(
    private readonly p: AgentParts,
    private readonly short: string,
    private readonly peers: FillDeps["peers"],
  ) {
    if (peers) {
      this.heartbeat = setInterval(() => this.last && this.write(this.last), HEARTBEAT_MS);
      this.heartbeat.unref();
    }
  }

  report(filling: { doneBytes: number; totalBytes: number }): void {
    this.last = filling;
    if (Date.now() - this.lastAt >= PROGRESS_MS) this.write(filling);
  }

  async end(committed: boolean): Promise<void> {
    this.ended = true;
    clearInterval(this.heartbeat);
    if (this.peers && this.lastAt && !committed)
      this.chain(() => this.p.records.setReplica(this.short, this.p.cfg.node, null));
    await this.writing;
  }

  private write(filling: { doneBytes: number; totalBytes: number }): void {
    if (!this.peers || this.ended) return;
    this.lastAt = Date.now();
    this.chain(() => this.peers!.recordFilling(this.p.records, this.short, filling));
  }

  private chain(write: () => Promise<void>): void {
    this.writing = this.writing
      .then(write)
      .catch((err: unknown) =>
        this.p.log.warn({ err, hash: this.short }, "could not record the fill's progress"),
      );
  }
}

/** The node agent's token as the kubelet last renewed it (read at most once a minute). */
function readPeerToken(file: string): string | undefined {
  const now = Date.now();
  if (peerToken?.file !== file || now - peerToken.at > 60_000) {
    try {
      peerToken = { file, at: now, token: readFileSync(file, "utf8").trim() };
    } catch {
      return peerToken?.file === file ? peerToken.token : undefined;
    }
  }
  return peerToken.token;
}
let peerToken: { file: string; at: number; token: string } | undefined;

/**
 * A tree that is not the record's, said as tampering (the receiver or the driver found it): a
 * TreeTampered Warning on the record; the caller logs it as an error and counts it.
 */
export function reportTampered(p: AgentParts, short: string, message: string): void {
  void postCacheEvent(p.core, p.record(short) ?? { metadata: { name: short } }, {
    type: "Warning",
    reason: "TreeTampered",
    message,
    component: COMPONENT,
  }).catch((err: unknown) => p.log.warn({ err, hash: short }, "could not post the TreeTampered Event"));
}
