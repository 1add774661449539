/**
 * A cluster's consumer for the fault tests, playing its agent against the real control plane:
 * long polls on both queues, acknowledges in batches, reports, and keeps going through the control
 * plane's death and restart. It records what the control plane answered, never its database.
 */
import { setTimeout as sleep } from "node:timers/promises";
import { ControlPlaneClient } from "../src/control-plane/client.js";
import type { QueueMessage } from "../src/control-plane/api.js";

/** What the clients saw: the control plane's answers, never its database. */
export class Seen {
  /** Submit name → id, for the submits answered 201. */
  readonly accepted = new Map<string, string>();
  /** Names whose submit got no answer (or an error). */
  readonly unanswered = new Set<string>();
  /** Request ids whose deploy message an acknowledgement answered as acknowledged. */
  readonly acked = new Set<string>();
  /** Request id → clusters it was delivered to. */
  readonly deliveredTo = new Map<string, Set<string>>();
  /** Deliveries of a request whose acknowledgement had already been answered. */
  readonly afterAck: string[] = [];
  /** Deliveries, in order, with the time they were seen. */
  readonly deliveries: { requestId: string; at: number }[] = [];

  delivered(clusterId: string, m: QueueMessage): void {
    if (m.body.kind !== "deploy") return;
    const id = m.body.requestId;
    if (this.acked.has(id)) this.afterAck.push(`${id} (receive ${m.receiveCount})`);
    this.deliveries.push({ requestId: id, at: Date.now() });
    const to = this.deliveredTo.get(id) ?? new Set<string>();
    to.add(clusterId);
    this.deliveredTo.set(id, to);
  }
}

export interface Consumer {
  clusterId: string;
  stop(): Promise<void>;
}

/**
 * A cluster's consumer, playing its agent: long polls on both queues (several deploy polls at
 * once), acknowledges each batch in one call, reports Running, and carries out terminations.
 * It keeps going through the control plane's death and restart, like an agent would.
 */
export function consume(
  url: string,
  clusterId: string,
  token: string,
  gpuType: string,
  seen: Seen,
  visibilityTimeoutSeconds = 2,
): Consumer {
  const c = new ControlPlaneClient({ baseUrl: url, token, timeoutMs: 10_000 });
  const stop = new AbortController();
  const pause = (): Promise<void> => sleep(100, undefined, { signal: stop.signal }).catch(() => undefined);
  const deploy = async (): Promise<void> => {
    while (!stop.signal.aborted) {
      let messages: QueueMessage[];
      try {
        messages = (
          await c.receive(
            clusterId,
            {
              queue: "deploy",
              gpuTypes: [gpuType],
              maxMessages: 4,
              waitSeconds: 1,
              visibilityTimeoutSeconds,
            },
            { signal: stop.signal },
          )
        ).messages;
      } catch {
        await pause();
        continue;
      }
      if (messages.length === 0) continue;
      for (const m of messages) seen.delivered(clusterId, m);
      const byHandle = new Map(messages.map((m) => [m.receiptHandle, m.body.requestId]));
      let acknowledged: string[] = [];
      try {
        acknowledged = (await c.ack(clusterId, [...byHandle.keys()])).acknowledged;
      } catch {
        continue; // unknown outcome: the message comes back if the acknowledgement did not commit
      }
      for (const h of acknowledged) seen.acked.add(byHandle.get(h)!);
      // An agent reports until it gets through: the crash may have cut a report short.
      for (const h of acknowledged) {
        while (!stop.signal.aborted) {
          try {
            await c.reportStatus(byHandle.get(h)!, { phase: "Running", instances: [] });
            break;
          } catch {
            await pause();
          }
        }
      }
    }
  };
  const terminate = async (): Promise<void> => {
    while (!stop.signal.aborted) {
      try {
        const { messages } = await c.receive(
          clusterId,
          { queue: "termination", maxMessages: 4, waitSeconds: 1, visibilityTimeoutSeconds },
          { signal: stop.signal },
        );
        for (const m of messages) {
          await c.reportStatus(m.body.requestId, { phase: "Terminated", message: "removed", instances: [] });
          await c.ack(clusterId, [m.receiptHandle]);
        }
      } catch {
        await pause();
      }
    }
  };
  const loops = [deploy(), deploy(), deploy(), terminate()];
  return {
    clusterId,
    stop: async () => {
      stop.abort();
      await Promise.allSettled(loops);
    },
  };
}
