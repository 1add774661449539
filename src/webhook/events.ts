import * as k8s from "@kubernetes/client-node";
import type { Logger } from "../common/log.js";
import { LABEL_ADMISSION_ID } from "../core/contract.js";
import { redactUrlCredentials } from "../core/env.js";
import { postPodEvent } from "../common/events.js";

// Admission ids per list call: a set-based selector stays well inside URL limits.
const IDS_PER_LIST = 50;

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
 * Posts an Event on each pod the webhook decided about, left alone (a GPU pod) or admitted on
 * fail-open. At admission the pod does not exist yet (and a generateName pod has no name), so
 * events wait in a bounded queue; every tick, one list per namespace selects exactly the pods
 * waited for by their admission-id label, and each found pod gets its Event. Events whose pod
 * never appears (pods refused later in the chain) are dropped after a few ticks. Never on the
 * admission path, and O(namespaces) API calls per tick, not O(pods).
 */
export class PodEventRecorder {
  private pending: (PendingEvent & { ticks: number })[] = [];
  private timer: NodeJS.Timeout | undefined;
  private ticking: Promise<void> | undefined;
  private stopped = false;

  constructor(
    private readonly core: k8s.CoreV1Api,
    private readonly log: Logger,
    private readonly maxPending: number,
    private readonly onResult: (result: "posted" | "pod-not-found" | "dropped" | "error") => void = () => {},
    private readonly tickMs = 500,
    private readonly maxTicks = 10,
    private readonly component = "warmstart-webhook",
  ) {}

  record(ev: PendingEvent): void {
    if (this.stopped) return;
    ev = { ...ev, message: redactUrlCredentials(ev.message) };
    if (this.pending.length >= this.maxPending) {
      this.onResult("dropped");
      return;
    }
    this.pending.push({ ...ev, ticks: 0 });
    this.schedule();
  }

  private schedule(): void {
    if (this.timer || this.stopped) return;
    this.timer = setTimeout(() => {
      this.ticking = this.tick().finally(() => {
        this.timer = undefined;
        this.ticking = undefined;
        if (this.pending.length) this.schedule();
      });
    }, this.tickMs);
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.ticking;
  }

  private async tick(): Promise<void> {
    const batch = this.pending;
    this.pending = [];
    const byNamespace = new Map<string, typeof batch>();
    for (const ev of batch) byNamespace.set(ev.namespace, [...(byNamespace.get(ev.namespace) ?? []), ev]);
    await Promise.all(
      [...byNamespace].map(async ([namespace, events]) => {
        const pods = new Map<string, k8s.V1Pod>();
        const ids = [...new Set(events.map((e) => e.admissionId))];
        for (let i = 0; i < ids.length; i += IDS_PER_LIST) {
          try {
            const list = await this.core.listNamespacedPod({
              namespace,
              labelSelector: `${LABEL_ADMISSION_ID} in (${ids.slice(i, i + IDS_PER_LIST).join(",")})`,
            });
            for (const p of list.items) {
              const id = p.metadata?.labels?.[LABEL_ADMISSION_ID];
              if (id) pods.set(id, p);
            }
          } catch (err) {
            this.log.warn({ err, namespace }, "could not list pods to post events; will retry");
          }
        }
        for (const ev of events) {
          const pod = pods.get(ev.admissionId);
          if (pod) await this.post(ev, pod);
          else if (++ev.ticks < this.maxTicks) this.pending.push(ev);
          else this.onResult("pod-not-found");
        }
      }),
    );
  }

  private async post(ev: PendingEvent, pod: k8s.V1Pod): Promise<void> {
    try {
      await postPodEvent(
        this.core,
        { ...pod, metadata: { ...pod.metadata, namespace: ev.namespace } },
        {
          type: ev.type,
          reason: ev.reason,
          message: ev.message,
          component: this.component,
        },
      );
      this.onResult("posted");
    } catch (err) {
      this.onResult("error");
      this.log.warn({ err, namespace: ev.namespace, pod: pod.metadata?.name }, "could not post pod event");
    }
  }
}
