/**
 * Deployment requests: submitted Pending, placed (Queued) by the scheduler, Accepted when their
 * cluster acknowledges the message, then as the cluster reports. Terminated is final.
 */
import { randomUUID } from "node:crypto";
import type { Instance, ReportedPhase, RequestStatus, RequestView, TerminationRequest } from "./api.js";
import { ApiError } from "./errors.js";
import { redactUrlCredentials } from "../core/env.js";
import type { StoreDatabase } from "./store-database.js";
import type { MessageQueues } from "./store-queues.js";
import type { Scheduler } from "./store-scheduler.js";
import { iso, type RequestRow } from "./store-schema.js";

export interface NewRequest {
  name: string;
  namespace: string;
  model: string;
  image: string;
  args?: string[] | undefined;
  gpus: number;
  gpuType?: string | undefined;
  replicas: number;
}

export class Requests {
  constructor(
    private readonly db: StoreDatabase,
    private readonly queues: MessageQueues,
    private readonly scheduler: Scheduler,
  ) {}

  submit(input: NewRequest): RequestView {
    return this.db.tx(() => {
      const clash = this.db
        .prepare("SELECT id FROM requests WHERE namespace = ? AND name = ? AND status != 'Terminated'")
        .get(input.namespace, input.name) as { id: string } | undefined;
      if (clash) {
        throw new ApiError(
          409,
          `a request named ${input.namespace}/${input.name} is still active (${clash.id}); terminate it first`,
        );
      }
      const now = this.db.now();
      const id = randomUUID();
      // The args are the user's own and reach their container as given (so a model URL's
      // credentials still work there); every other copy of the model is redacted.
      const args = input.args && input.args.length > 0 ? input.args : ["--model", input.model];
      this.db
        .prepare(
          `INSERT INTO requests (id, name, namespace, model, image, args, gpus, gpu_type, replicas, status, created_at, updated_at)
           VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, 'Pending', ?, ?)`,
        )
        .run(
          id,
          input.name,
          input.namespace,
          redactUrlCredentials(input.model),
          input.image,
          JSON.stringify(args),
          input.gpus,
          input.gpuType ?? null,
          input.replicas,
          now,
          now,
        );
      this.scheduler.schedule();
      return this.getRequest(id);
    });
  }
  requestRow(id: string): RequestRow | undefined {
    return this.db.prepare("SELECT * FROM requests WHERE id = ?").get(id) as RequestRow | undefined;
  }

  getRequest(id: string): RequestView {
    const row = this.requestRow(id);
    if (!row) throw new ApiError(404, `request ${id} not found`);
    return requestView(row);
  }

  listRequests(status?: RequestStatus): RequestView[] {
    const rows = (
      status === undefined
        ? this.db.prepare("SELECT * FROM requests ORDER BY seq").all()
        : this.db.prepare("SELECT * FROM requests WHERE status = ? ORDER BY seq").all(status)
    ) as RequestRow[];
    return rows.map(requestView);
  }

  /**
   * Terminates a request. Its deploy message is withdrawn in any case, so a redelivery can never
   * recreate what is being removed; if the cluster never saw it, it is done at once, else the
   * cluster gets a termination message and the request is Terminating until the agent reports.
   */
  terminate(id: string): RequestView {
    return this.db.tx(() => {
      const row = this.requestRow(id);
      if (!row) throw new ApiError(404, `request ${id} not found`);
      if (row.status === "Terminated" || row.status === "Terminating") return requestView(row);
      const now = this.db.now();
      const seen = this.db
        .prepare(
          "SELECT COUNT(*) AS n FROM messages WHERE request_id = ? AND queue = 'deploy' AND receive_count > 0 AND receipt IS NOT NULL",
        )
        .get(id) as { n: number };
      const delivered = row.status !== "Pending" && row.status !== "Queued" ? true : seen.n > 0;
      this.db.prepare("DELETE FROM messages WHERE request_id = ? AND queue = 'deploy'").run(id);
      if (!delivered || row.cluster_id === null) {
        this.db
          .prepare("UPDATE requests SET status = 'Terminated', message = ?, updated_at = ? WHERE id = ?")
          .run("terminated before a cluster received it", now, id);
        this.scheduler.schedule();
      } else {
        this.db
          .prepare("UPDATE requests SET status = 'Terminating', updated_at = ? WHERE id = ?")
          .run(now, id);
        const body: TerminationRequest = {
          kind: "terminate",
          requestId: id,
          name: row.name,
          namespace: row.namespace,
          requestedAt: iso(now),
        };
        this.queues.enqueue(row.cluster_id, "termination", null, id, body);
      }
      return this.getRequest(id);
    });
  }

  reportStatus(
    clusterId: string,
    requestId: string,
    report: { phase: ReportedPhase; message?: string | undefined; instances: Instance[] },
  ): RequestView {
    return this.db.tx(() => {
      const row = this.requestRow(requestId);
      if (!row) throw new ApiError(404, `request ${requestId} not found`);
      if (row.cluster_id !== clusterId) {
        throw new ApiError(403, `request ${requestId} is not assigned to cluster ${clusterId}`);
      }
      // Terminated is final; while Terminating only the agent's Terminated ends it.
      let status: string = report.phase;
      if (row.status === "Terminated") status = "Terminated";
      else if (row.status === "Terminating" && report.phase !== "Terminated") status = "Terminating";
      this.db
        .prepare("UPDATE requests SET status = ?, message = ?, instances = ?, updated_at = ? WHERE id = ?")
        .run(status, report.message ?? null, JSON.stringify(report.instances), this.db.now(), requestId);
      if (status === "Terminated" && row.status !== "Terminated") {
        this.db.prepare("DELETE FROM messages WHERE request_id = ? AND queue = 'deploy'").run(requestId);
        this.scheduler.schedule();
      }
      return this.getRequest(requestId);
    });
  }

  requestCounts(): { status: string; n: number }[] {
    return this.db.prepare("SELECT status, COUNT(*) AS n FROM requests GROUP BY status").all() as {
      status: string;
      n: number;
    }[];
  }
}

function requestView(r: RequestRow): RequestView {
  return {
    id: r.id,
    name: r.name,
    namespace: r.namespace,
    model: r.model,
    image: r.image,
    args: (JSON.parse(r.args) as string[]).map(redactUrlCredentials),
    gpus: r.gpus,
    gpuType: r.gpu_type,
    replicas: r.replicas,
    status: r.status as RequestStatus,
    message: r.message,
    clusterId: r.cluster_id,
    assignedGpuType: r.assigned_gpu_type,
    instances: JSON.parse(r.instances) as Instance[],
    createdAt: iso(r.created_at),
    updatedAt: iso(r.updated_at),
  };
}
