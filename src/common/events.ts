import type * as k8s from "@kubernetes/client-node";

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
