import type * as k8s from "@kubernetes/client-node";
import { MODELCACHE } from "../core/contract.js";

/** Post a core/v1 Event about a pod that exists (it has a name and a UID). */
export async function postPodEvent(
  core: k8s.CoreV1Api,
  pod: k8s.V1Pod,
  ev: { type: "Normal" | "Warning"; reason: string; message: string; component: string },
): Promise<void> {
  const now = new Date();
  const namespace = pod.metadata!.namespace!;
  await core.createNamespacedEvent({
    namespace,
    body: {
      metadata: { generateName: `${pod.metadata!.name!}.`, namespace },
      involvedObject: {
        kind: "Pod",
        apiVersion: "v1",
        namespace,
        name: pod.metadata!.name!,
        uid: pod.metadata!.uid!,
      },
      type: ev.type,
      reason: ev.reason,
      message: ev.message.slice(0, 1024),
      source: { component: ev.component },
      reportingComponent: ev.component,
      reportingInstance: process.env.HOSTNAME ?? "local",
      firstTimestamp: now,
      lastTimestamp: now,
      count: 1,
    },
  });
}

/**
 * Post a core/v1 Event about a ModelCache. The record is cluster-scoped, so its Events live in
 * `default`, where `kubectl describe modelcache` looks for them.
 */
export async function postCacheEvent(
  core: k8s.CoreV1Api,
  cache: { metadata: { name?: string; uid?: string } },
  ev: { type: "Normal" | "Warning"; reason: string; message: string; component: string },
): Promise<void> {
  const now = new Date();
  const name = cache.metadata.name!;
  await core.createNamespacedEvent({
    namespace: "default",
    body: {
      metadata: { generateName: `${name}.`, namespace: "default" },
      involvedObject: {
        kind: MODELCACHE.kind,
        apiVersion: `${MODELCACHE.group}/${MODELCACHE.version}`,
        name,
        ...(cache.metadata.uid ? { uid: cache.metadata.uid } : {}),
      },
      type: ev.type,
      reason: ev.reason,
      message: ev.message.slice(0, 1024),
      source: { component: ev.component },
      reportingComponent: ev.component,
      reportingInstance: process.env.HOSTNAME ?? "local",
      firstTimestamp: now,
      lastTimestamp: now,
      count: 1,
    },
  });
}
