/**
 * The per-cluster queues: messages are rows whose visibility is a point in time, so an
 * unacknowledged delivery simply becomes visible again when its visibility timeout runs out,
 * restart or not. Receiving hands out a fresh receipt each time; only the latest one acknowledges.
 */
import { randomBytes, randomUUID } from "node:crypto";
import type { AckResponse, MessageBody, QueueMessage, QueueName } from "./api.js";
import type { StoreDatabase } from "./store-database.js";
import type { MessageRow } from "./store-schema.js";

export interface QueueDepth {
  clusterId: string;
  queue: QueueName;
  visible: number;
  inflight: number;
}

export interface Received {
  messages: QueueMessage[];
  /** When the earliest message of the queue still invisible becomes visible, if any. */
  nextVisibleAt: number | undefined;
}

export class MessageQueues {
  constructor(private readonly db: StoreDatabase) {}

  enqueue(
    clusterId: string,
    queue: QueueName,
    gpuType: string | null,
    requestId: string,
    body: MessageBody,
  ): void {
    const now = this.db.now();
    this.db
      .prepare(
        "INSERT INTO messages (id, cluster_id, queue, gpu_type, request_id, body, visible_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
      )
      .run(randomUUID(), clusterId, queue, gpuType, requestId, JSON.stringify(body), now, now);
    this.db.notifyQueue(clusterId, queue);
  }

  /**
   * Deploy messages the cluster has not taken (never delivered, or released by its agent) are
   * taken back and their requests made Pending again. A delivery that merely timed out is left:
   * the agent may have acted on it before it failed to acknowledge.
   */
  unqueueUndelivered(clusterId: string, pick: (m: MessageRow) => boolean, why: string): void {
    const rows = this.db
      .prepare(
        "SELECT * FROM messages WHERE cluster_id = ? AND queue = 'deploy' AND (receive_count = 0 OR receipt IS NULL)",
      )
      .all(clusterId) as MessageRow[];
    for (const m of rows.filter(pick)) {
      this.db.prepare("DELETE FROM messages WHERE id = ?").run(m.id);
      this.db
        .prepare(
          "UPDATE requests SET status = 'Pending', cluster_id = NULL, assigned_gpu_type = NULL, message = ?, updated_at = ? WHERE id = ? AND status = 'Queued'",
        )
        .run(why, this.db.now(), m.request_id);
    }
  }

  /**
   * Up to `maxMessages` visible messages, each given a fresh receipt, and when the next one now
   * invisible becomes visible (for long polls). Both are read at one instant: looked up apart, a
   * message due between the two readings was neither received nor waited for.
   */
  receive(
    clusterId: string,
    queue: QueueName,
    opts: { gpuTypes?: string[] | undefined; maxMessages: number; visibilityTimeoutSeconds: number },
  ): Received {
    return this.db.tx(() => {
      const now = this.db.now();
      const filter = queue === "deploy" && opts.gpuTypes !== undefined;
      const rows = this.db
        .prepare(
          `SELECT * FROM messages WHERE cluster_id = ? AND queue = ? AND visible_at <= ?
           ${filter ? "AND gpu_type IN (SELECT value FROM json_each(?))" : ""} ORDER BY seq LIMIT ?`,
        )
        .all(
          clusterId,
          queue,
          now,
          ...(filter ? [JSON.stringify(opts.gpuTypes)] : []),
          opts.maxMessages,
        ) as MessageRow[];
      const update = this.db.prepare(
        "UPDATE messages SET receipt = ?, receive_count = receive_count + 1, visible_at = ? WHERE id = ?",
      );
      const messages = rows.map((m) => {
        const receipt = randomBytes(24).toString("base64url");
        update.run(receipt, now + opts.visibilityTimeoutSeconds * 1000, m.id);
        return {
          messageId: m.id,
          receiptHandle: receipt,
          receiveCount: m.receive_count + 1,
          body: JSON.parse(m.body) as MessageBody,
        };
      });
      const next = this.db
        .prepare(
          "SELECT MIN(visible_at) AS t FROM messages WHERE cluster_id = ? AND queue = ? AND visible_at > ?",
        )
        .get(clusterId, queue, now) as { t: number | null };
      return { messages, nextVisibleAt: next.t ?? undefined };
    });
  }

  ack(clusterId: string, receiptHandles: string[]): AckResponse {
    return this.db.tx(() => {
      const out: AckResponse = { acknowledged: [], failed: [] };
      for (const handle of receiptHandles) {
        const m = this.db
          .prepare("SELECT * FROM messages WHERE receipt = ? AND cluster_id = ?")
          .get(handle, clusterId) as MessageRow | undefined;
        if (!m) {
          out.failed.push({
            receiptHandle: handle,
            reason: "stale or unknown receipt handle (already acknowledged, redelivered or released)",
          });
          continue;
        }
        this.db.prepare("DELETE FROM messages WHERE id = ?").run(m.id);
        if (m.queue === "deploy") {
          this.db
            .prepare(
              "UPDATE requests SET status = 'Accepted', updated_at = ? WHERE id = ? AND status = 'Queued'",
            )
            .run(this.db.now(), m.request_id);
        }
        out.acknowledged.push(handle);
      }
      return out;
    });
  }

  release(clusterId: string, receiptHandle: string, delaySeconds: number): boolean {
    return this.db.tx(() => {
      const m = this.db
        .prepare("SELECT * FROM messages WHERE receipt = ? AND cluster_id = ?")
        .get(receiptHandle, clusterId) as MessageRow | undefined;
      if (!m) return false;
      this.db
        .prepare("UPDATE messages SET receipt = NULL, visible_at = ? WHERE id = ?")
        .run(this.db.now() + delaySeconds * 1000, m.id);
      if (delaySeconds === 0) this.db.notifyQueue(clusterId, m.queue as QueueName);
      return true;
    });
  }

  queueDepths(): QueueDepth[] {
    const rows = this.db
      .prepare(
        `SELECT cluster_id, queue, SUM(visible_at <= ?) AS visible, SUM(visible_at > ?) AS inflight
         FROM messages GROUP BY cluster_id, queue`,
      )
      .all(this.db.now(), this.db.now()) as {
      cluster_id: string;
      queue: QueueName;
      visible: number;
      inflight: number;
    }[];
    return rows.map((r) => ({
      clusterId: r.cluster_id,
      queue: r.queue,
      visible: r.visible,
      inflight: r.inflight,
    }));
  }
}
