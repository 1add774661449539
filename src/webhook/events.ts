import * as k8s from "@kubernetes/client-node";
import { setTimeout as sleep } from "node:timers/promises";
import type { Logger } from "../common/log.js";
import { LABEL_HASH } from "../core/contract.js";

export const ANN_ADMISSION_ID = "warmstart.dev/admission-id";

export interface PendingEvent {
  namespace: string;
  /** Known for named pods; generateName pods get their name only after admission. */
  name?: string;
  admissionId: string;
  shortHash?: string;
  type: "Normal" | "Warning";
  reason: string;
  message: string;
}

/**
 * Posts an Event on each pod the webhook decided about. At admission the pod does not exist yet
 * (and a generateName pod has no name), so events wait in a bounded queue and are posted once the
 * pod can be found by its admission id. Never on the admission path.
 */
export class PodEventRecorder {
  private queue: PendingEvent[] = [];
  private running = false;
  private stopped = false;

  constructor(
    private readonly core: k8s.CoreV1Api,
    private readonly log: Logger,
    private readonly maxPending: number,
    private readonly onResult: (result: "posted" | "pod-not-found" | "dropped" | "error") => void = () => {},
    private readonly component = "warmstart-webhook",
  ) {}

  record(ev: PendingEvent): void {
    if (this.stopped) return;
    if (this.queue.length >= this.maxPending) {
      this.onResult("dropped");
      return;
    }
    this.queue.push(ev);
    if (!this.running) void this.drain();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    while (this.running) await sleep(10);
  }

  private async drain(): Promise<void> {
    this.running = true;
    try {
      // A short delay lets the API server persist the pods admitted in this burst.
      await sleep(200);
      while (this.queue.length && !this.stopped) {
        const batch = this.queue.splice(0, 50);
        await Promise.all(batch.map((ev) => this.post(ev)));
      }
    } finally {
      this.running = false;
    }
  }

  private async post(ev: PendingEvent): Promise<void> {
    try {
      const pod = await this.findPod(ev);
      if (!pod) {
        this.onResult("pod-not-found");
        return;
      }
      const now = new Date();
      await this.core.createNamespacedEvent({
        namespace: ev.namespace,
        body: {
          metadata: { generateName: `${pod.metadata!.name!}.`, namespace: ev.namespace },
          involvedObject: {
            kind: "Pod",
            apiVersion: "v1",
            namespace: ev.namespace,
            name: pod.metadata!.name!,
            uid: pod.metadata!.uid!,
          },
          type: ev.type,
          reason: ev.reason,
          message: ev.message,
          source: { component: this.component },
          reportingComponent: this.component,
          reportingInstance: process.env.HOSTNAME ?? "local",
          firstTimestamp: now,
          lastTimestamp: now,
          count: 1,
        },
      });
      this.onResult("posted");
    } catch (err) {
      this.onResult("error");
      this.log.warn({ err, namespace: ev.namespace, admissionId: ev.admissionId }, "could not post pod event");
    }
  }

  private async findPod(ev: PendingEvent): Promise<k8s.V1Pod | undefined> {
    for (let attempt = 0; attempt < 6; attempt++) {
      if (ev.name) {
        try {
          const pod = await this.core.readNamespacedPod({ name: ev.name, namespace: ev.namespace });
          if (pod.metadata?.annotations?.[ANN_ADMISSION_ID] === ev.admissionId) return pod;
        } catch {
          /* not created yet, or refused by a later admission step */
        }
      } else {
        const list = await this.core.listNamespacedPod({
          namespace: ev.namespace,
          labelSelector: ev.shortHash ? `${LABEL_HASH}=${ev.shortHash}` : undefined,
        });
        const pod = list.items.find((p) => p.metadata?.annotations?.[ANN_ADMISSION_ID] === ev.admissionId);
        if (pod) return pod;
      }
      await sleep(250 * 2 ** attempt);
    }
    return undefined;
  }
}
