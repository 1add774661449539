/**
 * Capture jobs: the long copies, run outside any reconcile. The pod reconciler starts one for an
 * elected leader past its warm-up; the job takes a capture slot, records Capturing, makes room in
 * the store, copies, verifies and commits the tree, and when it ends (committed or not) enqueues
 * the pod and its cache so the reconcilers look again: the cache reconciler promotes what it finds
 * committed. A job's mark is released on every way out but a committed capture.
 */
import { performance } from "node:perf_hooks";
import type * as k8s from "@kubernetes/client-node";
import { PHASE } from "../api/names.js";
import { REASON } from "../api/reasons.js";
import type { Logger } from "../common/log.js";
import { classifyPod } from "../core/classify.js";
import { quantityBytes } from "../core/size.js";
import { CACHE_VOLUME, FINALIZER_CLEANUP, shortHash } from "../core/contract.js";
import { AlreadyCapturedError, CaptureStoppedError, capture } from "../datapath/capture.js";
import type { Manifest } from "../datapath/manifest.js";
import { formatBytes } from "../datapath/progress.js";
import { StoreFullError, type StoreBudget } from "./budget.js";
import type { Mark, ReleaseReason } from "./marks.js";
import { dropFinalizerIfEmpty, podEvent, recordFailure, type AgentParts } from "./parts.js";
import { unsupportedStorage } from "./promoter.js";
import { evictionMessage, evictionWarning, leaderEviction } from "../promote/leader-eviction.js";
import { unshareable } from "../promote/profiles.js";
import { Slots } from "./slots.js";
import { emptyDirPath, treeBytes } from "./store.js";
import type { StoreStorageInfo } from "./store-lease.js";

export interface CaptureJobDeps {
  budget: StoreBudget;
  storage: StoreStorageInfo;
  /** The job ended (committed or not): look at the pod and the cache again. */
  ended(podKey: string, short: string): void;
  /** The store changed: publish its use. */
  storeChanged(): Promise<void>;
}

/** Release reasons after which a pod is settled: nothing a later look could change. */
export const SETTLED: ReadonlySet<ReleaseReason> = new Set(["cache-ready", "not-leader", "unsupported"]);

export class CaptureJobs {
  private readonly running = new Map<Mark, Promise<void>>();
  private readonly slots: Slots;

  constructor(
    private readonly p: AgentParts,
    private readonly deps: CaptureJobDeps,
  ) {
    this.slots = new Slots(p.cfg.concurrency);
  }

  /** Starts the capture of an elected leader's cache (its mark already taken). */
  start(mark: Mark, pod: k8s.V1Pod, election: string): void {
    mark.stage = "waiting-slot";
    const job = this.run(mark, pod, election).finally(() => {
      this.running.delete(mark);
      this.deps.ended(mark.key, shortHash(mark.hash));
    });
    this.running.set(mark, job);
  }

  /** Whether a capture of this cache runs here now. */
  busyWith(short: string): boolean {
    for (const m of this.running.keys()) if (shortHash(m.hash) === short) return true;
    return false;
  }

  /** Stops this cache's captures and waits for them to end (nothing of theirs is left committed half-made). */
  async stopFor(short: string, reason: ReleaseReason): Promise<void> {
    const jobs = [...this.running].filter(([m]) => shortHash(m.hash) === short);
    for (const [m] of jobs) this.p.marks.cancel(m, reason);
    await Promise.allSettled(jobs.map(([, j]) => j));
  }

  /** Stops every capture (each removes its staging tree, commits nothing) and waits for them. */
  async stopAll(): Promise<void> {
    for (const m of this.running.keys()) this.p.marks.cancel(m, "stopped");
    await this.idle();
  }

  async idle(): Promise<void> {
    while (this.running.size) await Promise.allSettled(this.running.values());
  }

  get size(): number {
    return this.running.size;
  }

  private async run(mark: Mark, pod: k8s.V1Pod, election: string): Promise<void> {
    const log = this.p.log.child({ pod: mark.key, uid: mark.uid, hash: shortHash(mark.hash), election });
    const signal = mark.controller.signal;
    let reason: ReleaseReason = "error";
    try {
      const outcome = await this.capture(mark, pod, election, log);
      // A pod that went away meanwhile is the reason, whatever the job saw after that.
      if (outcome !== "committed") reason = signal.aborted ? (signal.reason as ReleaseReason) : outcome;
    } catch (err) {
      reason = signal.aborted ? (signal.reason as ReleaseReason) : "error";
      if (signal.aborted) log.info({ reason }, "abandoned: the pod changed while it was being prepared");
      else log.error({ err }, "failed: capture error");
    } finally {
      this.deps.budget.release(shortHash(mark.hash));
      this.p.marks.release(mark, reason);
    }
  }

  private async capture(
    mark: Mark,
    pod: k8s.V1Pod,
    election: string,
    log: Logger,
  ): Promise<"committed" | ReleaseReason> {
    const { p } = this;
    const { cfg } = p;
    const signal = mark.controller.signal;
    const short = shortHash(mark.hash);
    const [namespace, name] = mark.key.split("/") as [string, string];

    const releaseSlot = await this.slots.acquire(signal);
    let manifest: Manifest;
    let captureSeconds: number;
    try {
      mark.stage = "capturing";
      const profile = await this.deps.storage.profile();
      if (unshareable(profile)) {
        await unsupportedStorage(p, mark.hash, election, profile, pod);
        return "unsupported";
      }
      await p.hooks.beforeStatus?.(short, PHASE.Capturing);
      // Not over Ready, nor over this election's own end (its leader went, its deadline passed).
      const started = await p.records.advance(short, election, "captureStarted", {
        reason: REASON.CaptureStarted,
        message: `capturing ${namespace}/${name} on node ${cfg.node}`,
        node: cfg.node,
      });
      if (!started) return "cache-deleted";
      if (!started.written) {
        if (started.cache.status?.phase === PHASE.Ready) return "cache-ready";
        log.info({ phase: started.cache.status?.phase }, "skipped: the election ended before its capture");
        return "election-ended";
      }

      const src = emptyDirPath(cfg.kubeletRoot, mark.uid, CACHE_VOLUME);
      try {
        // The folder is sized as the capture walks it, and stops as a capture does.
        const needed = await treeBytes(src, { signal, deadlineMs: cfg.captureDeadlineMs });
        // The kubelet counts the blocks a folder uses, a copy writes every byte a file says it
        // holds: a sparse file may pass the volume's limit and still fill the store (and make
        // room by evicting others' trees). Nothing past the volume's own limit is made room for.
        const limit = captureLimit(pod);
        if (limit !== undefined && needed > limit)
          throw new StoreFullError(
            `the cache folder holds ${formatBytes(needed)} (sparse files count at their full size), more than its volume's limit of ${formatBytes(limit)}`,
          );
        await this.deps.budget.makeRoom(short, needed, log);
      } catch (err) {
        if (err instanceof CaptureStoppedError) return await this.notCaptured(err, mark, election, pod, log);
        if (!(err instanceof StoreFullError)) throw err;
        p.metrics.captures.inc({ result: "failed" });
        log.error({ err }, "failed: capture (no room)");
        await recordFailure(
          p,
          mark.hash,
          election,
          REASON.CaptureFailed,
          `node ${cfg.node}: ${err.message}`,
          pod,
        );
        return "capture-failed";
      }
      // Before anything of this cache exists on this node or in the cluster, the record holds
      // the finalizers that make a deletion remove it (none can be added once a delete started).
      if (
        !(await p.records.addFinalizer(short, FINALIZER_CLEANUP)) ||
        !(await p.records.addFinalizer(short, p.finalizer))
      ) {
        log.info("skipped: the cache is being deleted");
        return "cache-deleted";
      }

      const t0 = performance.now();
      try {
        manifest = await capture({
          src,
          dest: p.store.treeDir(mark.hash),
          hash: mark.hash,
          model: classifyPod(pod).model,
          parallel: cfg.captureParallel,
          progress: false,
          durable: cfg.durable,
          directIo: cfg.directIo,
          deadlineMs: cfg.captureDeadlineMs,
          signal,
          log,
          ...(p.hooks.capture ? { hooks: p.hooks.capture } : {}),
        });
      } catch (err) {
        if (!(err instanceof AlreadyCapturedError))
          return await this.notCaptured(err, mark, election, pod, log);
        const theirs = await p.store.committed(mark.hash);
        if (!theirs) throw err;
        manifest = theirs;
      }
      captureSeconds = Math.round(performance.now() - t0) / 1000;

      // The pod went away as the copy committed: files that vanished may be the kubelet tearing
      // its volume down, so the tree may be short of files. A complete one is kept.
      if (signal.aborted && manifest.skipped.some((s) => s.reason === "vanished")) {
        await p.store.discard(mark.hash);
        p.metrics.captures.inc({ result: "discarded" });
        const why = String(signal.reason);
        log.warn(
          { why, vanished: manifest.skipped.filter((s) => s.reason === "vanished").length },
          "discarded: the pod went away during the capture",
        );
        await this.leaderEnded(
          mark,
          election,
          `leader ${mark.key} went away during the capture (${why}); discarded`,
          "the tree it left was discarded",
        );
        await dropFinalizerIfEmpty(p, mark.hash);
        return "discarded";
      }
      await p.store.seal(mark.hash);
      p.marks.commit(mark);
    } finally {
      releaseSlot();
    }

    p.metrics.captures.inc({ result: "captured" });
    p.metrics.captureSeconds.observe(captureSeconds);
    p.metrics.capturedBytes.inc(manifest.totalBytes);
    log.info(
      {
        files: manifest.fileCount,
        bytes: manifest.totalBytes,
        seconds: captureSeconds,
        method: manifest.captureMethod,
      },
      "captured",
    );
    await this.deps.storeChanged().catch(() => undefined);
    await podEvent(
      p,
      pod,
      "Normal",
      "WarmstartCaptured",
      `captured ${manifest.fileCount} files (${formatBytes(manifest.totalBytes)}) on node ${cfg.node} in ${captureSeconds.toFixed(2)}s; promoting cache ${short}`,
    );
    return "committed";
  }

  /**
   * A capture (or the sizing before it) that ended without committing anything: a cancel is
   * recorded as the leader going (unless the agent stops or the cache is being deleted), anything
   * else as a failed capture; this node's finalizer goes when nothing of the cache is stored here.
   */
  private async notCaptured(
    err: unknown,
    mark: Mark,
    election: string,
    pod: k8s.V1Pod,
    log: Logger,
  ): Promise<ReleaseReason> {
    const { p } = this;
    const signal = mark.controller.signal;
    if (err instanceof CaptureStoppedError && err.why === "aborted") {
      const why = String(signal.reason ?? "cancelled");
      p.metrics.captures.inc({ result: "cancelled" });
      log.warn({ why }, "cancelled: the capture stopped; nothing was committed");
      // An agent stopping, or a cache being deleted, is no election ending.
      if (why !== "stopped" && why !== "cache-deleted")
        await this.leaderEnded(
          mark,
          election,
          `leader ${mark.key} went away during its capture (${why})`,
          "its capture stopped",
        );
      await dropFinalizerIfEmpty(p, mark.hash);
      return signal.reason as ReleaseReason;
    }
    const message = (err as Error).message;
    p.metrics.captures.inc({ result: "failed" });
    log.error({ err }, "failed: capture");
    await recordFailure(
      p,
      mark.hash,
      election,
      REASON.CaptureFailed,
      `capture on node ${p.cfg.node} failed: ${message}`,
      pod,
    );
    await dropFinalizerIfEmpty(p, mark.hash);
    return "capture-failed";
  }

  /**
   * A capture stopped because its leader ended. An eviction (the pod as last seen, same UID) is a
   * failed capture that counts, as the release controller records it, whichever writes first; any
   * other end is the leader going, which does not count.
   */
  private async leaderEnded(mark: Mark, election: string, gone: string, stopped: string): Promise<void> {
    const { p } = this;
    const [namespace, name] = mark.key.split("/") as [string, string];
    const pod = p.pod(namespace, name);
    const eviction = pod?.metadata?.uid === mark.uid ? leaderEviction(pod) : undefined;
    if (!pod || !eviction) {
      await recordFailure(p, mark.hash, election, REASON.LeaderGone, gone);
      return;
    }
    const short = shortHash(mark.hash);
    const message = `${evictionMessage(eviction, pod)}; ${stopped}`;
    await p.hooks.beforeStatus?.(short, PHASE.Failed);
    const r = await p.records.fail(short, election, REASON.CaptureFailed, message).catch((err: unknown) => {
      p.log.error({ err }, "could not record the failure");
      return undefined;
    });
    if (!r?.written) return;
    const ev = evictionWarning(eviction, message, short, Number(r.cache.status?.failedCaptures ?? 0));
    await podEvent(p, pod, "Warning", ev.reason, ev.message);
  }
}

/** The size limit admission gave the leader's capture volume, in bytes (undefined: none). */
export function captureLimit(pod: k8s.V1Pod): number | undefined {
  const v = pod.spec?.volumes?.find((x) => x.name === CACHE_VOLUME);
  const q = v?.emptyDir?.sizeLimit;
  return q === undefined ? undefined : quantityBytes(String(q));
}
