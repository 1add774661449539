/**
 * The node agent's `store.warmstart.dev` driver, from its configuration and parts: on with
 * `--csi-plugin-dir`, registered in `<kubelet root>/plugins_registry` (or
 * `--csi-registration-dir`), and filling the store from peers before a publish when the node
 * lacks the tree (ADR 0010's receiver, given the peer certificate, key and CA).
 */
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { status } from "@grpc/grpc-js";
import type { ModelCacheObject } from "../../common/modelcache.js";
import { shortHash } from "../../core/contract.js";
import type { NodeAgentConfig } from "../config.js";
import { StoreFullError, type StoreBudget } from "../budget.js";
import { dropFinalizerIfEmpty, type AgentParts } from "../parts.js";
import { replicateTree, type ReplicaSource } from "../replication/receiver.js";
import type { TlsMaterial } from "../replication/server.js";
import { StoreDriver } from "./driver.js";
import { CsiError } from "./request.js";

/** What a fill needs beside the agent's parts: the store budget, and who to tell when it is done. */
export interface FillDeps {
  budget: Pick<StoreBudget, "makeRoom" | "release">;
  fetched: (short: string) => void;
}

/** The driver the agent serves, or undefined when `--csi-plugin-dir` is not given. */
export function storeDriverFor(p: AgentParts, o: FillDeps): StoreDriver | undefined {
  const { cfg } = p;
  if (!cfg.csiPluginDir) return undefined;
  return new StoreDriver({
    socket: join(cfg.csiPluginDir, "csi.sock"),
    registrationDir: cfg.csiRegistrationDir ?? join(cfg.kubeletRoot, "plugins_registry"),
    nodeId: cfg.node,
    store: p.store,
    ensureTree: (hash, signal) => fetchTree(p, hash, signal, o),
    log: p.log.child({ component: "csi" }),
  });
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
  if (phase !== "Ready")
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
  const sources = Object.entries(cache.status?.replicas ?? {})
    .filter(([n, r]) => n !== node && typeof r?.url === "string" && r.url.startsWith("https://"))
    .map(([n, r]) => ({ node: n, url: r.url }));
  if (!sources.length)
    throw new CsiError(status.UNAVAILABLE, `no other node has recorded a copy of cache ${short} yet`);
  return { digest, sources };
}

async function peerTls(cfg: NodeAgentConfig, short: string): Promise<TlsMaterial> {
  if (!cfg.peerCert || !cfg.peerKey || !cfg.peerCa)
    throw new CsiError(
      status.FAILED_PRECONDITION,
      `this node lacks the tree of cache ${short} and has no peer certificate to fetch it (--peer-cert, --peer-key, --peer-ca)`,
    );
  // Read at each fetch: the files are a mounted Secret that may be renewed.
  const [cert, key, ca] = await Promise.all([cfg.peerCert, cfg.peerKey, cfg.peerCa].map((f) => readFile(f)));
  return { cert: cert!, key: key!, ca: ca! };
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
    if (err instanceof StoreFullError)
      throw new CsiError(
        status.RESOURCE_EXHAUSTED,
        `no room for cache ${short} in this node's store: ${err.message}`,
      );
    throw err;
  });
  try {
    return await fill(p, { hash, short, digest, sources, tls, signal, log }, o.fetched);
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
  fetched: (short: string) => void,
): Promise<string> {
  const { hash, short, digest, sources, tls, signal, log } = f;
  // As before a capture: the record is not deleted while this store holds its tree unaccounted.
  await p.records.addFinalizer(short, p.finalizer);
  const m = p.metrics.replication;
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
    onProgress: ({ doneBytes, totalBytes }) => {
      m.fillingBytes.set({ hash: short }, doneBytes);
      m.fillingTotalBytes.set({ hash: short }, totalBytes);
    },
  })
    .catch(async (err: unknown) => {
      await dropFinalizerIfEmpty(p, hash);
      throw err;
    })
    .finally(() => {
      m.fillingBytes.remove({ hash: short });
      m.fillingTotalBytes.remove({ hash: short });
    });
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
  fetched(short);
  return r.dest;
}
