/**
 * The pod reconciler (key `namespace/name`): one level-based look at one pod of this node. It
 * records an election's first-seen leader, and for an elected leader that is Ready it waits out
 * the warm-up (a requeue after the time left since the pod turned Ready), checks the election once
 * more and starts the capture job. A pod that changes under a warm-up or a capture (deleted,
 * replaced, in a final phase, relabelled; a warm-up also when no longer Ready) ends it. A leader
 * whose tree is already committed here hands its cache to the cache reconciler.
 */
import type * as k8s from "@kubernetes/client-node";
import { PHASE } from "../api/names.js";
import { NOT_LEADER, REASON } from "../api/reasons.js";
import type { LeaderClaim } from "../common/cache-record.js";
import type { ReconcileContext, ReconcileResult } from "../common/controller/controller.js";
import type { Logger } from "../common/log.js";
import type { Manifest } from "../datapath/manifest.js";
import { SETTLED } from "./capture-jobs.js";
import { StartupReadings } from "./startups.js";
import { checkLeader, sightLeader } from "./leader.js";
import type { AgentParts } from "./parts.js";
import {
  cancelReasonFor,
  cancelsCapture,
  decidePod,
  leaderSighting,
  readySince,
  type LeaderSighting,
} from "./decide.js";
import type { CaptureMarks, Mark, ReleaseReason } from "./marks.js";
import type { NodeAgentMetrics } from "./metrics.js";

/** What the pod reconciler needs, as narrow as it can be (unit tests give it plain objects). */
export interface PodReconcilerDeps {
  node: string;
  warmupMs: number;
  now(): number;
  metrics: Pick<NodeAgentMetrics, "decisions" | "captures">;
  marks: CaptureMarks;
  /** The pod as the informer holds it. */
  pod(namespace: string, name: string): k8s.V1Pod | undefined;
  /** The committed tree of a hash in this node's store. */
  committed(hash: string): Promise<Manifest | undefined>;
  /** Whether the cache's record (informer) is Ready and not being deleted. */
  cacheReady(short: string): boolean;
  sight(seen: LeaderSighting, uid: string, log: Logger): Promise<void>;
  checkLeader(pod: k8s.V1Pod, hash: string, election: string): Promise<LeaderClaim>;
  startCapture(mark: Mark, pod: k8s.V1Pod, election: string): void;
  /**
   * This election's leader is on a node whose store already holds the committed tree (an earlier
   * election captured it here): the record says so (this node, capturing), and the cache
   * reconciler promotes it for this election.
   */
  adoptStored(hash: string, election: string): Promise<void>;
  /** Ask the cache reconciler to look at this cache (promote it, keep its claims). */
  enqueueCache(short: string): void;
  /** Records a Ready leader's or restore's start from its engine's log, once (startups.ts). */
  observeStart?(pod: k8s.V1Pod, log: Logger): Promise<void>;
}

export function podReconciler(
  d: PodReconcilerDeps,
): (key: string, ctx: ReconcileContext) => Promise<ReconcileResult> {
  const decision = (x: string): void => d.metrics.decisions.inc({ decision: x });
  /** Ends a mark: at once when nothing runs for it, else by telling its job to stop. */
  const end = (mark: Mark, reason: ReleaseReason): void => {
    if (mark.stage === "warmup") d.marks.release(mark, reason);
    else d.marks.cancel(mark, reason);
  };

  return async (key, { log }) => {
    const [namespace, name] = key.split("/") as [string, string];
    const pod = d.pod(namespace, name);
    const uid = pod?.metadata?.uid;
    const marked = d.marks.forKey(key);
    if (!pod || !uid) {
      if (marked) end(marked, "pod-deleted");
      d.marks.forgetKey(key);
      return;
    }
    // A pod of the same name under another UID replaced the one we were working on.
    if (marked && marked.uid !== uid) end(marked, "pod-replaced");
    log = log.child({ pod: key, uid });

    const seen = leaderSighting(pod, d.node);
    if (seen) await d.sight(seen, uid, log);
    await d.observeStart?.(pod, log).catch((err: unknown) => log.warn({ err }, "start not recorded"));

    const dec = decidePod(pod, d.node);
    const mark = d.marks.get(uid);
    if (dec.action === "skip") {
      decision(`skipped-${dec.reason}`);
      // A pod in a final phase (evicted, say) never runs again, and the kubelet tears its volume
      // down under the copy: that is no blip, the copy stops (the job records how it ended).
      // eslint-disable-next-line no-restricted-syntax -- a Pod's phase, not the cache's
      const ended = pod.status?.phase === "Failed" || pod.status?.phase === "Succeeded";
      if (mark && (mark.stage !== "capturing" || cancelsCapture(dec.reason) || ended))
        end(mark, ended ? "terminating" : cancelReasonFor(dec.reason));
      else if (mark) log.info({ reason: dec.reason }, "still capturing: a Ready blip does not stop a copy");
      if (dec.reason === "no-hash")
        log.warn({ detail: dec.detail }, "skipped: leader carries no stamped hash");
      else if (dec.reason === "no-election-id" && d.marks.lastRelease(uid) !== "not-leader") {
        log.warn("ignored: wears the capture label but no election id");
        d.marks.settle(uid, key, "not-leader");
      } else if (dec.reason === "terminating") log.info("skipped: terminating");
      else if (dec.reason === "not-ready") log.info({ phase: dec.detail }, "skipped: not Ready");
      return;
    }
    if (mark && mark.stage !== "warmup") {
      decision("skipped-in-progress");
      return;
    }
    if (d.marks.isCommitted(uid)) {
      decision("skipped-already-captured");
      return;
    }
    const settled = d.marks.lastRelease(uid);
    if (!mark && settled && SETTLED.has(settled)) {
      decision("skipped-settled");
      return;
    }
    const m = mark ?? d.marks.tryMark(uid, key, dec.hash, d.now());
    if (!m) return;
    if (!mark) {
      decision("scheduled");
      log.info({ warmupMs: d.warmupMs }, "scheduled: capturing after the warm-up if the pod stays Ready");
    }

    // A committed tree: nothing to capture, only a promote (or claims) to keep up.
    const stored = await d.committed(dec.hash);
    if (stored && d.cacheReady(dec.short)) {
      d.marks.commit(m);
      decision("skipped-already-captured");
      d.metrics.captures.inc({ result: "already-captured" });
      log.info("skipped: already captured and promoted (the store holds its committed tree)");
      d.enqueueCache(dec.short);
      return;
    }

    const leader = await d.checkLeader(pod, dec.hash, dec.election);
    if (m.controller.signal.aborted) return;
    if (!leader.ok) return notLeader(leader, m, log);

    if (stored) {
      await d.adoptStored(dec.hash, dec.election);
      d.marks.commit(m);
      decision("skipped-already-captured");
      d.metrics.captures.inc({ result: "already-captured" });
      log.info(
        "skipped: already captured (the store holds its committed tree); promoting it for this election",
      );
      d.enqueueCache(dec.short);
      return;
    }

    // The warm-up counts from when the pod turned Ready (an agent restart does not restart it).
    const since = readySince(pod)?.getTime() ?? m.since;
    const left = since + d.warmupMs - d.now();
    if (left > 0) return { requeueAfterMs: left };
    d.startCapture(m, pod, dec.election);
  };

  function notLeader(claim: Extract<LeaderClaim, { ok: false }>, m: Mark, log: Logger): void {
    if (claim.reason === NOT_LEADER.CacheReady) {
      log.info("skipped: cache already Ready");
      d.marks.release(m, "cache-ready");
    } else if (claim.reason === NOT_LEADER.CacheDeleting) {
      // Not this pod's fault: once the record is gone its Lease vouches for it again.
      log.info("skipped for now: the cache is being deleted");
      d.marks.release(m, "cache-deleted");
    } else {
      log.warn({ reason: claim.reason, why: claim.why }, "ignored: not the elected leader");
      decision("ignored-not-leader");
      d.marks.release(m, "not-leader");
    }
  }
}

/** The pod reconciler's needs, met by the agent's parts. */
export function podReconcilerDeps(
  p: AgentParts,
  o: Pick<PodReconcilerDeps, "startCapture" | "enqueueCache">,
): PodReconcilerDeps {
  const startups = new StartupReadings(p);
  return {
    node: p.cfg.node,
    warmupMs: p.cfg.warmupMs,
    now: () => p.clock.now(),
    metrics: p.metrics,
    marks: p.marks,
    pod: p.pod,
    committed: (hash) => p.store.committed(hash),
    cacheReady: (short) => {
      const c = p.record(short);
      return c?.status?.phase === PHASE.Ready && !c.metadata.deletionTimestamp;
    },
    sight: (seen, uid, log) => sightLeader(p, seen, uid, log),
    checkLeader: (pod, hash, election) => checkLeader(p, pod, hash, election),
    observeStart: (pod, log) => startups.observe(pod, log),
    adoptStored: async (hash, election) => {
      await p.records.advance(hash, election, "captureStarted", {
        reason: REASON.CaptureStarted,
        message: `node ${p.cfg.node} already holds the committed tree`,
        node: p.cfg.node,
      });
    },
    ...o,
  };
}
