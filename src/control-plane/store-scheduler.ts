/**
 * Placement: every Pending request goes, oldest first, to the schedulable cluster with the most
 * free GPUs of a type it accepts, in a namespace that cluster deploys into; what fits nowhere
 * stays Pending and says what it is waiting for.
 */
import type { DeploymentRequest } from "./api.js";
import type { StoreDatabase } from "./store-database.js";
import type { MessageQueues } from "./store-queues.js";
import { HOLDS_CAPACITY, iso, parseInventory, type ClusterRow, type RequestRow } from "./store-schema.js";

export class Scheduler {
  constructor(
    private readonly db: StoreDatabase,
    private readonly queues: MessageQueues,
  ) {}

  /** Places every Pending request it can, oldest first, on the cluster with the most free GPUs. */
  schedule(): void {
    const pending = this.db
      .prepare("SELECT * FROM requests WHERE status = 'Pending' ORDER BY seq")
      .all() as RequestRow[];
    if (pending.length === 0) return;
    const clusters = this.db
      .prepare("SELECT * FROM clusters WHERE instruction = 'none' ORDER BY id")
      .all() as ClusterRow[];
    for (const req of pending) {
      const need = req.gpus * req.replicas;
      let best: { clusterId: string; gpuType: string; free: number } | undefined;
      for (const c of clusters) {
        if (c.namespaces !== null && !(JSON.parse(c.namespaces) as string[]).includes(req.namespace))
          continue;
        for (const item of parseInventory(c.inventory)) {
          if (item.count === 0 || (req.gpu_type !== null && item.gpuType !== req.gpu_type)) continue;
          const free = item.count - this.allocated(c.id, item.gpuType);
          if (free >= need && (!best || free > best.free))
            best = { clusterId: c.id, gpuType: item.gpuType, free };
        }
      }
      const now = this.db.now();
      if (!best) {
        const why = `waiting for a cluster with ${need} free GPU${need === 1 ? "" : "s"}${
          req.gpu_type === null ? "" : ` of type ${req.gpu_type}`
        } that deploys into namespace ${req.namespace}`;
        if (req.message !== why) {
          this.db
            .prepare("UPDATE requests SET message = ?, updated_at = ? WHERE id = ?")
            .run(why, now, req.id);
        }
        continue;
      }
      this.db
        .prepare(
          "UPDATE requests SET status = 'Queued', cluster_id = ?, assigned_gpu_type = ?, message = NULL, updated_at = ? WHERE id = ?",
        )
        .run(best.clusterId, best.gpuType, now, req.id);
      const body: DeploymentRequest = {
        kind: "deploy",
        requestId: req.id,
        name: req.name,
        namespace: req.namespace,
        model: req.model,
        image: req.image,
        args: JSON.parse(req.args) as string[],
        gpus: req.gpus,
        gpuType: best.gpuType,
        replicas: req.replicas,
        submittedAt: iso(req.created_at),
      };
      this.queues.enqueue(best.clusterId, "deploy", best.gpuType, req.id, body);
    }
  }

  allocated(clusterId: string, gpuType: string): number {
    const row = this.db
      .prepare(
        `SELECT COALESCE(SUM(gpus * replicas), 0) AS n FROM requests WHERE cluster_id = ? AND assigned_gpu_type = ? AND ${HOLDS_CAPACITY}`,
      )
      .get(clusterId, gpuType) as { n: number };
    return row.n;
  }
}
