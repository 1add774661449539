import type * as k8s from "@kubernetes/client-node";
import { MODELCACHE } from "../core/contract.js";

export interface EventText {
  type: "Normal" | "Warning";
  reason: string;
  message: string;
  component: string;
}

/** Post a core/v1 Event about a pod that exists (it has a name and a UID). */
export function postPodEvent(core: k8s.CoreV1Api, pod: k8s.V1Pod, ev: EventText): Promise<void> {
  const namespace = pod.metadata!.namespace!;
  return postEvent(
    core,
    namespace,
    { kind: "Pod", apiVersion: "v1", namespace, name: pod.metadata!.name!, uid: pod.metadata!.uid! },
    ev,
  );
}

/**
 * Post a core/v1 Event about a ModelCache. The record is cluster-scoped, so its Events live in
 * `default`, where `kubectl describe modelcache` looks for them.
 */
export function postCacheEvent(
  core: k8s.CoreV1Api,
  cache: { metadata: { name?: string; uid?: string } },
  ev: EventText,
): Promise<void> {
  const { name, uid } = cache.metadata;
  return postEvent(
    core,
    "default",
    {
      kind: MODELCACHE.kind,
      apiVersion: `${MODELCACHE.group}/${MODELCACHE.version}`,
      name: name!,
      ...(uid ? { uid } : {}),
    },
    ev,
  );
}

async function postEvent(
  core: k8s.CoreV1Api,
  namespace: string,
  involvedObject: k8s.V1ObjectReference,
  ev: EventText,
): Promise<void> {
  const now = new Date();
  await core.createNamespacedEvent({
    namespace,
    body: {
      metadata: { generateName: `${involvedObject.name}.`, namespace },
      involvedObject,
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
