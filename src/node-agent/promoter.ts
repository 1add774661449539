/**
 * Promote: a committed tree becomes claim `rox-<short>` in every namespace that needs it, and the
 * record goes Promoting, then Ready (or Failed for this election only). Called by the cache
 * reconciler, so one promote per cache runs at a time. A promote creates objects only while its
 * election is the record's, and one that fails or is superseded takes back what it created.
 */
import { performance } from "node:perf_hooks";
import type * as k8s from "@kubernetes/client-node";
import { PHASE } from "../api/names.js";
import { REASON } from "../api/reasons.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import { ANN_CACHE_SOURCE, claimName, shortHash } from "../core/contract.js";
import { scopeOfInputs } from "../core/hash.js";
import type { Manifest } from "../datapath/manifest.js";
import { formatBytes } from "../datapath/progress.js";
import { SupersededError, type CreatedObject } from "../promote/claims.js";
import {
  describeFailures,
  ensureClaimsForStampedPods,
  type ClaimsResult,
  type EnsureAllOptions,
} from "../promote/promote.js";
import { removeCreated } from "../promote/rollback.js";
import { unshareable, type StorageProfile } from "../promote/profiles.js";
import { publishSource } from "../promote/publish.js";
import { encodeSource, sourceOf, type CacheSource } from "../promote/source.js";
import { timeToReadySeconds } from "./decide.js";
import { manifestDigestOf } from "./replication/server.js";
import { recordFailure, type AgentParts } from "./parts.js";
import type { StoreStorageInfo } from "./store-lease.js";

export type PromoteOutcome = "ready" | "failed" | "unsupported" | "skipped";

export interface PromoteContext {
  manifest: Manifest;
  /** The election the tree was captured for: every record write of this promote is about it alone. */
  election: string;
  /** The leader the tree was captured from, when known (events, its namespace). */
  pod?: k8s.V1Pod;
  /** This election's promote failed before this time (ms: the last resync's start) and is tried
   * again; a failure since then, or without this, stands. */
  retryFailedBefore?: number;
  /** Fires when the agent stops: waits end at once and the record stays Promoting, so the next
   * start resumes (its objects are found again by name). */
  signal?: AbortSignal;
}

export class Promoter {
  constructor(
    private readonly p: AgentParts,
    private readonly storage: StoreStorageInfo,
  ) {}

  async promote(hash: string, ctx: PromoteContext): Promise<PromoteOutcome> {
    const { p } = this;
    const { cfg } = p;
    const short = shortHash(hash);
    const { election, pod } = ctx;
    const log = p.log.child({ hash: short, election });
    const t0 = performance.now();
    const profile = await this.storage.profile();
    if (unshareable(profile)) return unsupportedStorage(p, hash, election, profile, pod);

    const m = ctx.manifest;
    const tree = p.store.treeDir(hash);
    const stats: Record<string, unknown> = {
      node: cfg.node,
      path: tree,
      backend: profile.backend,
      sizeBytes: m.totalBytes,
      sizeHuman: formatBytes(m.totalBytes),
      files: m.fileCount,
      modelBytes: m.split.model.bytes,
      cacheBytes: m.split.cache.bytes,
      captureSeconds: Math.round(m.timings.totalMs) / 1000,
      // What every copy of the tree (a replica, a restore) checks its manifest against.
      manifestDigest: manifestDigestOf(tree),
    };
    const ttr = pod ? timeToReadySeconds(pod) : undefined;
    if (ttr !== undefined) stats.leaderReadySeconds = ttr;

    await p.hooks.beforeStatus?.(short, PHASE.Promoting);
    // Not over Ready, nor over an election that ended, except to retry its own failed promote.
    const retry = ctx.retryFailedBefore;
    const moved = await p.records.advance(
      short,
      election,
      retry === undefined ? "captured" : "retryPromote",
      {
        reason: REASON.Captured,
        message: `captured on node ${cfg.node}; promoting (${profile.backend})`,
        ...stats,
      },
      retry === undefined ? {} : { failedBefore: retry },
    );
    if (!moved) {
      log.info("skipped promote: the cache has no record (removed on purpose)");
      return "skipped";
    }
    const wasReady = moved.cache.status?.phase === PHASE.Ready && !moved.cache.metadata.deletionTimestamp;
    if (!moved.written && !wasReady) {
      log.info(
        { recordElection: moved.cache.spec.electionId, phase: moved.cache.status?.phase },
        "skipped promote: the record is about another election, or this one ended",
      );
      return "skipped";
    }
    let source: CacheSource | undefined = wasReady ? sourceOf(moved.cache) : undefined;
    // What this promote creates for its election, each creation only while the election is still
    // the record's; taken back when it fails or is superseded (a Ready cache's claims stay).
    const made: CreatedObject[] = [];
    const forElection = wasReady
      ? {}
      : { created: (o: CreatedObject) => made.push(o), current: () => this.current(short, election) };
    const takeBack = async (): Promise<void> => {
      if (!made.length) return;
      const left = await removeCreated(p.clients, short, election, made, { log });
      log.info({ created: made.length, left: left.length }, "took back what the promote created");
    };
    const superseded = async (found?: ModelCacheObject): Promise<PromoteOutcome> => {
      log.warn(
        { recordElection: found?.spec.electionId, phase: found?.status?.phase },
        "not published: the record moved on to another election (or was deleted) during the promote",
      );
      p.metrics.promotes.inc({ result: "superseded" });
      await takeBack();
      return "skipped";
    };
    if (!source) {
      try {
        const uid = moved.cache.metadata.uid;
        source = await publishSource(p.clients, {
          short,
          hash,
          ...(cfg.image
            ? {
                writer: {
                  image: cfg.image,
                  systemNamespace: cfg.systemNamespace,
                  timeoutMs: cfg.captureDeadlineMs,
                  ...(cfg.imagePullSecrets ? { imagePullSecrets: cfg.imagePullSecrets } : {}),
                },
              }
            : {}),
          ...(uid ? { owner: { name: short, uid } } : {}),
          store: this.storage.location(),
          storage: await this.storage.storage(),
          profile,
          tree,
          sizeBytes: m.totalBytes,
          snapshotTimeoutMs: cfg.snapshotTimeoutMs,
          ...(ctx.signal ? { signal: ctx.signal } : {}),
          ...forElection,
        });
        const encoded = encodeSource(source);
        if (wasReady) await p.records.annotate(short, ANN_CACHE_SOURCE, encoded);
        else if (!(await p.records.annotateForElection(short, election, ANN_CACHE_SOURCE, encoded)))
          return await superseded();
      } catch (err) {
        if (wasReady || ctx.signal?.aborted) throw err;
        if (err instanceof SupersededError) return await superseded();
        const message = `publishing the captured tree failed: ${(err as Error).message}`;
        log.error({ err }, "failed: promote");
        await recordFailure(p, hash, election, REASON.PromoteFailed, message, pod);
        p.metrics.promotes.inc({ result: "failed" });
        await takeBack();
        return "failed";
      }
    }

    const scope = scopeOfInputs(moved.cache.spec.inputs);
    const claims = await this.ensureClaims(short, scope, source, pod?.metadata?.namespace, {
      ...forElection,
      ...(ctx.signal ? { signal: ctx.signal } : {}),
    });
    ctx.signal?.throwIfAborted();
    if (claims.superseded) return await superseded();
    if (!claims.ok) {
      const message = claims.unsupported ?? describeFailures(claims);
      if (wasReady) {
        log.warn(
          { err: message },
          "cache stays Ready, but a namespace still lacks its claim; the resync retries",
        );
        return "ready";
      }
      log.error({ err: message }, "failed: promote (a namespace with pods of this cache has no claim)");
      await recordFailure(
        p,
        hash,
        election,
        claims.unsupported ? REASON.Unsupported : REASON.PromoteFailed,
        message,
        pod,
      );
      p.metrics.promotes.inc({ result: "failed" });
      // The namespaces that got their claim keep none: the next try (a resync, or the next
      // election) makes them again from its own source.
      await takeBack();
      return "failed";
    }
    if (wasReady) {
      await this.recordNamespaces(short, claims.namespaces);
      return "ready";
    }
    await p.hooks.beforeStatus?.(short, PHASE.Ready);
    const done = await p.records.advance(short, election, "promoted", {
      reason: REASON.Promoted,
      message: `${claimName(short)} in ${claims.namespaces.length} namespace(s) (${profile.backend} on ${cfg.node})`,
      namespaces: claims.namespaces,
    });
    if (!done?.written && done?.cache.status?.phase !== PHASE.Ready) return await superseded(done?.cache);
    const seconds = Math.round(performance.now() - t0) / 1000;
    p.metrics.promoteSeconds.observe(seconds);
    p.metrics.promotes.inc({ result: "ready" });
    log.info(
      { namespaces: claims.namespaces, seconds, backend: profile.backend, written: done?.written },
      "promoted: cache Ready",
    );
    // Followers admitted while this ran (after the namespaces were listed) get theirs now; the
    // cache's periodic look covers anything later still.
    await this.keepClaims(short, scope, source);
    return "ready";
  }

  /**
   * A Ready cache's claims in every namespace of its scope (`scopeOfInputs` of its record) with
   * stamped pods, added to the record's list.
   */
  async keepClaims(short: string, scope: string, source: CacheSource): Promise<boolean> {
    const claims = await this.ensureClaims(short, scope, source, undefined);
    if (claims.ok) await this.recordNamespaces(short, claims.namespaces);
    else
      this.p.log.warn(
        { hash: short, err: describeFailures(claims) },
        "claims still missing; next look retries",
      );
    return claims.ok;
  }

  /**
   * Whether the promote of `election` may still create objects: the record is about that election,
   * its status is this promote's (Promoting), and it is neither Ready nor being deleted. Read
   * afresh: the informer may lag behind a newer election.
   */
  private async current(short: string, election: string): Promise<boolean> {
    const c = await this.p.records.get(short);
    return (
      c !== undefined &&
      !c.metadata.deletionTimestamp &&
      c.spec.electionId === election &&
      c.status?.electionId === election &&
      c.status.phase === PHASE.Promoting
    );
  }

  private ensureClaims(
    short: string,
    scope: string,
    source: CacheSource,
    leaderNamespace: string | undefined,
    forElection: Pick<EnsureAllOptions, "created" | "current" | "signal"> = {},
  ): Promise<ClaimsResult> {
    const { cfg, metrics } = this.p;
    const storeNamespace = this.storage.claimNamespace;
    return ensureClaimsForStampedPods({
      clients: this.p.clients,
      short,
      scope,
      source,
      log: this.p.log.child({ hash: short }),
      extraNamespaces: leaderNamespace ? [leaderNamespace] : [],
      ...(storeNamespace ? { storeNamespace } : {}),
      retry: {
        attempts: cfg.claimAttempts,
        initialMs: cfg.claimBackoffMs,
        maxMs: Math.max(cfg.claimBackoffMs, 5_000),
      },
      onAttempt: (_ns, result) => metrics.claims.inc({ result }),
      ...forElection,
    });
  }

  /** Adds namespaces to a Ready record's list (never removes: a claim outlives its pods). */
  private async recordNamespaces(short: string, namespaces: string[]): Promise<void> {
    await this.p.records.transition(short, (c) => {
      const have = new Set(c.status?.namespaces ?? []);
      if (
        c.status?.phase !== PHASE.Ready ||
        c.metadata.deletionTimestamp ||
        namespaces.every((n) => have.has(n))
      )
        return undefined;
      return { namespaces: [...new Set([...have, ...namespaces])].sort() };
    });
  }
}

/** Storage that clones a volume per pod: no claim can be named ahead, so the cache is Unsupported. */
export async function unsupportedStorage(
  p: AgentParts,
  hash: string,
  election: string,
  profile: StorageProfile,
  pod: k8s.V1Pod | undefined,
): Promise<PromoteOutcome> {
  const message =
    profile.note ??
    unshareable(profile) ??
    `storage of provisioner ${profile.provisioner}${profile.volumeType ? ` (${profile.volumeType})` : ""} cannot be shared`;
  p.log.warn(
    { hash: shortHash(hash), provisioner: profile.provisioner },
    "skipped: storage cannot be shared (Unsupported)",
  );
  p.metrics.promotes.inc({ result: "unsupported" });
  await recordFailure(p, hash, election, REASON.Unsupported, message, pod);
  return "unsupported";
}
