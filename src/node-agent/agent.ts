/**
 * The node agent (docs/adr/0006-capture-and-promote.md): watches the pods on its node, captures
 * the warmed cache of each Ready elected leader into the node's cache store under the hash
 * admission stamped on it, and promotes the committed tree to claim `rox-<short>` in every
 * namespace that needs it, moving the cache's ModelCache record through Capturing, Promoting,
 * then Ready or Failed.
 *
 * Level-based: a pod event, a restart and a periodic resync all lead to the same look at the pod
 * and the store. The store's committed tree is the proof that a capture is done; the cache record
 * is the proof that a promote is done.
 */
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import * as k8s from "@kubernetes/client-node";
import { ResilientWatch, makeInformer } from "../common/watch.js";
import { realClock } from "../common/clock.js";
import { apiError, isAlreadyExists, isConflict, isNotFound, makeApiClient } from "../common/kube.js";
import { postPodEvent } from "../common/events.js";
import { createLogger, type Logger } from "../common/log.js";
import { classifyPod } from "../core/classify.js";
import {
  ANN_CACHE_SOURCE,
  ANN_HASH,
  ANN_STORE_BUDGET,
  ANN_STORE_USED,
  ANN_STORE_CACHES,
  ANN_STORE_NODE,
  CACHE_VOLUME,
  FINALIZER_CLEANUP,
  LABEL_STORE,
  MODELCACHE,
  type CachePhase,
  claimName,
  leaseName,
  shortHash,
} from "../core/contract.js";
import {
  AlreadyCapturedError,
  CaptureStoppedError,
  capture,
  type CaptureHooks,
} from "../datapath/capture.js";
import type { Manifest } from "../datapath/manifest.js";
import { formatBytes } from "../datapath/progress.js";
import { storeFinalizer, type ModelCacheObject } from "../common/modelcache.js";
import { CacheRecords, type LeaderClaim } from "../common/cache-record.js";
import { promoteClients, type PromoteClients } from "../promote/claims.js";
import { describeFailures, ensureClaimsForStampedPods, type ClaimsResult } from "../promote/promote.js";
import { StorageProfiles, type StorageProfile } from "../promote/profiles.js";
import { describeStore, publishSource, type StoreLocation, type StoreStorage } from "../promote/publish.js";
import { deleteCachePass } from "../promote/rollback.js";
import { encodeSource, sourceOf, type CacheSource } from "../promote/source.js";
import type { NodeAgentConfig } from "./config.js";
import { cancelReasonFor, cancelsCapture, decidePod, leaderSighting, timeToReadySeconds } from "./decide.js";
import { CaptureMarks, type Mark, type ReleaseReason } from "./marks.js";
import { createNodeAgentMetrics, type NodeAgentMetrics } from "./metrics.js";
import { Slots } from "./slots.js";
import { bytesOf, CacheStore, emptyDirPath, heldBytes, treeBytes } from "./store.js";

const COMPONENT = "warmstart-node-agent";

export type PromoteOutcome = "ready" | "failed" | "unsupported" | "skipped";

/** Points where tests make the agent wait, to land a change of the cluster at an exact moment. */
export interface NodeAgentHooks {
  /** Passed to every capture (the copy waits on them). */
  capture?: CaptureHooks;
  /** Before each record write about an election (phase: the one about to be written). */
  beforeStatus?: (short: string, phase: string) => void | Promise<void>;
}

export interface NodeAgentOptions {
  cfg: NodeAgentConfig;
  kc: k8s.KubeConfig;
  log?: Logger;
  metrics?: NodeAgentMetrics;
  hooks?: NodeAgentHooks;
}

interface PromoteContext {
  manifest: Manifest;
  /** The election the tree was captured for: every record write of this promote is about it alone. */
  election: string;
  /** The leader the tree was captured from, when known (events, its namespace). */
  pod?: k8s.V1Pod;
  captureSeconds?: number;
}

/** A capture cannot have the room it needs in the store, even after removing every unused cache. */
class StoreFullError extends Error {}

export class NodeAgent {
  readonly marks: CaptureMarks;
  readonly metrics: NodeAgentMetrics;
  readonly store: CacheStore;
  private readonly log: Logger;
  private readonly core: k8s.CoreV1Api;
  private readonly coordination: k8s.CoordinationV1Api;
  private readonly clients: PromoteClients;
  private readonly records: CacheRecords;
  private readonly profiles: StorageProfiles;
  private readonly informer: k8s.ListWatch<k8s.V1Pod>;
  private readonly watch: ResilientWatch<k8s.V1Pod>;
  private readonly cacheWatch: ResilientWatch<k8s.KubernetesObject>;
  private readonly slots: Slots;
  private readonly finalizer: string;
  /** Pods whose outcome is settled without a capture of theirs (cache Ready elsewhere, unsupported storage, not the leader). */
  private readonly settled = new Map<string, ReleaseReason>();
  /** `election/uid` of leaders already recorded (or found recorded) on their cache's record. */
  private readonly sighted = new Set<string>();
  /** Running pipelines and the cache (short hash) each is about. */
  private readonly pipelines = new Map<Promise<void>, string>();
  private readonly promoting = new Map<string, Promise<PromoteOutcome>>();
  private readonly removing = new Map<string, Promise<void>>();
  /** Bytes held for captures in progress (short hash → bytes), counted against the budget. */
  private readonly reserved = new Map<string, number>();
  private making: Promise<void> = Promise.resolve();
  private storage: StoreStorage | undefined;
  private listed = false;
  private everListed = false;
  private stopped = true;
  private resyncTimer: NodeJS.Timeout | undefined;
  private resyncing: Promise<void> | undefined;

  constructor(private readonly o: NodeAgentOptions) {
    const { cfg, kc } = o;
    this.log = (o.log ?? createLogger("node-agent")).child({ node: cfg.node });
    this.metrics = o.metrics ?? createNodeAgentMetrics();
    this.core = makeApiClient(kc, k8s.CoreV1Api);
    this.coordination = makeApiClient(kc, k8s.CoordinationV1Api);
    this.clients = promoteClients(kc);
    this.records = new CacheRecords(this.clients.custom);
    this.profiles = new StorageProfiles(this.core, cfg.systemNamespace, this.log);
    this.store = new CacheStore(cfg.store);
    this.slots = new Slots(cfg.concurrency);
    this.finalizer = storeFinalizer(cfg.node);
    this.marks = new CaptureMarks((ev) => {
      this.metrics.marksInProgress.set(this.marks.inProgressCount);
      if (ev.type === "released") {
        this.metrics.marksReleased.inc({ reason: ev.reason ?? "error" });
        this.log.info(
          { pod: ev.mark.key, uid: ev.mark.uid, hash: shortHash(ev.mark.hash), reason: ev.reason },
          "mark released",
        );
      }
    });

    const fieldSelector = `spec.nodeName=${cfg.node}`;
    this.informer = makeInformer<k8s.V1Pod>(
      kc,
      "/api/v1/pods",
      async () => {
        const list = await this.core.listPodForAllNamespaces({ fieldSelector });
        this.listed = this.everListed = true;
        return list;
      },
      undefined,
      fieldSelector,
    );
    // A restarted watch resumes from its resourceVersion without listing again.
    this.informer.on("connect", () => (this.listed = this.everListed));
    this.informer.on("error", () => {
      this.listed = false;
      this.metrics.watchRestarts.inc();
    });
    this.watch = new ResilientWatch<k8s.V1Pod>({
      name: "pods",
      clock: realClock,
      log: this.log,
      informer: this.informer,
      onChange: (pod, kind) => this.handle(pod, kind),
    });
    // Cache records: a record being deleted is the signal to remove this node's tree of it.
    const caches = makeInformer(
      kc,
      `/apis/${MODELCACHE.group}/${MODELCACHE.version}/${MODELCACHE.plural}`,
      () =>
        this.clients.custom.listClusterCustomObject({
          group: MODELCACHE.group,
          version: MODELCACHE.version,
          plural: MODELCACHE.plural,
        }) as Promise<k8s.KubernetesListObject<k8s.KubernetesObject>>,
    );
    this.cacheWatch = new ResilientWatch<k8s.KubernetesObject>({
      name: "modelcaches",
      clock: realClock,
      log: this.log,
      informer: caches,
      onChange: (obj, kind) => {
        const c = obj as ModelCacheObject;
        if (
          kind !== "delete" &&
          c.metadata?.deletionTimestamp &&
          c.metadata.finalizers?.includes(this.finalizer)
        )
          void this.removeTree(c.metadata.name!, "the cache is being deleted", { unlessMounted: true });
      },
    });
  }

  async start(): Promise<void> {
    if (!this.stopped) return;
    this.stopped = false;
    await this.store.init();
    this.watch.start();
    this.cacheWatch.start();
    this.resyncTimer = setInterval(() => {
      if (this.resyncing) return;
      this.resyncing = this.resync()
        .catch((err: unknown) =>
          this.log.warn({ err: (err as Error).message }, "resync failed; next one will retry"),
        )
        .finally(() => (this.resyncing = undefined));
    }, this.o.cfg.resyncMs);
    await this.publishStore().catch((err: unknown) =>
      this.log.warn({ err: (err as Error).message }, "could not publish the store's use"),
    );
    this.log.info(
      {
        store: this.o.cfg.store,
        budget: this.o.cfg.storeBudget || "none",
        warmupMs: this.o.cfg.warmupMs,
        concurrency: this.o.cfg.concurrency,
      },
      "node agent watching pods on its node",
    );
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    clearInterval(this.resyncTimer);
    await Promise.all([this.watch.stop(), this.cacheWatch.stop()]);
    // A capture in progress stops cleanly (its staging tree removed, nothing committed).
    for (const m of this.marks.marks()) this.marks.cancel(m, "stopped");
    await Promise.allSettled([
      ...this.pipelines.keys(),
      ...this.promoting.values(),
      ...this.removing.values(),
      this.resyncing,
    ]);
  }

  health(): { ready: boolean; reason: string; inProgress: number; committed: number } {
    const ready = !this.stopped && this.listed;
    return {
      ready,
      reason: ready ? "watching pods" : this.stopped ? "stopped" : "pod watch not connected",
      inProgress: this.marks.inProgressCount,
      committed: this.marks.committedCount,
    };
  }

  /** One look at one pod, whatever woke it. Never throws; the work it starts runs on its own. */
  handle(pod: k8s.V1Pod, kind: "add" | "update" | "delete" | "resync"): void {
    if (this.stopped) return;
    const uid = pod.metadata?.uid;
    const key = `${pod.metadata?.namespace}/${pod.metadata?.name}`;
    if (!uid) return;
    const decision = (d: string): void => this.metrics.decisions.inc({ decision: d });

    // A pod of the same name under another UID replaced the one we were warming up.
    const other = this.marks.forKey(key);
    if (other && other.uid !== uid) this.marks.cancel(other, "pod-replaced");

    if (kind === "delete") {
      const m = this.marks.get(uid);
      if (m) this.marks.cancel(m, "pod-deleted");
      this.marks.forget(uid);
      this.settled.delete(uid);
      for (const k of this.sighted) if (k.endsWith(`/${uid}`)) this.sighted.delete(k);
      return;
    }

    const log = this.log.child({ pod: key, uid });
    const seen = leaderSighting(pod, this.o.cfg.node);
    if (seen) this.sight(seen.hash, seen.election, uid, log);

    const d = decidePod(pod, this.o.cfg.node);
    if (d.action === "skip") {
      decision(`skipped-${d.reason}`);
      const m = this.marks.get(uid);
      if (m && (m.stage !== "capturing" || cancelsCapture(d.reason)))
        this.marks.cancel(m, cancelReasonFor(d.reason));
      else if (m) log.info({ reason: d.reason }, "still capturing: a Ready blip does not stop a copy");
      if (d.reason === "no-capture-label" || d.reason === "other-node")
        log.debug({ reason: d.reason }, "skipped: not a capture leader");
      else if (d.reason === "no-hash")
        log.warn({ detail: d.detail }, "skipped: leader carries no stamped hash");
      else if (d.reason === "no-election-id") {
        if (!this.settled.has(uid)) log.warn("ignored: wears the capture label but no election id");
        this.settled.set(uid, "not-leader");
      } else if (d.reason === "terminating") log.info("skipped: terminating");
      else log.info({ phase: d.detail }, "skipped: not Ready");
      return;
    }
    const existing = this.marks.get(uid);
    if (existing) {
      decision("skipped-in-progress");
      log.debug({ stage: existing.stage }, "skipped: already in progress");
      return;
    }
    if (this.marks.isCommitted(uid)) {
      decision("skipped-already-captured");
      log.debug("skipped: already done (captured)");
      return;
    }
    const settled = this.settled.get(uid);
    if (settled) {
      decision("skipped-settled");
      log.debug({ reason: settled }, "skipped: already done (nothing to capture)");
      return;
    }
    const mark = this.marks.tryMark(uid, key, d.hash);
    if (!mark) return;
    decision("scheduled");
    const p = this.run(mark, pod, d.election).finally(() => this.pipelines.delete(p));
    this.pipelines.set(p, d.short);
  }

  /**
   * The first pod seen wearing an election's id on its record becomes that election's leader
   * (by UID); a later pod with the same stamps is an impostor, and is told so in the log.
   */
  private sight(hash: string, election: string, uid: string, log: Logger): void {
    const key = `${election}/${uid}`;
    if (this.sighted.has(key)) return;
    this.sighted.add(key);
    this.records
      .get(hash)
      .then(async (cache) => {
        if (!cache || cache.spec.electionId !== election) {
          this.sighted.delete(key); // not this election's record (yet): look again next time
          return;
        }
        const claim = await this.records.claimLeader(hash, election, uid);
        if (!claim.ok) log.warn({ election, why: claim.why }, "ignored: not the elected leader");
      })
      .catch((err: unknown) => {
        this.sighted.delete(key);
        log.warn({ err: (err as Error).message }, "could not record the election's leader; will retry");
      });
  }

  /** Runs one mark's pipeline and releases the mark on every way out but a committed capture. */
  private async run(mark: Mark, pod: k8s.V1Pod, election: string): Promise<void> {
    const log = this.log.child({ pod: mark.key, uid: mark.uid, hash: shortHash(mark.hash), election });
    let reason: ReleaseReason = "error";
    try {
      const outcome = await this.pipeline(mark, pod, election, log);
      // A pod that went away meanwhile is the reason, whatever the pipeline saw after that.
      if (outcome !== "committed")
        reason = mark.controller.signal.aborted ? (mark.controller.signal.reason as ReleaseReason) : outcome;
    } catch (err) {
      const aborted = mark.controller.signal.aborted;
      reason = aborted ? (mark.controller.signal.reason as ReleaseReason) : "error";
      if (aborted) log.info({ reason }, "abandoned: the pod changed while it was being prepared");
      else log.error({ err: (err as Error).message }, "failed: capture pipeline error");
    } finally {
      this.reserved.delete(shortHash(mark.hash));
      this.marks.release(mark, reason);
    }
  }

  /**
   * Whether this pod is the elected leader, the only pod whose cache is ever captured: its
   * election id is the Lease's holder and the record's election, and it is the pod recorded (or
   * now recorded) as that election's leader.
   */
  private async checkLeader(pod: k8s.V1Pod, hash: string, election: string): Promise<LeaderClaim> {
    const short = shortHash(hash);
    let cache = await this.records.get(short);
    if (cache?.status?.phase === "Ready" && !cache.metadata.deletionTimestamp)
      return { ok: false, why: "cache Ready", cache };
    const lease = await this.readLease(short);
    const holder = lease?.spec?.holderIdentity;
    if (!lease || holder !== election) {
      return {
        ok: false,
        why: lease ? `the election Lease is held by ${holder ?? "nobody"}` : "no election Lease",
      };
    }
    const leaseHash = lease.metadata?.annotations?.[ANN_HASH];
    if (leaseHash && leaseHash !== hash) return { ok: false, why: `the Lease is for hash ${leaseHash}` };
    if (!cache) {
      // The election's record is gone (deleted on purpose, or never written): the Lease vouches for it.
      cache = (
        await this.records.ensure(hash, {
          model: classifyPod(pod).model,
          electionId: election,
          leader: { namespace: pod.metadata?.namespace, name: pod.metadata?.name, node: this.o.cfg.node },
        })
      ).cache;
    }
    return this.records.claimLeader(short, election, pod.metadata!.uid!);
  }

  private async pipeline(
    mark: Mark,
    pod: k8s.V1Pod,
    election: string,
    log: Logger,
  ): Promise<"committed" | ReleaseReason> {
    const { cfg } = this.o;
    const signal = mark.controller.signal;
    const short = shortHash(mark.hash);

    // A committed tree of a Ready cache: nothing to capture, only claims to keep up.
    const already = await this.store.committed(mark.hash);
    const record = already ? await this.records.get(short) : undefined;
    if (already && record?.status?.phase === "Ready" && !record.metadata.deletionTimestamp) {
      this.marks.commit(mark);
      this.metrics.decisions.inc({ decision: "skipped-already-captured" });
      this.metrics.captures.inc({ result: "already-captured" });
      log.info("skipped: already captured and promoted (the store holds its committed tree)");
      await this.promote(mark.hash, { manifest: already, pod, election });
      return "committed";
    }

    const leader = await this.checkLeader(pod, mark.hash, election);
    if (signal.aborted) return signal.reason as ReleaseReason;
    if (!leader.ok) {
      if (leader.why === "cache Ready") {
        log.info("skipped: cache already Ready");
        this.settled.set(mark.uid, "cache-ready");
        return "cache-ready";
      }
      if (leader.why === "the cache is being deleted") {
        // Not this pod's fault: once the record is gone its Lease vouches for it again.
        log.info("skipped for now: the cache is being deleted");
        return "cache-deleted";
      }
      log.warn({ why: leader.why }, "ignored: not the elected leader");
      this.metrics.decisions.inc({ decision: "ignored-not-leader" });
      this.settled.set(mark.uid, "not-leader");
      return "not-leader";
    }

    if (already) {
      this.marks.commit(mark);
      this.metrics.decisions.inc({ decision: "skipped-already-captured" });
      this.metrics.captures.inc({ result: "already-captured" });
      log.info("skipped: already captured (the store holds its committed tree)");
      await this.promote(mark.hash, { manifest: already, pod, election });
      return "committed";
    }

    log.info({ warmupMs: cfg.warmupMs }, "scheduled: capturing after the warm-up if the pod stays Ready");
    await sleep(cfg.warmupMs, undefined, { signal });

    // Still the same pod, still Ready, still the leader: only then is its cache worth copying.
    const [namespace, name] = mark.key.split("/") as [string, string];
    const fresh = await this.readPod(namespace, name);
    if (!fresh) return "pod-deleted";
    if (fresh.metadata?.uid !== mark.uid) return "pod-replaced";
    const again = decidePod(fresh, cfg.node);
    if (again.action === "skip") return cancelReasonFor(again.reason);
    if (again.hash !== mark.hash || again.election !== election) return "warmup-cancelled";
    const still = await this.checkLeader(fresh, mark.hash, election);
    if (!still.ok) {
      log.info({ why: still.why }, "skipped: no longer the elected leader");
      if (still.why === "cache Ready") this.settled.set(mark.uid, "cache-ready");
      return still.why === "cache Ready" ? "cache-ready" : "election-ended";
    }

    mark.stage = "waiting-slot";
    const releaseSlot = await this.slots.acquire(signal);
    let manifest: Manifest;
    let captureSeconds: number;
    try {
      mark.stage = "capturing";
      const profile = await this.storeProfile();
      if (profile.backend === "per-pod-clone") {
        await this.unsupported(mark.hash, election, profile, fresh);
        this.settled.set(mark.uid, "unsupported");
        return "unsupported";
      }
      await this.o.hooks?.beforeStatus?.(short, "Capturing");
      const started = await this.records.forElection(short, election, (c) => {
        const s = c.status ?? {};
        if (s.phase === "Ready") return undefined;
        // This election already ended (its leader went, its deadline passed): nothing to start.
        if (s.phase === "Failed" && s.electionId === election) return undefined;
        return {
          phase: "Capturing",
          reason: "CaptureStarted",
          message: `capturing ${namespace}/${name} on node ${cfg.node}`,
          node: cfg.node,
        };
      });
      if (!started) return "cache-deleted";
      if (!started.written) {
        if (started.cache.status?.phase === "Ready") {
          this.settled.set(mark.uid, "cache-ready");
          return "cache-ready";
        }
        log.info({ phase: started.cache.status?.phase }, "skipped: the election ended before its capture");
        return "election-ended";
      }

      const src = emptyDirPath(cfg.kubeletRoot, mark.uid, CACHE_VOLUME);
      try {
        // The folder is sized as the capture walks it, and stops as a capture does.
        const needed = await treeBytes(src, { signal, deadlineMs: cfg.captureDeadlineMs });
        await this.makeRoom(short, needed, log);
      } catch (err) {
        if (err instanceof CaptureStoppedError)
          return await this.notCaptured(err, mark, election, fresh, log);
        if (!(err instanceof StoreFullError)) throw err;
        this.metrics.captures.inc({ result: "failed" });
        log.error({ err: err.message }, "failed: capture (store full)");
        await this.fail(mark.hash, election, "CaptureFailed", `node ${cfg.node}: ${err.message}`, fresh);
        return "capture-failed";
      }
      // Before anything of this cache exists on this node or in the cluster, the record holds
      // the finalizers that make a deletion remove it (none can be added once a delete started).
      if (
        !(await this.records.addFinalizer(short, FINALIZER_CLEANUP)) ||
        !(await this.records.addFinalizer(short, this.finalizer))
      ) {
        log.info("skipped: the cache is being deleted");
        return "cache-deleted";
      }

      const tree = this.store.treeDir(mark.hash);
      const t0 = performance.now();
      try {
        manifest = await capture({
          src,
          dest: tree,
          hash: mark.hash,
          model: classifyPod(fresh).model,
          parallel: cfg.captureParallel,
          progress: false,
          durable: cfg.durable,
          deadlineMs: cfg.captureDeadlineMs,
          signal,
          log,
          ...(this.o.hooks?.capture ? { hooks: this.o.hooks.capture } : {}),
        });
      } catch (err) {
        if (!(err instanceof AlreadyCapturedError))
          return await this.notCaptured(err, mark, election, fresh, log);
        const theirs = await this.store.committed(mark.hash);
        if (!theirs) throw err;
        manifest = theirs;
      }
      captureSeconds = Math.round(performance.now() - t0) / 1000;

      // The pod went away as the copy committed: files that vanished may be the kubelet tearing
      // its volume down, so the tree may be short of files. A complete one is kept.
      if (signal.aborted && manifest.skipped.some((s) => s.reason === "vanished")) {
        await this.store.discard(mark.hash);
        this.metrics.captures.inc({ result: "discarded" });
        const why = String(signal.reason);
        log.warn(
          { why, vanished: manifest.skipped.filter((s) => s.reason === "vanished").length },
          "discarded: the pod went away during the capture",
        );
        await this.fail(
          mark.hash,
          election,
          "LeaderGone",
          `leader ${mark.key} went away during the capture (${why}); discarded`,
        );
        await this.dropFinalizerIfEmpty(mark.hash);
        return "discarded";
      }
      await this.store.seal(mark.hash);
      this.marks.commit(mark);
    } finally {
      releaseSlot();
    }

    this.metrics.captures.inc({ result: "captured" });
    this.metrics.captureSeconds.observe(captureSeconds);
    this.metrics.capturedBytes.inc(manifest.totalBytes);
    log.info(
      {
        files: manifest.fileCount,
        bytes: manifest.totalBytes,
        seconds: captureSeconds,
        method: manifest.captureMethod,
      },
      "captured",
    );
    await this.publishStore().catch(() => undefined);
    await this.event(
      fresh,
      "Normal",
      "WarmstartCaptured",
      `captured ${manifest.fileCount} files (${formatBytes(manifest.totalBytes)}) on node ${cfg.node} in ${captureSeconds.toFixed(2)}s; promoting cache ${short}`,
    );
    await this.promote(mark.hash, { manifest, pod: fresh, election, captureSeconds });
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
    const signal = mark.controller.signal;
    if (err instanceof CaptureStoppedError && err.why === "aborted") {
      const why = String(signal.reason ?? "cancelled");
      this.metrics.captures.inc({ result: "cancelled" });
      log.warn({ why }, "cancelled: the capture stopped; nothing was committed");
      // An agent stopping, or a cache being deleted, is no election ending.
      if (why !== "stopped" && why !== "cache-deleted")
        await this.fail(
          mark.hash,
          election,
          "LeaderGone",
          `leader ${mark.key} went away during its capture (${why})`,
        );
      await this.dropFinalizerIfEmpty(mark.hash);
      return signal.reason as ReleaseReason;
    }
    const message = (err as Error).message;
    this.metrics.captures.inc({ result: "failed" });
    log.error({ err: message }, "failed: capture");
    await this.fail(
      mark.hash,
      election,
      "CaptureFailed",
      `capture on node ${this.o.cfg.node} failed: ${message}`,
      pod,
    );
    await this.dropFinalizerIfEmpty(mark.hash);
    return "capture-failed";
  }

  /** Promotes one committed tree; one promote per cache at a time on this agent. */
  promote(hash: string, ctx: PromoteContext): Promise<PromoteOutcome> {
    const short = shortHash(hash);
    const prev = this.promoting.get(short) ?? Promise.resolve<PromoteOutcome>("skipped");
    const next = prev
      .catch(() => "skipped" as const)
      .then(() => this.doPromote(hash, ctx))
      .catch((err: unknown): PromoteOutcome => {
        this.log.error({ hash: short, err: (err as Error).message }, "promote failed; the resync retries it");
        this.metrics.promotes.inc({ result: "failed" });
        return "failed";
      });
    this.promoting.set(short, next);
    const forget = (): void => {
      if (this.promoting.get(short) === next) this.promoting.delete(short);
    };
    next.then(forget, forget);
    return next;
  }

  private async doPromote(hash: string, ctx: PromoteContext): Promise<PromoteOutcome> {
    const { cfg } = this.o;
    const short = shortHash(hash);
    const { election, pod } = ctx;
    const log = this.log.child({ hash: short, election });
    const t0 = performance.now();
    const profile = await this.storeProfile();
    if (profile.backend === "per-pod-clone") return this.unsupported(hash, election, profile, pod);

    const m = ctx.manifest;
    const tree = this.store.treeDir(hash);
    const stats: Record<string, unknown> = {
      node: cfg.node,
      path: tree,
      backend: profile.backend,
      sizeBytes: m.totalBytes,
      sizeHuman: formatBytes(m.totalBytes),
      files: m.fileCount,
      modelBytes: m.split.model.bytes,
      cacheBytes: m.split.cache.bytes,
      captureSeconds: ctx.captureSeconds ?? Math.round(m.timings.totalMs) / 1000,
    };
    const ttr = pod ? timeToReadySeconds(pod) : undefined;
    if (ttr !== undefined) stats.leaderReadySeconds = ttr;

    await this.o.hooks?.beforeStatus?.(short, "Promoting");
    const moved = await this.records.forElection(short, election, (c) => {
      const s = c.status ?? {};
      if (s.phase === "Ready") return undefined;
      // An election that ended is not promoted, except to retry its own failed promote.
      if (s.phase === "Failed" && s.electionId === election && s.reason !== "PromoteFailed") return undefined;
      return {
        phase: "Promoting",
        reason: "Captured",
        message: `captured on node ${cfg.node}; promoting (${profile.backend})`,
        ...stats,
      };
    });
    if (!moved) {
      log.info("skipped promote: the cache has no record (removed on purpose)");
      return "skipped";
    }
    const wasReady = moved.cache.status?.phase === "Ready" && !moved.cache.metadata.deletionTimestamp;
    if (!moved.written && !wasReady) {
      log.info(
        { recordElection: moved.cache.spec.electionId, phase: moved.cache.status?.phase },
        "skipped promote: the record is about another election, or this one ended",
      );
      return "skipped";
    }
    let source: CacheSource | undefined = wasReady ? sourceOf(moved.cache) : undefined;
    if (!source) {
      try {
        source = await publishSource(this.clients, {
          short,
          store: this.storeLocation(),
          storage: await this.storeStorage(),
          profile,
          tree,
          sizeBytes: m.totalBytes,
          snapshotTimeoutMs: cfg.snapshotTimeoutMs,
        });
        await this.records.annotate(short, ANN_CACHE_SOURCE, encodeSource(source));
      } catch (err) {
        if (wasReady) throw err;
        const message = `publishing the captured tree failed: ${(err as Error).message}`;
        log.error({ err: message }, "failed: promote");
        await this.fail(hash, election, "PromoteFailed", message, pod);
        this.metrics.promotes.inc({ result: "failed" });
        return "failed";
      }
    }

    const claims = await this.ensureClaims(short, source, pod?.metadata?.namespace);
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
      await this.fail(hash, election, claims.unsupported ? "Unsupported" : "PromoteFailed", message, pod);
      this.metrics.promotes.inc({ result: "failed" });
      return "failed";
    }
    if (wasReady) {
      await this.recordNamespaces(short, claims.namespaces);
      return "ready";
    }
    await this.o.hooks?.beforeStatus?.(short, "Ready");
    const done = await this.records.forElection(short, election, (c) =>
      c.status?.phase === "Ready" || c.status?.phase !== "Promoting" || c.status.electionId !== election
        ? undefined
        : {
            phase: "Ready",
            reason: "Promoted",
            message: `${claimName(short)} in ${claims.namespaces.length} namespace(s) (${profile.backend} on ${cfg.node})`,
            namespaces: claims.namespaces,
          },
    );
    if (!done?.written && done?.cache.status?.phase !== "Ready") {
      log.warn(
        { recordElection: done?.cache.spec.electionId, phase: done?.cache.status?.phase },
        "not published: the record moved on to another election (or was deleted) during the promote",
      );
      this.metrics.promotes.inc({ result: "superseded" });
      return "skipped";
    }
    const seconds = Math.round(performance.now() - t0) / 1000;
    this.metrics.promoteSeconds.observe(seconds);
    this.metrics.promotes.inc({ result: "ready" });
    log.info(
      { namespaces: claims.namespaces, seconds, backend: profile.backend, written: done?.written },
      "promoted: cache Ready",
    );
    // Followers admitted while this ran (after the namespaces were listed) get theirs now; the
    // periodic resync covers anything later still.
    const late = await this.ensureClaims(short, source, undefined);
    if (late.ok) await this.recordNamespaces(short, late.namespaces);
    return "ready";
  }

  private async ensureClaims(
    short: string,
    source: CacheSource,
    leaderNamespace: string | undefined,
  ): Promise<ClaimsResult> {
    const { cfg } = this.o;
    return ensureClaimsForStampedPods({
      clients: this.clients,
      short,
      source,
      log: this.log.child({ hash: short }),
      extraNamespaces: leaderNamespace ? [leaderNamespace] : [],
      ...(this.storage?.claim ? { storeNamespace: this.storage.claim.namespace } : {}),
      retry: {
        attempts: cfg.claimAttempts,
        initialMs: cfg.claimBackoffMs,
        maxMs: Math.max(cfg.claimBackoffMs, 5_000),
      },
      onAttempt: (_ns, result) => this.metrics.claims.inc({ result }),
    });
  }

  /** Adds namespaces to a Ready record's list (never removes: a claim outlives its pods). */
  private async recordNamespaces(short: string, namespaces: string[]): Promise<void> {
    await this.records.transition(short, (c) => {
      const have = new Set(c.status?.namespaces ?? []);
      if (c.status?.phase !== "Ready" || c.metadata.deletionTimestamp || namespaces.every((n) => have.has(n)))
        return undefined;
      return { namespaces: [...new Set([...have, ...namespaces])].sort() };
    });
  }

  private async unsupported(
    hash: string,
    election: string,
    profile: StorageProfile,
    pod: k8s.V1Pod | undefined,
  ): Promise<PromoteOutcome> {
    const message =
      profile.note ??
      `storage of provisioner ${profile.provisioner}${profile.volumeType ? ` (${profile.volumeType})` : ""} clones a volume per pod: no read-only claim can be named ahead of time, so pods of this cache start cold`;
    this.log.warn(
      { hash: shortHash(hash), provisioner: profile.provisioner },
      "skipped: storage cannot be shared (Unsupported)",
    );
    this.metrics.promotes.inc({ result: "unsupported" });
    await this.fail(hash, election, "Unsupported", message, pod);
    return "unsupported";
  }

  /**
   * Failed for this election only (never over Ready, never onto a newer election), plus a Warning
   * on the leader. A failed capture or promote counts once per election (CacheRecords.fail).
   */
  private async fail(
    hash: string,
    election: string,
    reason: string,
    message: string,
    pod?: k8s.V1Pod,
  ): Promise<void> {
    await this.o.hooks?.beforeStatus?.(shortHash(hash), "Failed");
    const r = await this.records.fail(shortHash(hash), election, reason, message).catch((err: unknown) => {
      this.log.error({ err: (err as Error).message }, "could not record the failure");
      return undefined;
    });
    if (r && !r.written)
      this.log.info(
        {
          hash: shortHash(hash),
          election,
          recordElection: r.cache.spec.electionId,
          phase: r.cache.status?.phase,
          reason,
        },
        "failure not recorded: the record is Ready or about another election",
      );
    const eventReason =
      {
        Unsupported: "WarmstartUnsupported",
        PromoteFailed: "WarmstartPromoteFailed",
        LeaderGone: "WarmstartCaptureCancelled",
      }[reason] ?? "WarmstartCaptureFailed";
    if (pod) await this.event(pod, "Warning", eventReason, message);
  }

  private async event(
    pod: k8s.V1Pod,
    type: "Normal" | "Warning",
    reason: string,
    message: string,
  ): Promise<void> {
    await postPodEvent(this.core, pod, { type, reason, message, component: COMPONENT }).catch(
      (err: unknown) => this.log.warn({ err: (err as Error).message, reason }, "could not post event"),
    );
  }

  private async readPod(namespace: string, name: string): Promise<k8s.V1Pod | undefined> {
    try {
      return await this.core.readNamespacedPod({ name, namespace });
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw apiError(`reading pod ${namespace}/${name}`, err);
    }
  }

  private async readLease(short: string): Promise<k8s.V1Lease | undefined> {
    try {
      return await this.coordination.readNamespacedLease({
        name: leaseName(short),
        namespace: this.o.cfg.systemNamespace,
      });
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw apiError(`reading Lease ${leaseName(short)}`, err);
    }
  }

  /** A capture that committed nothing leaves no reason for this node to hold the record open. */
  private async dropFinalizerIfEmpty(hash: string): Promise<void> {
    if (await this.store.committed(hash).catch(() => undefined)) return;
    await this.records
      .removeFinalizer(hash, this.finalizer)
      .catch((err: unknown) =>
        this.log.warn({ err: (err as Error).message }, "could not drop the store finalizer"),
      );
  }

  /**
   * Makes room for `needed` more bytes under the store budget: caches no pod mounts go, least
   * recently restored first; a cache in use is never removed. Captures make room one at a time,
   * each holding what it needs until its tree is committed.
   */
  private makeRoom(short: string, needed: number, log: Logger): Promise<void> {
    const run = this.making.then(() => this.doMakeRoom(short, needed, log));
    this.making = run.catch(() => undefined);
    return run;
  }

  private async doMakeRoom(short: string, needed: number, log: Logger): Promise<void> {
    const budget = this.o.cfg.storeBudget;
    if (!budget) return;
    const trees = await this.store.list();
    let used = heldBytes(trees, this.reserved);
    if (used + needed > budget) {
      const mounted = await this.mountedCaches();
      const candidates: { short: string; bytes: number; lastUsed: number }[] = [];
      for (const t of trees) {
        // A tree a pipeline still holds (committed, about to be promoted) is not unused.
        if (t.short === short || this.reserved.has(t.short)) continue;
        if (mounted.has(t.short) || this.promoting.has(t.short)) continue;
        if (t.manifest.hash && this.marks.busyWith(t.manifest.hash)) continue;
        const cache = await this.records.get(t.short);
        const lastUsed =
          Date.parse(cache?.status?.lastRestoredAt ?? "") ||
          Date.parse(
            typeof cache?.status?.lastTransitionTime === "string" ? cache.status.lastTransitionTime : "",
          ) ||
          Date.parse(t.manifest.createdAt) ||
          0;
        candidates.push({ short: t.short, bytes: t.manifest.totalBytes, lastUsed });
      }
      candidates.sort((a, b) => a.lastUsed - b.lastUsed);
      const freeable = candidates.reduce((n, c) => n + c.bytes, 0);
      if (used - freeable + needed > budget) {
        throw new StoreFullError(
          `the store budget is ${formatBytes(budget)}: ${formatBytes(used)} held, ${trees.filter((x) => mounted.has(x.short)).length} cache(s) in use, ${formatBytes(needed)} needed and only ${formatBytes(freeable)} unused`,
        );
      }
      for (const c of candidates) {
        if (used + needed <= budget) break;
        log.info(
          { evict: c.short, bytes: c.bytes, lastUsed: new Date(c.lastUsed).toISOString() },
          "store budget: removing a cache no pod mounts (least recently restored first)",
        );
        if (!(await this.evict(c.short))) continue;
        used -= c.bytes;
        this.metrics.evictions.inc();
      }
      if (used + needed > budget)
        throw new StoreFullError(
          `the store budget is ${formatBytes(budget)}: caches became in use while room was made (${formatBytes(used)} held, ${formatBytes(needed)} needed)`,
        );
    }
    this.reserved.set(short, needed);
  }

  /**
   * Removes an unused cache from this node; false when a pod started to use it meanwhile. When
   * the cache's live tree is here the whole cache goes (its claims and PVs point here): it is
   * first marked unusable so no new restore is admitted, the mounts are looked at once more, and
   * only then is it deleted. Otherwise only this node's stale copy goes.
   */
  private async evict(short: string): Promise<boolean> {
    const cache = await this.records.get(short);
    if (cache && !cache.metadata.deletionTimestamp && cache.status?.node === this.o.cfg.node) {
      const before = cache.status;
      const marked = await this.records.transition(short, (c) =>
        c.metadata.resourceVersion === cache.metadata.resourceVersion
          ? {
              phase: "Failed",
              reason: "Deleting",
              message: `removed from node ${this.o.cfg.node} to make room in its store`,
            }
          : undefined,
      );
      if (!marked?.written) return false;
      if ((await this.mountedCaches()).has(short)) {
        // A restore was admitted in between: the cache stays as it was.
        await this.records.transition(short, (c) =>
          c.status?.reason === "Deleting"
            ? {
                phase: (before.phase ?? "Ready") as CachePhase,
                reason: before.reason ?? "",
                message: before.message ?? "",
              }
            : undefined,
        );
        return false;
      }
      await deleteCachePass(this.clients, short, { log: this.log });
    }
    await this.removeTree(short, "store budget");
    return true;
  }

  /** Short hashes of the caches some live pod mounts (claim `rox-<short>` in any namespace). */
  private async mountedCaches(): Promise<Set<string>> {
    const pods = await this.core.listPodForAllNamespaces({
      fieldSelector: "status.phase!=Succeeded,status.phase!=Failed",
    });
    const out = new Set<string>();
    for (const p of pods.items)
      for (const v of p.spec?.volumes ?? []) {
        const m = /^rox-([0-9a-f]{16})$/.exec(v.persistentVolumeClaim?.claimName ?? "");
        if (m) out.add(m[1]!);
      }
    return out;
  }

  /**
   * Removes this node's tree of a cache and then its finalizer on the record: a capture of it in
   * progress here is stopped first. One removal per cache at a time.
   */
  removeTree(short: string, why: string, o: { unlessMounted?: boolean } = {}): Promise<void> {
    const running = this.removing.get(short);
    if (running) return running;
    const p = (async (): Promise<void> => {
      // A deleted cache's files stay while a running pod still reads them; its claim going (the
      // rollback waits for that) changes the record, which brings this back.
      if (o.unlessMounted && (await this.mountedCaches()).has(short)) {
        this.log.info({ hash: short, why }, "stored tree kept for now: a pod still mounts the cache");
        return;
      }
      for (const m of this.marks.marks())
        if (shortHash(m.hash) === short) this.marks.cancel(m, "cache-deleted");
      // Only this cache's own work: a pipeline making room for another cache may be what called.
      const own = [...this.pipelines].filter(([, h]) => h === short).map(([p]) => p);
      await Promise.allSettled([...own, this.promoting.get(short)]);
      const removed = await this.store.remove(short);
      this.log.info({ hash: short, why, removed }, "stored tree removed");
      await this.records.removeFinalizer(short, this.finalizer);
      await this.publishStore().catch(() => undefined);
    })()
      .catch((err: unknown) =>
        this.log.error(
          { hash: short, err: (err as Error).message },
          "could not remove the stored tree; the resync retries",
        ),
      )
      .finally(() => this.removing.delete(short));
    this.removing.set(short, p);
    return p;
  }

  /** The store's use and budget, on Lease `warmstart-store-<node>` (for `warmstart caches`). */
  async publishStore(): Promise<void> {
    const { cfg } = this.o;
    const name = `warmstart-store-${cfg.node}`.slice(0, 253);
    const trees = await this.store.list();
    const annotations = {
      [ANN_STORE_BUDGET]: String(cfg.storeBudget),
      [ANN_STORE_USED]: String(bytesOf(trees)),
      [ANN_STORE_CACHES]: trees.map((t) => t.short).join(","),
      [ANN_STORE_NODE]: cfg.node,
    };
    const now = new k8s.V1MicroTime(new Date().toISOString());
    const patch = (): Promise<k8s.V1Lease> =>
      this.coordination.patchNamespacedLease(
        {
          name,
          namespace: cfg.systemNamespace,
          body: { metadata: { annotations }, spec: { renewTime: now } },
        },
        k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
      );
    try {
      await patch();
      return;
    } catch (err) {
      if (!isNotFound(err)) throw apiError(`updating Lease ${name}`, err);
    }
    // Owned by the Node: when the node goes, so does its store's row.
    const node = (
      await this.core.listNode({ fieldSelector: `metadata.name=${cfg.node}` }).catch(() => undefined)
    )?.items[0];
    const body: k8s.V1Lease = {
      metadata: {
        name,
        namespace: cfg.systemNamespace,
        labels: { [LABEL_STORE]: "true" },
        annotations,
        ...(node?.metadata?.uid
          ? { ownerReferences: [{ apiVersion: "v1", kind: "Node", name: cfg.node, uid: node.metadata.uid }] }
          : {}),
      },
      spec: { holderIdentity: cfg.node, renewTime: now },
    };
    try {
      await this.coordination.createNamespacedLease({ namespace: cfg.systemNamespace, body });
    } catch (err) {
      if (!isAlreadyExists(err)) throw apiError(`creating Lease ${name}`, err);
      try {
        await patch();
      } catch (e) {
        if (!isConflict(e)) throw apiError(`updating Lease ${name}`, e);
      }
    }
  }

  private storeLocation(): StoreLocation {
    const { cfg } = this.o;
    const claim = cfg.storeClaim?.split("/");
    return {
      node: cfg.node,
      dir: cfg.store,
      ...(claim ? { claim: { namespace: claim[0]!, name: claim[1]! } } : {}),
      ...(cfg.storeProvisioner ? { provisioner: cfg.storeProvisioner } : {}),
      ...(cfg.storeVolumeType ? { volumeType: cfg.storeVolumeType } : {}),
    };
  }

  private async storeStorage(): Promise<StoreStorage> {
    this.storage ??= await describeStore(this.o.kc, this.storeLocation());
    return this.storage;
  }

  private async storeProfile(): Promise<StorageProfile> {
    const s = await this.storeStorage();
    return this.profiles.resolve(s.provisioner, s.volumeType);
  }

  /**
   * Everything again, level-based: every pod on the node (a missed transition is caught here),
   * then every tree in the store: a tree whose record is being deleted (or gone) is removed; a
   * Ready cache promoted here gets its claims in namespaces that gained pods since; an unfinished
   * or failed promote of the record's current election (agent restart, claims that kept failing)
   * is retried. A status left by an earlier election is never resumed for a newer one.
   */
  async resync(): Promise<void> {
    for (const pod of this.informer.list()) this.handle(pod, "resync");
    for (const { short, manifest } of await this.store.list()) {
      if (this.stopped) return;
      if (!manifest.hash || this.marks.busyWith(manifest.hash) || this.promoting.has(short)) continue;
      const cache: ModelCacheObject | undefined = await this.records.get(short);
      if (!cache || cache.metadata.deletionTimestamp) {
        await this.removeTree(short, cache ? "the cache is being deleted" : "the cache has no record", {
          unlessMounted: true,
        });
        continue;
      }
      const status = cache.status;
      if (status?.node !== this.o.cfg.node) continue;
      const phase = status.phase;
      const election = cache.spec.electionId;
      const ours = Boolean(election) && status.electionId === election;
      const unfinished = phase === "Capturing" || phase === "Promoting";
      const retryable = phase === "Failed" && status.reason === "PromoteFailed";
      if (phase === "Ready") {
        const source = sourceOf(cache);
        if (!source) continue;
        const claims = await this.ensureClaims(short, source, undefined);
        if (claims.ok) await this.recordNamespaces(short, claims.namespaces);
        else
          this.log.warn(
            { hash: short, err: describeFailures(claims) },
            "claims still missing; next resync retries",
          );
      } else if ((unfinished || retryable) && ours) {
        this.log.info({ hash: short, phase, election }, "resuming the promote of a committed tree");
        await this.promote(manifest.hash, { manifest, election: election! });
      }
    }
    await this.publishStore().catch((err: unknown) =>
      this.log.warn({ err: (err as Error).message }, "could not publish the store's use"),
    );
  }

  /** Pipelines, promotes and removals running now (tests wait on these). */
  async idle(): Promise<void> {
    while (this.pipelines.size || this.promoting.size || this.removing.size) {
      await Promise.allSettled([
        ...this.pipelines.keys(),
        ...this.promoting.values(),
        ...this.removing.values(),
      ]);
    }
  }
}
