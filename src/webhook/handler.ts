/**
 * The AdmissionReview handler around `decide`: the admission deadline, the patch, the decision's
 * log line, metric and Event, and the fail-open answer on any error.
 */
import type { V1Pod } from "@kubernetes/client-node";
import { shortHash } from "../core/contract.js";
import { jsonPatch } from "../core/decorate.js";
import { redactUrlCredentials } from "../core/env.js";
import { isRecord } from "../core/guards.js";
import { stripStamps } from "../core/stamps.js";
import { decide, mintId, podName, withAdmissionId, type AdmissionDeps, isPodCreate } from "./admission.js";
import type { AdmissionResponse, AdmissionReview } from "./server.js";
import type { PendingEvent } from "./events.js";

const toPatch = (original: V1Pod, admitted: V1Pod): Pick<AdmissionResponse, "patch" | "patchType"> => {
  const patch = jsonPatch(original, admitted);
  return patch.length
    ? { patchType: "JSONPatch", patch: Buffer.from(JSON.stringify(patch)).toString("base64") }
    : {};
};

/** The AdmissionReview handler: decide within the deadline, or admit with the stamps removed and say why. */
export function admissionHandler(
  deps: AdmissionDeps,
): (review: AdmissionReview) => Promise<AdmissionResponse> {
  // Stay inside the API server's timeout so our fail-open answer is the one that counts.
  const budgetMs = Math.max(200, deps.cfg.timeoutSeconds * 1000 - 750);
  return async (review) => {
    const started = process.hrtime.bigint();
    const uid = review.request.uid;
    const original = review.request.object as V1Pod | undefined;
    const namespace = review.request.namespace ?? "default";
    const name = podName(original);
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
      deps.metrics.decisions.inc({
        role: decision.role,
        reason: decision.role === "pass" ? decision.reason : decision.role,
      });
      const patch = decision.pod && original ? toPatch(original, decision.pod) : {};
      const event = (ev: Omit<PendingEvent, "namespace" | "name" | "admissionId">): void => {
        if (decision.admissionId && !review.request.dryRun)
          deps.recordEvent({
            namespace,
            name: original?.metadata?.name,
            admissionId: decision.admissionId,
            ...ev,
          });
      };
      if (decision.role === "pass") {
        // Left alone: said in the log (at info for GPU pods, which get an Event too).
        deps.log[decision.admissionId ? "info" : "debug"](
          { namespace, pod: name, reason: decision.reason },
          "left alone",
        );
        event({ type: "Normal", reason: "WarmstartLeftAlone", message: `left alone: ${decision.reason}` });
        observe("pass");
        return { uid, allowed: true, ...patch };
      }
      const short = decision.hash ? shortHash(decision.hash) : "-";
      deps.log.info(
        { namespace, pod: name, role: decision.role, reason: decision.reason, hash: short },
        "admission decision",
      );
      event({
        shortHash: decision.hash && short,
        type: "Normal",
        reason: `Warmstart${decision.role[0]!.toUpperCase()}${decision.role.slice(1)}`,
        message: `${decision.role}: ${decision.reason} (cache ${short})`,
      });
      observe(decision.role);
      return { uid, allowed: true, ...patch };
    } catch (err) {
      observe("fail-open");
      return failOpen(deps, err, review);
    } finally {
      clearTimeout(timer);
    }
  };
}

/**
 * Admit without a decision, and say why in the log, the metrics and an Event. The author's stamps
 * are removed all the same: that needs no API call, so no error can stop it short of a request
 * that holds no pod at all.
 */
export function failOpen(deps: AdmissionDeps, err: unknown, review: AdmissionReview): AdmissionResponse {
  const message = redactUrlCredentials(err instanceof Error ? err.message : String(err));
  const req = review.request;
  const namespace = req.namespace ?? "default";
  const original = req.object as V1Pod | undefined;
  deps.metrics.failOpen.inc({ cause: /within \d+ ms/.test(message) ? "timeout" : "error" });
  deps.log.warn(
    { namespace, pod: podName(original), err: message },
    "admitted without a decision (fail open)",
  );
  let patch: Pick<AdmissionResponse, "patch" | "patchType"> = {};
  try {
    if (isPodCreate(req) && isRecord(original)) {
      const { pod } = stripStamps(original);
      const admissionId = mintId();
      const admitted = withAdmissionId(pod, admissionId);
      patch = toPatch(original, admitted);
      if (admitted !== pod && !req.dryRun)
        deps.recordEvent({
          namespace,
          name: isRecord(original.metadata) ? (original.metadata.name as string | undefined) : undefined,
          admissionId,
          type: "Warning",
          reason: "WarmstartFailOpen",
          message: `admitted without a cache decision: ${message}`,
        });
    }
  } catch (stripErr) {
    deps.log.error({ err: stripErr, namespace }, "could not even remove the stamps; admitted as written");
  }
  return {
    uid: req.uid,
    allowed: true,
    ...patch,
    warnings: [`warmstart: admitted without a cache decision: ${message}`.slice(0, 250)],
  };
}
