/**
 * What becomes of the pods that restore (ADR 0005): each restore that turned Ready is counted on
 * its cache's record once, and a waiting follower whose wait ended cold has its decision say so.
 */
import { PHASE } from "../../api/index.js";
import * as k8s from "@kubernetes/client-node";
import type { Logger } from "../../common/log.js";
import { apiError, apiErrorInfo, isNotFound } from "../../common/kube.js";
import { postPodEvent } from "../../common/events.js";
import { ANN_REASON, ANN_RESTORE_RECORDED, ANN_ROLE } from "../../core/contract.js";
import { restoredFrom } from "../../core/refs.js";
import { isWaitingFollower, seedOutcome } from "../../core/waiting.js";
import type { RestoreRecord } from "../../common/modelcache.js";
import { CacheRecords } from "../../common/cache-record.js";
import { readySeconds } from "../dashboard/views.js";
import { COMPONENT, isGated, isTerminated, toMs, type ReleaseDeps } from "./release.js";

const jsonPatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch);
const mergePatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);

const RECENT_RESTORES = 20;

/**
 * Counts the benefit of each restore that turned Ready on its cache's record, so the numbers
 * outlive the pods: bytes it did not download, its time to Ready, the seconds it saved
 * against the leader's. A pod is counted once: the record keeps the last few UIDs and the pod
 * gets an annotation once counted.
 */
export async function recordRestores(
  d: ReleaseDeps,
  short: string,
  pods: k8s.V1Pod[],
  log: Logger,
): Promise<void> {
  const bySource = new Map<string, k8s.V1Pod[]>();
  for (const p of pods) {
    const role = p.metadata?.annotations?.[ANN_ROLE];
    if (role !== "restore" && role !== "follower") continue;
    if (p.metadata?.annotations?.[ANN_RESTORE_RECORDED] || isGated(p) || isTerminated(p)) continue;
    if (readySeconds(p) === undefined) continue;
    // The cache it restored from: the claim admission mounted (an annotation can change later).
    const source = restoredFrom(p);
    if (!source) continue;
    bySource.set(source, [...(bySource.get(source) ?? []), p]);
  }
  const records = new CacheRecords(d.custom);
  for (const [source, restored] of bySource) {
    const counted: RestoreRecord[] = [];
    const r = await records.transition(source, (c) => {
      counted.length = 0;
      const s = c.status ?? {};
      if (s.phase !== PHASE.Ready || c.metadata.deletionTimestamp) return undefined;
      const recent = s.recentRestores ?? [];
      const known = new Set(recent.map((x) => x.uid));
      for (const p of restored) {
        if (known.has(p.metadata!.uid!)) continue;
        counted.push({
          namespace: p.metadata!.namespace!,
          name: p.metadata!.name!,
          uid: p.metadata!.uid!,
          role: p.metadata!.annotations![ANN_ROLE]!,
          readySeconds: readySeconds(p)!,
          at: new Date(
            toMs(p.status?.conditions?.find((x) => x.type === "Ready")?.lastTransitionTime) ?? d.now(),
          ).toISOString(),
        });
      }
      if (!counted.length) return undefined;
      const leader = typeof s.leaderReadySeconds === "number" ? s.leaderReadySeconds : undefined;
      const bytes = Number(s.modelBytes ?? s.sizeBytes ?? 0);
      const round = (x: number): number => Math.round(x * 10) / 10;
      return {
        restores: (s.restores ?? 0) + counted.length,
        savedBytes: (s.savedBytes ?? 0) + bytes * counted.length,
        savedSeconds: round(
          (s.savedSeconds ?? 0) +
            (leader === undefined
              ? 0
              : counted.reduce((n, x) => n + Math.max(0, leader - x.readySeconds), 0)),
        ),
        restoredReadySecondsTotal: round(
          (s.restoredReadySecondsTotal ?? 0) + counted.reduce((n, x) => n + x.readySeconds, 0),
        ),
        lastRestoredAt: counted
          .map((x) => x.at)
          .sort()
          .at(-1)!,
        recentRestores: [...recent, ...counted].slice(-RECENT_RESTORES),
      };
    });
    if (r?.written && counted.length) {
      log.info(
        { cache: source, restores: counted.map((x) => `${x.namespace}/${x.name} ${x.readySeconds}s`) },
        "restores counted",
      );
      d.onRestore?.(source, counted);
    }
    // Counted now or before (a pass that died after the record was written): never again.
    const onRecord = new Set([
      ...(r?.cache.status?.recentRestores ?? []).map((x) => x.uid),
      ...counted.map((x) => x.uid),
    ]);
    for (const p of restored) {
      if (!onRecord.has(p.metadata!.uid!)) continue;
      await d.core
        .patchNamespacedPod(
          {
            name: p.metadata!.name!,
            namespace: p.metadata!.namespace!,
            body: { metadata: { annotations: { [ANN_RESTORE_RECORDED]: "true" } } },
          },
          mergePatch,
        )
        .catch((err: unknown) => {
          if (!isNotFound(err)) log.warn({ err }, "could not mark a restore as counted");
        });
    }
  }
}

/**
 * Waiting followers never gated and never evicted: once one's seed has ended cold (its agent's
 * marker, or its own wait deadline), its decision says so, as a gated follower's would have been
 * re-decided: role `cold` and the reason, with an Event. One that restored stays a follower and
 * is counted like a restore.
 */
export async function settleWaiting(
  d: ReleaseDeps,
  short: string,
  pods: k8s.V1Pod[],
  log: Logger,
): Promise<void> {
  for (const pod of pods) {
    if (!isWaitingFollower(pod) || isTerminated(pod)) continue;
    const outcome = seedOutcome(pod);
    if (outcome?.outcome !== "cold") continue;
    const reason = `waited ${Math.round(outcome.waitedMs / 1000)}s, then started cold: ${outcome.reason ?? "no cache"}`;
    const esc = (k: string): string => k.replace("/", "~1");
    try {
      await d.core.patchNamespacedPod(
        {
          name: pod.metadata!.name!,
          namespace: pod.metadata!.namespace!,
          body: [
            // Only over what this pass read: a pod settled meanwhile is left as it is.
            { op: "test", path: `/metadata/annotations/${esc(ANN_ROLE)}`, value: "follower" },
            { op: "replace", path: `/metadata/annotations/${esc(ANN_ROLE)}`, value: "cold" },
            { op: "add", path: `/metadata/annotations/${esc(ANN_REASON)}`, value: reason },
          ],
        },
        jsonPatch,
      );
    } catch (err) {
      if (isNotFound(err) || /test operation failed|testing value/i.test(apiErrorInfo(err).message)) continue;
      throw apiError(`settling waiting follower ${pod.metadata?.namespace}/${pod.metadata?.name}`, err);
    }
    log.info(
      { pod: `${pod.metadata?.namespace}/${pod.metadata?.name}`, reason },
      "waiting follower started cold",
    );
    d.onWaitingCold?.(short);
    await postPodEvent(d.core, pod, {
      type: "Warning",
      reason: "WarmstartCold",
      message: `cache ${short}: ${reason}`,
      component: COMPONENT,
    }).catch((err: unknown) => d.log.warn({ err }, "could not post event"));
  }
}
