/**
 * Registered clusters: registration, heartbeats, the operator's instruction and the view of each
 * cluster's capacity. A change in what a cluster can take (GPU types, namespaces, a cordon) takes
 * back the work it has not yet seen and places it again.
 */
import type { ClusterView, Instruction, Inventory } from "./api.js";
import { ApiError } from "./errors.js";
import type { StoreDatabase } from "./store-database.js";
import type { MessageQueues } from "./store-queues.js";
import type { Scheduler } from "./store-scheduler.js";
import { HOLDS_CAPACITY, iso, normalizeInventory, parseInventory, type ClusterRow } from "./store-schema.js";

export interface ClusterRegistration {
  clusterId: string;
  name?: string | undefined;
  agentVersion?: string | undefined;
  inventory: Inventory;
  namespaces?: string[] | undefined;
}

export class Clusters {
  constructor(
    private readonly db: StoreDatabase,
    private readonly queues: MessageQueues,
    private readonly scheduler: Scheduler,
  ) {}

  register(input: ClusterRegistration): { created: boolean } {
    return this.db.tx(() => {
      const now = this.db.now();
      const existing = this.clusterRow(input.clusterId);
      const namespaces = input.namespaces === undefined ? null : JSON.stringify([...input.namespaces].sort());
      if (existing) {
        this.db
          .prepare(
            "UPDATE clusters SET name = ?, agent_version = ?, namespaces = ?, updated_at = ? WHERE id = ?",
          )
          .run(
            input.name ?? existing.name,
            input.agentVersion ?? existing.agent_version,
            namespaces,
            now,
            input.clusterId,
          );
        // Requests it was given but has not taken, into namespaces it no longer deploys into.
        if (namespaces !== null) {
          const into = new Set(input.namespaces);
          const ns = this.db.prepare("SELECT namespace FROM requests WHERE id = ?");
          this.queues.unqueueUndelivered(
            input.clusterId,
            (m) => !into.has((ns.get(m.request_id) as { namespace: string } | undefined)?.namespace ?? ""),
            `cluster ${input.clusterId} does not deploy into that namespace`,
          );
        }
      } else {
        this.db
          .prepare(
            "INSERT INTO clusters (id, name, agent_version, inventory, namespaces, registered_at, updated_at) VALUES (?, ?, ?, '[]', ?, ?, ?)",
          )
          .run(input.clusterId, input.name ?? null, input.agentVersion ?? null, namespaces, now, now);
      }
      this.applyInventory(input.clusterId, input.inventory);
      return { created: !existing };
    });
  }

  heartbeat(clusterId: string, hb: { inventory: Inventory; ready: boolean; paused: boolean }): Instruction {
    return this.db.tx(() => {
      const row = this.requireCluster(clusterId);
      this.db
        .prepare("UPDATE clusters SET ready = ?, paused = ?, last_heartbeat_at = ? WHERE id = ?")
        .run(hb.ready ? 1 : 0, hb.paused ? 1 : 0, this.db.now(), clusterId);
      if (normalizeInventory(hb.inventory) !== normalizeInventory(parseInventory(row.inventory))) {
        this.applyInventory(clusterId, hb.inventory);
      }
      return row.instruction as Instruction;
    });
  }

  setInstruction(clusterId: string, instruction: Instruction): ClusterView {
    return this.db.tx(() => {
      this.requireCluster(clusterId);
      this.db
        .prepare("UPDATE clusters SET instruction = ?, updated_at = ? WHERE id = ?")
        .run(instruction, this.db.now(), clusterId);
      // A cordoned or draining cluster takes no new work: what it has not yet seen goes elsewhere.
      if (instruction !== "none")
        this.queues.unqueueUndelivered(clusterId, () => true, `cluster ${clusterId} is ${instruction}ed`);
      this.scheduler.schedule();
      return this.clusterView(this.requireCluster(clusterId));
    });
  }

  applyInventory(clusterId: string, inventory: Inventory): void {
    this.db
      .prepare("UPDATE clusters SET inventory = ?, updated_at = ? WHERE id = ?")
      .run(JSON.stringify(inventory), this.db.now(), clusterId);
    // Requests are only queued for GPU types the cluster has: pull back undelivered ones whose
    // type is gone so they can be placed again.
    const types = new Set(inventory.filter((i) => i.count > 0).map((i) => i.gpuType));
    this.queues.unqueueUndelivered(
      clusterId,
      (m) => m.gpu_type !== null && !types.has(m.gpu_type),
      `cluster ${clusterId} no longer has that GPU type`,
    );
    this.scheduler.schedule();
  }

  clusterRow(id: string): ClusterRow | undefined {
    return this.db.prepare("SELECT * FROM clusters WHERE id = ?").get(id) as ClusterRow | undefined;
  }

  requireCluster(id: string): ClusterRow {
    const row = this.clusterRow(id);
    if (!row) throw new ApiError(404, `cluster ${id} is not registered`);
    return row;
  }

  hasCluster(id: string): boolean {
    return this.clusterRow(id) !== undefined;
  }

  listClusters(): ClusterView[] {
    const rows = this.db.prepare("SELECT * FROM clusters ORDER BY id").all() as ClusterRow[];
    return rows.map((r) => this.clusterView(r));
  }

  getCluster(id: string): ClusterView {
    return this.clusterView(this.requireCluster(id));
  }

  /** GPU types with a deploy queue: those registered with a count above zero. */
  deployQueues(clusterId: string): string[] {
    return parseInventory(this.requireCluster(clusterId).inventory)
      .filter((i) => i.count > 0)
      .map((i) => i.gpuType);
  }

  clusterView(r: ClusterRow): ClusterView {
    const inventory = parseInventory(r.inventory).map((i) => ({
      ...i,
      allocated: this.scheduler.allocated(r.id, i.gpuType),
    }));
    const capacity = inventory.reduce((n, i) => n + i.count, 0);
    const depth = this.db
      .prepare("SELECT queue, COUNT(*) AS n FROM messages WHERE cluster_id = ? GROUP BY queue")
      .all(r.id) as { queue: string; n: number }[];
    const allocatedTotal = this.db
      .prepare(
        `SELECT COALESCE(SUM(gpus * replicas), 0) AS n FROM requests WHERE cluster_id = ? AND ${HOLDS_CAPACITY}`,
      )
      .get(r.id) as { n: number };
    return {
      clusterId: r.id,
      name: r.name,
      agentVersion: r.agent_version,
      inventory,
      capacity,
      allocated: allocatedTotal.n,
      schedulable: capacity > 0 && r.instruction === "none",
      ready: r.ready === 1,
      paused: r.paused === 1,
      instruction: r.instruction as Instruction,
      namespaces: r.namespaces === null ? null : (JSON.parse(r.namespaces) as string[]),
      registeredAt: iso(r.registered_at),
      lastHeartbeatAt: r.last_heartbeat_at === null ? null : iso(r.last_heartbeat_at),
      queueDepth: {
        deploy: depth.find((d) => d.queue === "deploy")?.n ?? 0,
        termination: depth.find((d) => d.queue === "termination")?.n ?? 0,
      },
    };
  }
}
