import { randomBytes } from "node:crypto";
import type { V1Pod } from "@kubernetes/client-node";
import { classifyPod } from "../core/classify.js";
import { cacheHash, type HashInputs } from "../core/hash.js";
import {
  decorateCold,
  decorateFollower,
  decorateLeader,
  decorateRestore,
  jsonPatch,
} from "../core/decorate.js";
import { ANN_RESTORE_FROM, SKIP, claimName, shortHash, type Role } from "../core/contract.js";
import type { Logger } from "../common/log.js";
import type { AdmissionResponse, AdmissionReview } from "./server.js";
import type { WebhookConfig } from "./config.js";
import type { WebhookMetrics } from "./metrics.js";
import type { ElectionResult } from "./election.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import { ANN_ADMISSION_ID, type PendingEvent } from "./events.js";

/** What the decision needs from the cluster; each call is bounded by the admission deadline. */
export interface ClusterView {
  getModelCache(hashOrShort: string): Promise<ModelCacheObject | undefined>;
  tryAcquire(hash: string, electionId: string, podNamespace: string): Promise<ElectionResult>;
  /** Returns the cache instead when it is already Ready (the caller then restores). */
  recordElection(opts: {
    hash: string;
    model?: string;
    inputs?: HashInputs;
    electionId: string;
    namespace: string;
    name?: string;
  }): Promise<ModelCacheObject | undefined>;
  releaseLease(hash: string, leaseUid: string): Promise<void>;
  /** The storage profile's restore settings for a cache (backend-specific prewarm policy). */
  restoreProfile(
    cache: ModelCacheObject,
  ): Promise<{ prewarm: boolean; prewarmParallelism: number; treePath: string }>;
  /** The prewarm policy of the cluster's cache stores, for followers (their cache is not made yet). */
  followerProfile(): Promise<{ prewarm: boolean; prewarmParallelism: number }>;
  /** A restore in a namespace that has no claim yet gets one at admission. */
  ensureClaim?(cache: ModelCacheObject, namespace: string): Promise<void>;
}

export interface AdmissionDeps {
  cfg: WebhookConfig;
  cluster: ClusterView;
  log: Logger;
  metrics: WebhookMetrics;
  recordEvent(ev: PendingEvent): void;
}

export interface Decision {
  role: Role | "pass";
  reason: string;
  pod?: V1Pod;
  hash?: string;
  admissionId?: string;
}

const mintId = (): string => randomBytes(8).toString("hex");

/**
 * SPEC 1.3, in order: leave alone, stamp, restore-from, restore, elect, cold. Returns the decorated
 * pod (or none when the pod is left alone). Throws only on cluster errors, which the caller turns
 * into a fail-open admit.
 */
export async function decide(
  review: AdmissionReview,
  deps: AdmissionDeps,
  /** True once the caller has stopped waiting (it already admitted the pod unchanged). */
  expired?: () => boolean,
): Promise<Decision> {
  const req = review.request;
  if (req.operation !== "CREATE" || req.resource?.resource !== "pods" || req.subResource) {
    return { role: "pass", reason: "not a pod creation" };
  }
  const pod = req.object as V1Pod | undefined;
  if (!pod || typeof pod !== "object" || !pod.spec) return { role: "pass", reason: "no pod in the request" };
  const namespace = req.namespace ?? pod.metadata?.namespace ?? "default";
  if (namespace === deps.cfg.systemNamespace) return { role: "pass", reason: "system namespace" };
  if (pod.metadata?.annotations?.[SKIP] === "true") return { role: "pass", reason: `opted out (${SKIP})` };

  const c = classifyPod(pod);
  if (!c.downloader) return { role: "pass", reason: c.reason };

  const { hash, inputs } = cacheHash(pod, c);
  const admissionId = mintId();
  const stamped: V1Pod = {
    ...pod,
    metadata: {
      ...pod.metadata,
      annotations: { ...pod.metadata?.annotations, [ANN_ADMISSION_ID]: admissionId },
    },
  };
  const cold = (reason: string): Decision => ({
    role: "cold",
    reason,
    hash,
    admissionId,
    pod: decorateCold(stamped, { hash, reason }),
  });
  const restore = async (cache: ModelCacheObject, reason: string): Promise<Decision> => {
    const cacheHashFull = cache.spec.hash;
    // A dry run must not create the claim (the webhook declares no side effects).
    if (!req.dryRun) await deps.cluster.ensureClaim?.(cache, namespace);
    const profile = await deps.cluster.restoreProfile(cache);
    return {
      role: "restore",
      reason,
      hash,
      admissionId,
      pod: decorateRestore(stamped, {
        hash,
        reason,
        claimName: claimName(cacheHashFull),
        sourceHash: cacheHashFull,
        image: deps.cfg.image,
        cacheRoot: deps.cfg.cacheRoot,
        prewarm: profile.prewarm,
        prewarmParallelism: profile.prewarmParallelism,
        treePath: profile.treePath,
      }),
    };
  };

  const restoreFrom = pod.metadata?.annotations?.[ANN_RESTORE_FROM];
  if (restoreFrom) {
    const cache = await deps.cluster.getModelCache(restoreFrom);
    if (cache?.status?.phase === "Ready")
      return restore(cache, `restore from ${shortHash(restoreFrom)} (requested)`);
    return cold(`restore-from ${restoreFrom} has no Ready cache`);
  }

  const cache = await deps.cluster.getModelCache(hash);
  if (cache?.status?.phase === "Ready") return restore(cache, "cache Ready");
  if (cache?.status?.phase === "Failed" && cache.status.reason === "Unsupported") {
    return cold(`cache backend unsupported: ${cache.status.message ?? ""}`.trim());
  }
  const failures = Number(cache?.status?.failures ?? 0);
  if (cache?.status?.phase === "Failed" && failures >= deps.cfg.maxCaptureAttempts) {
    // Delete the ModelCache to try again.
    return cold(
      `capture failed ${failures} times (last: ${cache.status.message ?? cache.status.reason ?? "?"})`,
    );
  }

  if (!deps.cfg.electionEnabled) return cold("election disabled");
  // A dry run must not leave a Lease behind (the webhook declares no side effects).
  if (req.dryRun) return cold("dry run: no election");

  const electionId = admissionId;
  const result = await deps.cluster.tryAcquire(hash, electionId, namespace);
  if (result.role === "leader") {
    // A Lease won by a pod that is then admitted unchanged (an error below, or the answer
    // already given up on) would gate every other replica behind a leader that never comes:
    // give it back.
    try {
      if (expired?.()) throw new Error("admission deadline passed after the election");
      const ready = await deps.cluster.recordElection({
        hash,
        model: c.model,
        inputs,
        electionId,
        namespace,
        name: pod.metadata?.name,
      });
      if (ready) {
        await deps.cluster.releaseLease(hash, result.leaseUid);
        return await restore(ready, "cache Ready (turned Ready during admission)");
      }
      if (expired?.()) throw new Error("admission deadline passed after the election");
    } catch (err) {
      await deps.cluster
        .releaseLease(hash, result.leaseUid)
        .catch((releaseErr: unknown) =>
          deps.log.warn({ err: releaseErr, hash: shortHash(hash) }, "could not give back the election Lease"),
        );
      throw err;
    }
    return {
      role: "leader",
      reason: "won the election",
      hash,
      admissionId,
      pod: decorateLeader(stamped, {
        hash,
        reason: "won the election",
        electionId,
        cacheRoot: deps.cfg.cacheRoot,
        sizeLimit: deps.cfg.cacheSizeLimit,
      }),
    };
  }
  const profile = await deps.cluster.followerProfile();
  return {
    role: "follower",
    reason: "another pod is downloading",
    hash,
    admissionId,
    pod: decorateFollower(stamped, {
      hash,
      reason: "another pod is downloading",
      image: deps.cfg.image,
      cacheRoot: deps.cfg.cacheRoot,
      prewarm: profile.prewarm,
      prewarmParallelism: profile.prewarmParallelism,
    }),
  };
}

/** The AdmissionReview handler: decide within the deadline, or admit unchanged and say why. */
export function admissionHandler(
  deps: AdmissionDeps,
): (review: AdmissionReview) => Promise<AdmissionResponse> {
  // Stay inside the API server's timeout so our fail-open answer is the one that counts.
  const budgetMs = Math.max(200, deps.cfg.timeoutSeconds * 1000 - 750);
  return async (review) => {
    const started = process.hrtime.bigint();
    const uid = review.request.uid;
    const pod = review.request.object as V1Pod | undefined;
    const namespace = review.request.namespace ?? "default";
    const name = pod?.metadata?.name ?? pod?.metadata?.generateName ?? "";
    const observe = (outcome: string): void => {
      deps.metrics.latency.observe({ outcome }, Number(process.hrtime.bigint() - started) / 1e9);
    };
    let timer: NodeJS.Timeout | undefined;
    let expired = false;
    try {
      const decision = await Promise.race([
        decide(review, deps, () => expired),
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => {
            expired = true;
            reject(new Error(`no decision within ${budgetMs} ms`));
          }, budgetMs);
        }),
      ]);
      deps.metrics.decisions.inc({ role: decision.role, reason: decision.reason });
      if (decision.role === "pass" || !decision.pod || !pod) {
        deps.log.debug({ namespace, pod: name, reason: decision.reason }, "left alone");
        observe("pass");
        return { uid, allowed: true };
      }
      const patch = jsonPatch(pod, decision.pod);
      deps.log.info(
        {
          namespace,
          pod: name,
          role: decision.role,
          reason: decision.reason,
          hash: decision.hash && shortHash(decision.hash),
        },
        "admission decision",
      );
      deps.recordEvent({
        namespace,
        name: pod.metadata?.name,
        admissionId: decision.admissionId!,
        shortHash: decision.hash && shortHash(decision.hash),
        type: "Normal",
        reason: `Warmstart${decision.role[0]!.toUpperCase()}${decision.role.slice(1)}`,
        message: `${decision.role}: ${decision.reason} (cache ${decision.hash ? shortHash(decision.hash) : "-"})`,
      });
      observe(decision.role);
      return patch.length
        ? {
            uid,
            allowed: true,
            patchType: "JSONPatch",
            patch: Buffer.from(JSON.stringify(patch)).toString("base64"),
          }
        : { uid, allowed: true };
    } catch (err) {
      observe("fail-open");
      return failOpen(deps, err, review);
    } finally {
      clearTimeout(timer);
    }
  };
}

/** Admit unchanged, and say why in the log, the metrics and (for named pods) an Event. */
export function failOpen(deps: AdmissionDeps, err: unknown, review: AdmissionReview): AdmissionResponse {
  const message = err instanceof Error ? err.message : String(err);
  const pod = review.request.object as V1Pod | undefined;
  const namespace = review.request.namespace ?? "default";
  deps.metrics.failOpen.inc({ cause: /within \d+ ms/.test(message) ? "timeout" : "error" });
  deps.log.warn({ namespace, pod: pod?.metadata?.name, err: message }, "admitted unchanged (fail open)");
  return {
    uid: review.request.uid,
    allowed: true,
    warnings: [`warmstart: admitted unchanged: ${message}`.slice(0, 250)],
  };
}
