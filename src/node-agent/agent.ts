/**
 * The node agent (SPEC 1.4, 1.5): watches the pods on its node, captures the warmed cache of each
 * Ready leader into the node's cache store under the hash admission stamped on it, and promotes
 * the committed tree to claim `rox-<short>` in every namespace that needs it, moving the cache's
 * ModelCache record through Capturing, Promoting, then Ready or Failed.
 *
 * Level-based: a pod event, a restart and a periodic resync all lead to the same look at the pod
 * and the store. The store's committed tree is the proof that a capture is done; the cache record
 * is the proof that a promote is done.
 */
import { performance } from "node:perf_hooks";
import { setTimeout as sleep } from "node:timers/promises";
import * as k8s from "@kubernetes/client-node";
import { ResilientWatch } from "../common/watch.js";
import { realClock } from "../common/clock.js";
import { apiError, isNotFound, makeApiClient } from "../common/kube.js";
import { postPodEvent } from "../common/events.js";
import { createLogger, type Logger } from "../common/log.js";
import { classifyPod } from "../core/classify.js";
import { ANN_CACHE_SOURCE, ANN_ELECTION_ID, CACHE_VOLUME, claimName, shortHash } from "../core/contract.js";
import { AlreadyCapturedError, capture } from "../datapath/capture.js";
import type { Manifest } from "../datapath/manifest.js";
import { formatBytes } from "../datapath/progress.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import { promoteClients, type PromoteClients } from "../promote/claims.js";
import { describeFailures, ensureClaimsForStampedPods, type ClaimsResult } from "../promote/promote.js";
import { StorageProfiles, type StorageProfile } from "../promote/profiles.js";
import { describeStore, publishSource, type StoreLocation, type StoreStorage } from "../promote/publish.js";
import { encodeSource, sourceOf, type CacheSource } from "../promote/source.js";
import type { NodeAgentConfig } from "./config.js";
import { cancelReasonFor, decidePod, timeToReadySeconds } from "./decide.js";
import { CaptureMarks, type Mark, type ReleaseReason } from "./marks.js";
import { createNodeAgentMetrics, type NodeAgentMetrics } from "./metrics.js";
import { CacheRecords } from "./record.js";
import { Slots } from "./slots.js";
import { CacheStore, emptyDirPath } from "./store.js";

const COMPONENT = "warmstart-node-agent";

export type PromoteOutcome = "ready" | "failed" | "unsupported" | "skipped";

export interface NodeAgentOptions {
  cfg: NodeAgentConfig;
  kc: k8s.KubeConfig;
  log?: Logger;
  metrics?: NodeAgentMetrics;
}

interface PromoteContext {
  manifest: Manifest;
  /** The leader the tree was captured from, when known (events, the record's leader, its namespace). */
  pod?: k8s.V1Pod;
  captureSeconds?: number;
}

export class NodeAgent {
  readonly marks: CaptureMarks;
  readonly metrics: NodeAgentMetrics;
  readonly store: CacheStore;
  private readonly log: Logger;
  private readonly core: k8s.CoreV1Api;
  private readonly clients: PromoteClients;
  private readonly records: CacheRecords;
  private readonly profiles: StorageProfiles;
  private readonly informer: k8s.ListWatch<k8s.V1Pod>;
  private readonly watch: ResilientWatch<k8s.V1Pod>;
  private readonly slots: Slots;
  /** Pods whose outcome is settled without a capture of theirs (cache Ready elsewhere, unsupported storage). */
  private readonly settled = new Map<string, ReleaseReason>();
  private readonly pipelines = new Set<Promise<void>>();
  private readonly promoting = new Map<string, Promise<PromoteOutcome>>();
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
    this.clients = promoteClients(kc);
    this.records = new CacheRecords(this.clients.custom);
    this.profiles = new StorageProfiles(this.core, cfg.systemNamespace, this.log);
    this.store = new CacheStore(cfg.store);
    this.slots = new Slots(cfg.concurrency);
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
    this.informer = new k8s.ListWatch<k8s.V1Pod>(
      "/api/v1/pods",
      new k8s.Watch(kc),
      async () => {
        const list = await this.core.listPodForAllNamespaces({ fieldSelector });
        this.listed = this.everListed = true;
        return list;
      },
      false,
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
  }

  async start(): Promise<void> {
    if (!this.stopped) return;
    this.stopped = false;
    await this.store.init();
    this.watch.start();
    this.resyncTimer = setInterval(() => {
      if (this.resyncing) return;
      this.resyncing = this.resync()
        .catch((err: unknown) =>
          this.log.warn({ err: (err as Error).message }, "resync failed; next one will retry"),
        )
        .finally(() => (this.resyncing = undefined));
    }, this.o.cfg.resyncMs);
    this.log.info(
      { store: this.o.cfg.store, warmupMs: this.o.cfg.warmupMs, concurrency: this.o.cfg.concurrency },
      "node agent watching pods on its node",
    );
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    clearInterval(this.resyncTimer);
    await this.watch.stop();
    for (const m of this.marks.marks()) this.marks.cancel(m, "stopped");
    // A capture cannot be interrupted halfway without leaving a staging tree; let it finish.
    await Promise.allSettled([...this.pipelines, ...this.promoting.values(), this.resyncing]);
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
      return;
    }

    const d = decidePod(pod, this.o.cfg.node);
    const log = this.log.child({ pod: key, uid });
    if (d.action === "skip") {
      decision(`skipped-${d.reason}`);
      const m = this.marks.get(uid);
      if (m) this.marks.cancel(m, cancelReasonFor(d.reason));
      if (d.reason === "no-capture-label" || d.reason === "other-node")
        log.debug({ reason: d.reason }, "skipped: not a capture leader");
      else if (d.reason === "no-hash")
        log.warn({ detail: d.detail }, "skipped: leader carries no stamped hash");
      else if (d.reason === "terminating") log.info("skipped: terminating");
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
    const p = this.run(mark, pod).finally(() => this.pipelines.delete(p));
    this.pipelines.add(p);
  }

  /** Runs one mark's pipeline and releases the mark on every way out but a committed capture. */
  private async run(mark: Mark, pod: k8s.V1Pod): Promise<void> {
    const log = this.log.child({ pod: mark.key, uid: mark.uid, hash: shortHash(mark.hash) });
    let reason: ReleaseReason = "error";
    try {
      const outcome = await this.pipeline(mark, pod, log);
      if (outcome !== "committed") reason = outcome;
    } catch (err) {
      const aborted = mark.controller.signal.aborted;
      reason = aborted ? (mark.controller.signal.reason as ReleaseReason) : "error";
      if (aborted) log.info({ reason }, "abandoned: the pod changed while it was being prepared");
      else log.error({ err: (err as Error).message }, "failed: capture pipeline error");
    } finally {
      this.marks.release(mark, reason);
    }
  }

  private async pipeline(mark: Mark, pod: k8s.V1Pod, log: Logger): Promise<"committed" | ReleaseReason> {
    const { cfg } = this.o;
    const signal = mark.controller.signal;
    const short = shortHash(mark.hash);

    const already = await this.store.committed(mark.hash);
    if (already) {
      this.marks.commit(mark);
      this.metrics.decisions.inc({ decision: "skipped-already-captured" });
      this.metrics.captures.inc({ result: "already-captured" });
      log.info("skipped: already captured (the store holds its committed tree)");
      await this.promote(mark.hash, { manifest: already, pod });
      return "committed";
    }

    log.info({ warmupMs: cfg.warmupMs }, "scheduled: capturing after the warm-up if the pod stays Ready");
    await sleep(cfg.warmupMs, undefined, { signal });

    // Still the same pod, still Ready, still our leader: only then is its cache worth copying.
    const [namespace, name] = mark.key.split("/") as [string, string];
    const fresh = await this.readPod(namespace, name);
    if (!fresh) return "pod-deleted";
    if (fresh.metadata?.uid !== mark.uid) return "pod-replaced";
    const again = decidePod(fresh, cfg.node);
    if (again.action === "skip") return cancelReasonFor(again.reason);
    if (again.hash !== mark.hash) return "warmup-cancelled";

    mark.stage = "waiting-slot";
    const releaseSlot = await this.slots.acquire(signal);
    let manifest: Manifest;
    let captureSeconds: number;
    try {
      mark.stage = "capturing";
      const profile = await this.storeProfile();
      const { cache } = await this.records.ensure(mark.hash, {
        model: classifyPod(fresh).model,
        electionId: fresh.metadata?.annotations?.[ANN_ELECTION_ID],
        leader: { namespace, name, uid: mark.uid, node: cfg.node },
      });
      if (profile.backend === "per-pod-clone") {
        await this.unsupported(mark.hash, profile, fresh);
        this.settled.set(mark.uid, "unsupported");
        return "unsupported";
      }
      if (cache.status?.phase === "Ready") {
        log.info("skipped: cache already Ready");
        this.settled.set(mark.uid, "cache-ready");
        return "cache-ready";
      }
      const started = await this.records.transition(short, (c) =>
        c.status?.phase === "Ready" || !ofElection(c, fresh)
          ? undefined
          : {
              phase: "Capturing",
              reason: "CaptureStarted",
              message: `capturing ${namespace}/${name} on node ${cfg.node}`,
              node: cfg.node,
            },
      );
      if (started && !started.written) {
        this.settled.set(mark.uid, "cache-ready");
        return "cache-ready";
      }

      const tree = this.store.treeDir(mark.hash);
      const t0 = performance.now();
      try {
        manifest = await capture({
          src: emptyDirPath(cfg.kubeletRoot, mark.uid, CACHE_VOLUME),
          dest: tree,
          hash: mark.hash,
          model: classifyPod(fresh).model,
          parallel: cfg.captureParallel,
          progress: false,
          durable: cfg.durable,
          log,
        });
      } catch (err) {
        if (!(err instanceof AlreadyCapturedError)) {
          const message = (err as Error).message;
          this.metrics.captures.inc({ result: "failed" });
          log.error({ err: message }, "failed: capture");
          await this.fail(
            mark.hash,
            "CaptureFailed",
            `capture on node ${cfg.node} failed: ${message}`,
            fresh,
          );
          return "capture-failed";
        }
        const theirs = await this.store.committed(mark.hash);
        if (!theirs) throw err;
        manifest = theirs;
      }
      captureSeconds = Math.round(performance.now() - t0) / 1000;

      // The pod went away while we copied: files that vanished may be the kubelet tearing its
      // volume down, so the tree may be short of files. A complete one is kept.
      if (signal.aborted && manifest.skipped.some((s) => s.reason === "vanished")) {
        await this.store.discard(mark.hash);
        this.metrics.captures.inc({ result: "discarded" });
        const why = String(signal.reason);
        log.warn(
          { why, vanished: manifest.skipped.length },
          "discarded: the pod went away during the capture",
        );
        await this.fail(
          mark.hash,
          "CaptureFailed",
          `leader ${mark.key} went away during the capture (${why}); discarded`,
        );
        return "discarded";
      }
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
    await this.event(
      fresh,
      "Normal",
      "WarmstartCaptured",
      `captured ${manifest.fileCount} files (${formatBytes(manifest.totalBytes)}) on node ${cfg.node} in ${captureSeconds.toFixed(2)}s; promoting cache ${short}`,
    );
    await this.promote(mark.hash, { manifest, pod: fresh, captureSeconds });
    return "committed";
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
    const log = this.log.child({ hash: short });
    const t0 = performance.now();
    const profile = await this.storeProfile();
    const pod = ctx.pod;
    let cache = await this.records.get(short);
    if (!cache && pod) {
      cache = (
        await this.records.ensure(hash, {
          model: classifyPod(pod).model,
          electionId: pod.metadata?.annotations?.[ANN_ELECTION_ID],
          leader: {
            namespace: pod.metadata?.namespace,
            name: pod.metadata?.name,
            uid: pod.metadata?.uid,
            node: cfg.node,
          },
        })
      ).cache;
    }
    if (!cache) {
      log.info("skipped promote: the cache has no record (removed on purpose)");
      return "skipped";
    }
    if (profile.backend === "per-pod-clone") return this.unsupported(hash, profile, pod);

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

    const moved = await this.records.transition(short, (c) =>
      c.status?.phase === "Ready"
        ? undefined
        : {
            phase: "Promoting",
            reason: "Captured",
            message: `captured on node ${cfg.node}; promoting (${profile.backend})`,
            ...stats,
          },
    );
    if (!moved) return "skipped";
    const wasReady = !moved.written;
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
        await this.fail(hash, "PromoteFailed", message, pod);
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
      await this.fail(hash, claims.unsupported ? "Unsupported" : "PromoteFailed", message, pod);
      this.metrics.promotes.inc({ result: "failed" });
      return "failed";
    }
    if (wasReady) {
      await this.recordNamespaces(short, claims.namespaces);
      return "ready";
    }
    const done = await this.records.transition(short, (c) =>
      c.status?.phase === "Ready"
        ? undefined
        : {
            phase: "Ready",
            reason: "Promoted",
            message: `${claimName(short)} in ${claims.namespaces.length} namespace(s) (${profile.backend} on ${cfg.node})`,
            namespaces: claims.namespaces,
          },
    );
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
      if (c.status?.phase !== "Ready" || namespaces.every((n) => have.has(n))) return undefined;
      return { namespaces: [...new Set([...have, ...namespaces])].sort() };
    });
  }

  private async unsupported(
    hash: string,
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
    await this.fail(hash, "Unsupported", message, pod);
    return "unsupported";
  }

  /** Failed, unless the cache is Ready (someone else's success is never overwritten), plus a Warning on the leader. */
  private async fail(hash: string, reason: string, message: string, pod?: k8s.V1Pod): Promise<void> {
    await this.records
      .transition(shortHash(hash), (c) =>
        c.status?.phase === "Ready" || (pod && !ofElection(c, pod))
          ? undefined
          : { phase: "Failed", reason, message },
      )
      .catch((err: unknown) =>
        this.log.error({ err: (err as Error).message }, "could not record the failure"),
      );
    const eventReason =
      { Unsupported: "WarmstartUnsupported", PromoteFailed: "WarmstartPromoteFailed" }[reason] ??
      "WarmstartCaptureFailed";
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
   * then every tree in the store whose cache this node promoted: a Ready one gets its claims in
   * namespaces that gained pods since, an unfinished or failed promote (agent restart, claims
   * that kept failing) is retried.
   */
  async resync(): Promise<void> {
    for (const pod of this.informer.list()) this.handle(pod, "resync");
    for (const { short, manifest } of await this.store.list()) {
      if (this.stopped) return;
      if (!manifest.hash || this.marks.busyWith(manifest.hash) || this.promoting.has(short)) continue;
      const cache: ModelCacheObject | undefined = await this.records.get(short);
      const status = cache?.status;
      if (!cache || status?.node !== this.o.cfg.node) continue;
      const phase = status.phase;
      const unfinished = phase === "Capturing" || phase === "Promoting" || phase === "Electing";
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
      } else if (unfinished || retryable) {
        this.log.info({ hash: short, phase }, "resuming the promote of a committed tree");
        await this.promote(manifest.hash, { manifest });
      }
    }
  }

  /** Pipelines and promotes running now (tests wait on these). */
  async idle(): Promise<void> {
    while (this.pipelines.size || this.promoting.size) {
      await Promise.allSettled([...this.pipelines, ...this.promoting.values()]);
    }
  }
}

/**
 * Whether a leader pod belongs to the election the record is about now: a pod of an election
 * that was retired (and re-run) must not write Capturing or Failed onto the new one's record.
 */
function ofElection(cache: ModelCacheObject, pod: k8s.V1Pod): boolean {
  const current = cache.spec.electionId;
  const mine = pod.metadata?.annotations?.[ANN_ELECTION_ID];
  return !current || !mine || current === mine;
}
