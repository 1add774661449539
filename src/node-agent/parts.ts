/**
 * What the node agent's reconcilers and capture jobs share: its configuration, clients, the store,
 * the capture marks, and reads from the informers (never one GET for what an informer holds).
 */
import type * as k8s from "@kubernetes/client-node";
import { PHASE, type CachePhase } from "../api/names.js";
import { REASON, type CacheReason } from "../api/reasons.js";
import type { Clock } from "../common/clock.js";
import type { CacheRecords } from "../common/cache-record.js";
import { postPodEvent } from "../common/events.js";
import type { Logger } from "../common/log.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import { shortHash } from "../core/contract.js";
import type { CaptureHooks } from "../datapath/capture.js";
import type { PromoteClients } from "../promote/claims.js";
import type { NodeAgentConfig } from "./config.js";
import type { CaptureMarks } from "./marks.js";
import type { NodeAgentMetrics } from "./metrics.js";
import type { CacheStore } from "./store.js";

export const COMPONENT = "warmstart-node-agent";

/** Points where tests make the agent wait, to land a change of the cluster at an exact moment. */
export interface NodeAgentHooks {
  /** Passed to every capture (the copy waits on them). */
  capture?: CaptureHooks;
  /** Before each record write about an election (phase: the one about to be written). */
  beforeStatus?: (short: string, phase: CachePhase) => void | Promise<void>;
}

export interface AgentParts {
  cfg: NodeAgentConfig;
  log: Logger;
  metrics: NodeAgentMetrics;
  clock: Clock;
  hooks: NodeAgentHooks;
  core: k8s.CoreV1Api;
  coordination: k8s.CoordinationV1Api;
  clients: PromoteClients;
  records: CacheRecords;
  store: CacheStore;
  marks: CaptureMarks;
  /** This node's finalizer on the records of the caches its store holds. */
  finalizer: string;
  /** A cache record as the informer holds it. */
  record: (short: string) => ModelCacheObject | undefined;
  /** A pod of this node as the informer holds it. */
  pod: (namespace: string, name: string) => k8s.V1Pod | undefined;
}

/**
 * Failed for this election only (never over Ready, never onto a newer election), plus a Warning
 * on the leader. A failed capture or promote counts once per election (CacheRecords.fail).
 */
export async function recordFailure(
  p: AgentParts,
  hash: string,
  election: string,
  reason: CacheReason,
  message: string,
  pod?: k8s.V1Pod,
): Promise<void> {
  await p.hooks.beforeStatus?.(shortHash(hash), PHASE.Failed);
  const r = await p.records.fail(shortHash(hash), election, reason, message).catch((err: unknown) => {
    p.log.error({ err }, "could not record the failure");
    return undefined;
  });
  if (r && !r.written)
    p.log.info(
      {
        hash: shortHash(hash),
        election,
        recordElection: r.cache.spec.electionId,
        phase: r.cache.status?.phase,
        reason,
      },
      "failure not recorded: the record is Ready or about another election",
    );
  const eventReason = EVENT_REASONS[reason] ?? "WarmstartCaptureFailed";
  if (pod) await podEvent(p, pod, "Warning", eventReason, message);
}

/** The leader's Warning for a failure, by the record's reason (a failed capture otherwise). */
const EVENT_REASONS: Partial<Record<CacheReason, string>> = {
  [REASON.Unsupported]: "WarmstartUnsupported",
  [REASON.PromoteFailed]: "WarmstartPromoteFailed",
  [REASON.LeaderGone]: "WarmstartCaptureCancelled",
};

export async function podEvent(
  p: AgentParts,
  pod: k8s.V1Pod,
  type: "Normal" | "Warning",
  reason: string,
  message: string,
): Promise<void> {
  await postPodEvent(p.core, pod, { type, reason, message, component: COMPONENT }).catch((err: unknown) =>
    p.log.warn({ err, reason }, "could not post event"),
  );
}

/** A capture that committed nothing leaves no reason for this node to hold the record open. */
export async function dropFinalizerIfEmpty(p: AgentParts, hash: string): Promise<void> {
  if (await p.store.committed(hash).catch(() => undefined)) return;
  await p.records
    .removeFinalizer(hash, p.finalizer)
    .catch((err: unknown) => p.log.warn({ err }, "could not drop the store finalizer"));
}
