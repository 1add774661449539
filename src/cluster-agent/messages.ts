/**
 * What the agent does with each queue message. A deployment request is released while this
 * cluster cannot take it (not ready, cordoned, no room), refused outside the namespaces it deploys
 * into, and otherwise recorded, applied and acknowledged; the durable record (and, within a run,
 * the ids handled) keeps a redelivery from deploying twice. A termination removes the workload and
 * leaves a tombstone. Deploy and terminate of one request never interleave.
 */
import type { Logger } from "../common/log.js";
import type {
  AckResponse,
  DeploymentRequest,
  QueueMessage,
  QueueName,
  TerminationRequest,
} from "../control-plane/api.js";
import { describe, fits, type GpuInventory } from "./inventory.js";
import type { AgentMetrics } from "./metrics.js";
import type { RequestLock } from "./request-lock.js";
import type { StatusReporter } from "./status.js";
import {
  isTerminalApiError,
  NamespaceNotAllowedError,
  OwnershipError,
  type RequestRecord,
  type Workloads,
} from "./workloads.js";

/** How long a request this cluster cannot hold stays invisible before it is offered again. */
const NO_CAPACITY_RELEASE_S = 10;
/** How soon a request that failed for a passing reason is offered again. */
const RETRY_RELEASE_S = 5;
/** Message ids remembered in memory; older ones fall back on the durable record. */
const HANDLED_MEMORY = 10_000;

export interface MessageHooks {
  /** A deployment has recorded its request and is about to create the workload. */
  beforeApply?(requestId: string): Promise<void>;
  /** A message was handled to the end (acknowledged, released or failed). */
  handled?(queue: QueueName, msg: QueueMessage, outcome: string): void;
}

export interface MessageHandlerOptions {
  log: Logger;
  workloads: Pick<
    Workloads,
    "targetNamespace" | "refusal" | "allows" | "readRecord" | "writeRecord" | "apply" | "remove"
  >;
  status: Pick<StatusReporter, "reportNow" | "enqueue" | "forget">;
  /** Deploy and terminate of one request never interleave. */
  requestLock: RequestLock;
  metrics: Pick<AgentMetrics, "messages">;
  /** Whether deployment requests are taken now (ready, resumed, not cordoned). */
  takingDeployments: () => boolean;
  /** The accepted GPU inventory (undefined until known). */
  inventory: () => GpuInventory | undefined;
  /** Acknowledge and release, with the queue credentials. */
  controlPlane: {
    ack(receiptHandle: string): Promise<AckResponse>;
    release(receiptHandle: string, delaySeconds: number): Promise<unknown>;
  };
  hooks?: MessageHooks | undefined;
}

export class MessageHandler {
  /** Message ids handled to the end in this run; the durable record covers restarts. */
  private readonly handled = new Set<string>();

  constructor(private readonly o: MessageHandlerOptions) {}

  async handle(queue: QueueName, msg: QueueMessage): Promise<void> {
    const body = msg.body;
    const log = this.o.log.child({
      queue,
      messageId: msg.messageId,
      requestId: body.requestId,
      name: body.name,
      namespace: body.namespace,
      receiveCount: msg.receiveCount,
    });
    const outcome = await this.o.requestLock.run(body.requestId, async () => {
      try {
        return body.kind === "deploy"
          ? await this.deploy(msg, body, log)
          : await this.terminate(msg, body, log);
      } catch (err) {
        // A passing failure (API server or control plane unreachable): offer it again soon.
        log.warn({ err }, "could not handle the message; it will be retried");
        await this.release(msg, RETRY_RELEASE_S, log);
        return "retry";
      }
    });
    this.o.metrics.messages.inc({ queue, outcome });
    this.o.hooks?.handled?.(queue, msg, outcome);
  }

  private async deploy(msg: QueueMessage, req: DeploymentRequest, log: Logger): Promise<string> {
    if (this.handled.has(msg.messageId)) {
      log.info("redelivered message already handled; acknowledging it again");
      await this.ackTaken(msg, log);
      return "duplicate";
    }
    if (!this.o.takingDeployments()) {
      await this.release(msg, 0, log);
      return "released";
    }
    const inv = this.o.inventory();
    if (!inv || !fits(inv, req.gpuType, req.gpus, req.replicas)) {
      log.info(
        {
          gpuType: req.gpuType,
          gpus: req.gpus,
          replicas: req.replicas,
          have: inv ? describe(inv) : "unknown",
        },
        "no capacity for this request here; released",
      );
      await this.release(msg, NO_CAPACITY_RELEASE_S, log);
      return "skipped";
    }
    const namespace = this.o.workloads.targetNamespace(req);
    const refused = this.o.workloads.refusal(req);
    if (refused) {
      // Whatever the control plane sends, nothing is created outside the configured namespaces.
      log.warn({ target: namespace }, "request refused: its namespace is not one this agent deploys into");
      await this.o.status.reportNow(req.requestId, { phase: "Failed", message: refused, instances: [] });
      await this.ackTaken(msg, log);
      this.remember(msg.messageId);
      return "refused";
    }
    const existing = await this.o.workloads.readRecord(req.requestId);
    if (existing && existing.state !== "accepted") {
      // Durable dedupe: applied (or terminated, or failed) in an earlier delivery, perhaps by an
      // earlier run of the agent. Never create it again.
      log.info({ state: existing.state }, "request already handled; acknowledging without creating it again");
      await this.ackTaken(msg, log);
      this.remember(msg.messageId);
      return "duplicate";
    }
    const rec: RequestRecord = {
      requestId: req.requestId,
      messageId: msg.messageId,
      name: req.name,
      namespace,
      state: "accepted",
      updatedAt: new Date().toISOString(),
    };
    if (!existing) await this.o.workloads.writeRecord(rec);
    await this.o.hooks?.beforeApply?.(req.requestId);
    try {
      await this.o.workloads.apply(req, msg.messageId);
    } catch (err) {
      const terminal =
        err instanceof OwnershipError ||
        err instanceof NamespaceNotAllowedError ||
        isTerminalApiError((err as Error).cause ?? err);
      if (!terminal) throw err;
      const message = (err as Error).message;
      log.warn({ err: message }, "request cannot be deployed here; reporting it failed");
      await this.o.workloads.writeRecord({ ...rec, state: "failed", updatedAt: new Date().toISOString() });
      await this.o.status.reportNow(req.requestId, { phase: "Failed", message, instances: [] });
      await this.ackTaken(msg, log);
      this.remember(msg.messageId);
      return "failed";
    }
    await this.o.workloads.writeRecord({ ...rec, state: "applied", updatedAt: new Date().toISOString() });
    log.info({ replicas: req.replicas, gpus: req.gpus, gpuType: req.gpuType }, "workload applied");
    await this.ackTaken(msg, log);
    this.remember(msg.messageId);
    await this.o.status
      .reportNow(req.requestId, {
        phase: "Accepted",
        message: `Deployment ${namespace}/${req.name}`,
        instances: [],
      })
      .catch((err: unknown) => log.warn({ err }, "could not report acceptance; the next report will"));
    this.o.status.enqueue(req.requestId);
    return "accepted";
  }

  private async terminate(msg: QueueMessage, req: TerminationRequest, log: Logger): Promise<string> {
    const rec = await this.o.workloads.readRecord(req.requestId);
    const namespace = rec?.namespace || this.o.workloads.targetNamespace(req);
    const name = rec?.name || req.name;
    // Outside the allowlist nothing was ever created (and the agent may not even read there).
    if (this.o.workloads.allows(namespace)) await this.o.workloads.remove(req.requestId, namespace, name);
    // A tombstone, so that a late redelivery of the deployment request is not deployed again.
    await this.o.workloads.writeRecord({
      requestId: req.requestId,
      messageId: rec?.messageId ?? "",
      name,
      namespace,
      state: "terminated",
      updatedAt: new Date().toISOString(),
    });
    this.o.status.forget(req.requestId);
    log.info("workload removed");
    await this.o.status
      .reportNow(req.requestId, { phase: "Terminated", message: "workload removed", instances: [] })
      .catch((err: unknown) => log.warn({ err }, "could not report the termination"));
    await this.ack(msg, log);
    return "terminated";
  }

  private remember(messageId: string): void {
    this.handled.add(messageId);
    if (this.handled.size > HANDLED_MEMORY) this.handled.delete(this.handled.values().next().value!);
  }

  /**
   * Acknowledges a deployment request this cluster has taken (its outcome is on record here). If
   * that fails the message must not be released: a released message counts as never taken, so
   * the control plane could hand it to another cluster, or end it without telling this one. Left
   * alone, it comes back after its visibility timeout and the record acknowledges it then.
   */
  private async ackTaken(msg: QueueMessage, log: Logger): Promise<void> {
    try {
      await this.ack(msg, log);
    } catch (err) {
      log.warn(
        { err },
        "could not acknowledge the request; it comes back after its visibility timeout and is acknowledged then",
      );
    }
  }

  private async ack(msg: QueueMessage, log: Logger): Promise<void> {
    const r = await this.o.controlPlane.ack(msg.receiptHandle);
    for (const f of r.failed) log.warn({ reason: f.reason }, "acknowledgement refused");
  }

  private async release(msg: QueueMessage, delaySeconds: number, log: Logger): Promise<void> {
    try {
      await this.o.controlPlane.release(msg.receiptHandle, delaySeconds);
    } catch (err) {
      // The visibility timeout makes it visible again anyway.
      log.warn({ err }, "could not release the message; it returns after its visibility timeout");
    }
  }
}
