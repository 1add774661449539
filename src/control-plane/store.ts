/**
 * All control plane state in one SQLite file: clusters, credential hashes, requests and the
 * queues. Every state transition is one transaction, and queue visibility is stored as a point
 * in time, so a restart neither loses nor duplicates work: an unacknowledged message simply
 * becomes visible again when its visibility timeout runs out, restart or not.
 */
import Database from "better-sqlite3";
import { createHash, randomBytes, randomUUID } from "node:crypto";
import { chmodSync, closeSync, existsSync, mkdirSync, openSync, statSync } from "node:fs";
import { dirname } from "node:path";
import type {
  AckResponse,
  ClusterView,
  DeploymentRequest,
  Instance,
  Instruction,
  Inventory,
  MessageBody,
  QueueMessage,
  QueueName,
  ReportedPhase,
  RequestStatus,
  RequestView,
  TerminationRequest,
} from "./api.js";
import { ApiError } from "./errors.js";
import { redactUrlCredentials } from "../core/env.js";

/** 2: clusters say which namespaces they deploy into. */
const SCHEMA_VERSION = 2;

const SCHEMA = `
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS clusters (
  id TEXT PRIMARY KEY,
  name TEXT,
  agent_version TEXT,
  inventory TEXT NOT NULL,
  ready INTEGER NOT NULL DEFAULT 0,
  paused INTEGER NOT NULL DEFAULT 0,
  instruction TEXT NOT NULL DEFAULT 'none',
  namespaces TEXT,
  registered_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  last_heartbeat_at INTEGER
);
CREATE TABLE IF NOT EXISTS credentials (
  token_hash TEXT PRIMARY KEY,
  cluster_id TEXT NOT NULL REFERENCES clusters(id),
  issued_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  name TEXT NOT NULL,
  namespace TEXT NOT NULL,
  model TEXT NOT NULL,
  image TEXT NOT NULL,
  args TEXT NOT NULL,
  gpus INTEGER NOT NULL,
  gpu_type TEXT,
  replicas INTEGER NOT NULL,
  status TEXT NOT NULL,
  message TEXT,
  cluster_id TEXT REFERENCES clusters(id),
  assigned_gpu_type TEXT,
  instances TEXT NOT NULL DEFAULT '[]',
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS requests_by_status ON requests(status);
CREATE TABLE IF NOT EXISTS messages (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT NOT NULL UNIQUE,
  cluster_id TEXT NOT NULL REFERENCES clusters(id),
  queue TEXT NOT NULL,
  gpu_type TEXT,
  request_id TEXT NOT NULL REFERENCES requests(id),
  body TEXT NOT NULL,
  receive_count INTEGER NOT NULL DEFAULT 0,
  visible_at INTEGER NOT NULL,
  receipt TEXT UNIQUE,
  created_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS messages_by_queue ON messages(cluster_id, queue, visible_at);
CREATE INDEX IF NOT EXISTS messages_by_request ON messages(request_id);
`;

interface ClusterRow {
  id: string;
  name: string | null;
  agent_version: string | null;
  inventory: string;
  ready: number;
  paused: number;
  instruction: string;
  /** JSON array of the namespaces its agent deploys into; null: it did not say (any). */
  namespaces: string | null;
  registered_at: number;
  updated_at: number;
  last_heartbeat_at: number | null;
}

interface RequestRow {
  seq: number;
  id: string;
  name: string;
  namespace: string;
  model: string;
  image: string;
  args: string;
  gpus: number;
  gpu_type: string | null;
  replicas: number;
  status: string;
  message: string | null;
  cluster_id: string | null;
  assigned_gpu_type: string | null;
  instances: string;
  created_at: number;
  updated_at: number;
}

interface MessageRow {
  seq: number;
  id: string;
  cluster_id: string;
  queue: string;
  gpu_type: string | null;
  request_id: string;
  body: string;
  receive_count: number;
  visible_at: number;
  receipt: string | null;
}

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

export type TokenIdentity =
  | { kind: "queue"; clusterId: string; expiresAt: number }
  | { kind: "expired"; clusterId: string; expiresAt: number }
  | undefined;

export interface QueueDepth {
  clusterId: string;
  queue: QueueName;
  visible: number;
  inflight: number;
}

/** Statuses that still hold GPUs on their cluster (a Failed deployment may still have pods). */
const HOLDS_CAPACITY = "status NOT IN ('Pending', 'Terminated')";
/** How long an expired credential is kept, so its use is told "expired" rather than "unknown". */
const EXPIRED_CREDENTIAL_RETENTION_MS = 24 * 3600_000;

export function hashToken(token: string): string {
  return createHash("sha256").update(token).digest("hex");
}

const iso = (ms: number): string => new Date(ms).toISOString();

export interface StoreOptions {
  path: string;
  /** Told when the database file had to be made owner-only. */
  onWarning?: (msg: string, detail: Record<string, unknown>) => void;
  now?: () => number;
  /** Called after a transaction commits that made messages visible on this cluster's queue. */
  onMessages?: (clusterId: string, queue: QueueName) => void;
}

export class Store {
  private readonly db: Database.Database;
  private readonly now: () => number;
  private readonly onMessages: (clusterId: string, queue: QueueName) => void;
  private readonly notify = new Set<string>();
  private depth = 0;

  constructor(opts: StoreOptions) {
    this.now = opts.now ?? Date.now;
    this.onMessages = opts.onMessages ?? ((): void => undefined);
    preparePrivateFile(opts.path, opts.onWarning ?? ((): void => undefined));
    this.db = new Database(opts.path);
    try {
      this.db.pragma("journal_mode = WAL");
      // WAL with synchronous=FULL: an acknowledged call survives power loss, not only a crash.
      this.db.pragma("synchronous = FULL");
      this.db.pragma("foreign_keys = ON");
      this.db.pragma("busy_timeout = 5000");
      this.db.exec(SCHEMA);
      const row = this.db.prepare("SELECT value FROM meta WHERE key = 'schema'").get() as
        { value: string } | undefined;
      if (!row) {
        this.db.prepare("INSERT INTO meta (key, value) VALUES ('schema', ?)").run(String(SCHEMA_VERSION));
      } else if (Number(row.value) > SCHEMA_VERSION) {
        throw new Error(
          `database schema ${row.value} is newer than this control plane understands (${SCHEMA_VERSION})`,
        );
      } else if (Number(row.value) < SCHEMA_VERSION) {
        this.db.transaction(() => {
          if (Number(row.value) < 2) this.db.exec("ALTER TABLE clusters ADD COLUMN namespaces TEXT");
          this.db.prepare("UPDATE meta SET value = ? WHERE key = 'schema'").run(String(SCHEMA_VERSION));
        })();
      }
    } catch (err) {
      this.db.close();
      throw new Error(`cannot open control plane database ${opts.path}: ${(err as Error).message}`, {
        cause: err,
      });
    }
  }

  close(): void {
    if (this.db.open) this.db.close();
  }

  /** One transaction; queue notifications go out only after it commits. */
  private tx<T>(fn: () => T): T {
    this.depth++;
    try {
      const result = this.db.transaction(fn).immediate();
      if (this.depth === 1) this.flush();
      return result;
    } catch (err) {
      if (this.depth === 1) this.notify.clear();
      throw err;
    } finally {
      this.depth--;
    }
  }

  private flush(): void {
    const keys = [...this.notify];
    this.notify.clear();
    for (const k of keys) {
      const [clusterId, queue] = k.split("\u0000") as [string, QueueName];
      this.onMessages(clusterId, queue);
    }
  }

  // --- clusters and credentials --------------------------------------------------------------

  register(input: {
    clusterId: string;
    name?: string | undefined;
    agentVersion?: string | undefined;
    inventory: Inventory;
    namespaces?: string[] | undefined;
  }): {
    created: boolean;
  } {
    return this.tx(() => {
      const now = this.now();
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
          this.unqueueUndelivered(
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

  /**
   * A registration and the credential it returns, in one transaction: a crash between the two
   * would leave a cluster registered (and requests placed on it) that was never given credentials.
   */
  registerWithCredential(
    input: Parameters<Store["register"]>[0],
    ttlSeconds: number,
  ): { created: boolean; token: string; expiresAt: number } {
    return this.tx(() => ({ ...this.register(input), ...this.issueCredential(input.clusterId, ttlSeconds) }));
  }

  /** Issues a credential and returns the token; only its hash is stored. */
  issueCredential(clusterId: string, ttlSeconds: number): { token: string; expiresAt: number } {
    return this.tx(() => {
      const now = this.now();
      const token = `wsq_${randomBytes(32).toString("base64url")}`;
      const expiresAt = now + ttlSeconds * 1000;
      this.db
        .prepare(
          "INSERT INTO credentials (token_hash, cluster_id, issued_at, expires_at) VALUES (?, ?, ?, ?)",
        )
        .run(hashToken(token), clusterId, now, expiresAt);
      this.db
        .prepare("DELETE FROM credentials WHERE expires_at < ?")
        .run(now - EXPIRED_CREDENTIAL_RETENTION_MS);
      return { token, expiresAt };
    });
  }

  identifyCredential(token: string): TokenIdentity {
    const row = this.db
      .prepare("SELECT cluster_id, expires_at FROM credentials WHERE token_hash = ?")
      .get(hashToken(token)) as { cluster_id: string; expires_at: number } | undefined;
    if (!row) return undefined;
    const kind = row.expires_at > this.now() ? "queue" : "expired";
    return { kind, clusterId: row.cluster_id, expiresAt: row.expires_at };
  }

  heartbeat(clusterId: string, hb: { inventory: Inventory; ready: boolean; paused: boolean }): Instruction {
    return this.tx(() => {
      const row = this.requireCluster(clusterId);
      this.db
        .prepare("UPDATE clusters SET ready = ?, paused = ?, last_heartbeat_at = ? WHERE id = ?")
        .run(hb.ready ? 1 : 0, hb.paused ? 1 : 0, this.now(), clusterId);
      if (normalizeInventory(hb.inventory) !== normalizeInventory(parseInventory(row.inventory))) {
        this.applyInventory(clusterId, hb.inventory);
      }
      return row.instruction as Instruction;
    });
  }

  setInstruction(clusterId: string, instruction: Instruction): ClusterView {
    return this.tx(() => {
      this.requireCluster(clusterId);
      this.db
        .prepare("UPDATE clusters SET instruction = ?, updated_at = ? WHERE id = ?")
        .run(instruction, this.now(), clusterId);
      // A cordoned or draining cluster takes no new work: what it has not yet seen goes elsewhere.
      if (instruction !== "none")
        this.unqueueUndelivered(clusterId, () => true, `cluster ${clusterId} is ${instruction}ed`);
      this.schedule();
      return this.clusterView(this.requireCluster(clusterId));
    });
  }

  private applyInventory(clusterId: string, inventory: Inventory): void {
    this.db
      .prepare("UPDATE clusters SET inventory = ?, updated_at = ? WHERE id = ?")
      .run(JSON.stringify(inventory), this.now(), clusterId);
    // Requests are only queued for GPU types the cluster has: pull back undelivered ones whose
    // type is gone so they can be placed again.
    const types = new Set(inventory.filter((i) => i.count > 0).map((i) => i.gpuType));
    this.unqueueUndelivered(
      clusterId,
      (m) => m.gpu_type !== null && !types.has(m.gpu_type),
      `cluster ${clusterId} no longer has that GPU type`,
    );
    this.schedule();
  }

  /**
   * Deploy messages the cluster has not taken (never delivered, or released by its agent) are
   * taken back and their requests made Pending again. A delivery that merely timed out is left:
   * the agent may have acted on it before it failed to acknowledge.
   */
  private unqueueUndelivered(clusterId: string, pick: (m: MessageRow) => boolean, why: string): void {
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
        .run(why, this.now(), m.request_id);
    }
  }

  private clusterRow(id: string): ClusterRow | undefined {
    return this.db.prepare("SELECT * FROM clusters WHERE id = ?").get(id) as ClusterRow | undefined;
  }

  private requireCluster(id: string): ClusterRow {
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

  private allocated(clusterId: string, gpuType: string): number {
    const row = this.db
      .prepare(
        `SELECT COALESCE(SUM(gpus * replicas), 0) AS n FROM requests WHERE cluster_id = ? AND assigned_gpu_type = ? AND ${HOLDS_CAPACITY}`,
      )
      .get(clusterId, gpuType) as { n: number };
    return row.n;
  }

  private clusterView(r: ClusterRow): ClusterView {
    const inventory = parseInventory(r.inventory).map((i) => ({
      ...i,
      allocated: this.allocated(r.id, i.gpuType),
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

  // --- requests ------------------------------------------------------------------------------

  submit(input: NewRequest): RequestView {
    return this.tx(() => {
      const clash = this.db
        .prepare("SELECT id FROM requests WHERE namespace = ? AND name = ? AND status != 'Terminated'")
        .get(input.namespace, input.name) as { id: string } | undefined;
      if (clash) {
        throw new ApiError(
          409,
          `a request named ${input.namespace}/${input.name} is still active (${clash.id}); terminate it first`,
        );
      }
      const now = this.now();
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
      this.schedule();
      return this.getRequest(id);
    });
  }

  /** Places every Pending request it can, oldest first, on the cluster with the most free GPUs. */
  private schedule(): void {
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
      const now = this.now();
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
      this.enqueue(best.clusterId, "deploy", best.gpuType, req.id, body);
    }
  }

  private enqueue(
    clusterId: string,
    queue: QueueName,
    gpuType: string | null,
    requestId: string,
    body: MessageBody,
  ): void {
    const now = this.now();
    this.db
      .prepare(
        "INSERT INTO messages (id, cluster_id, queue, gpu_type, request_id, body, visible_at, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
      )
      .run(randomUUID(), clusterId, queue, gpuType, requestId, JSON.stringify(body), now, now);
    this.notify.add(`${clusterId}\u0000${queue}`);
  }

  private requestRow(id: string): RequestRow | undefined {
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
    return this.tx(() => {
      const row = this.requestRow(id);
      if (!row) throw new ApiError(404, `request ${id} not found`);
      if (row.status === "Terminated" || row.status === "Terminating") return requestView(row);
      const now = this.now();
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
        this.schedule();
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
        this.enqueue(row.cluster_id, "termination", null, id, body);
      }
      return this.getRequest(id);
    });
  }

  reportStatus(
    clusterId: string,
    requestId: string,
    report: { phase: ReportedPhase; message?: string | undefined; instances: Instance[] },
  ): RequestView {
    return this.tx(() => {
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
        .run(status, report.message ?? null, JSON.stringify(report.instances), this.now(), requestId);
      if (status === "Terminated" && row.status !== "Terminated") {
        this.db.prepare("DELETE FROM messages WHERE request_id = ? AND queue = 'deploy'").run(requestId);
        this.schedule();
      }
      return this.getRequest(requestId);
    });
  }

  // --- queues --------------------------------------------------------------------------------

  receive(
    clusterId: string,
    queue: QueueName,
    opts: { gpuTypes?: string[] | undefined; maxMessages: number; visibilityTimeoutSeconds: number },
  ): QueueMessage[] {
    return this.tx(() => {
      const now = this.now();
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
      return rows.map((m) => {
        const receipt = randomBytes(24).toString("base64url");
        update.run(receipt, now + opts.visibilityTimeoutSeconds * 1000, m.id);
        return {
          messageId: m.id,
          receiptHandle: receipt,
          receiveCount: m.receive_count + 1,
          body: JSON.parse(m.body) as MessageBody,
        };
      });
    });
  }

  /** When the next invisible message on this queue becomes visible (for long polls), if any. */
  nextVisibleAt(clusterId: string, queue: QueueName): number | undefined {
    const row = this.db
      .prepare(
        "SELECT MIN(visible_at) AS t FROM messages WHERE cluster_id = ? AND queue = ? AND visible_at > ?",
      )
      .get(clusterId, queue, this.now()) as { t: number | null };
    return row.t ?? undefined;
  }

  ack(clusterId: string, receiptHandles: string[]): AckResponse {
    return this.tx(() => {
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
            .run(this.now(), m.request_id);
        }
        out.acknowledged.push(handle);
      }
      return out;
    });
  }

  release(clusterId: string, receiptHandle: string, delaySeconds: number): boolean {
    return this.tx(() => {
      const m = this.db
        .prepare("SELECT * FROM messages WHERE receipt = ? AND cluster_id = ?")
        .get(receiptHandle, clusterId) as MessageRow | undefined;
      if (!m) return false;
      this.db
        .prepare("UPDATE messages SET receipt = NULL, visible_at = ? WHERE id = ?")
        .run(this.now() + delaySeconds * 1000, m.id);
      if (delaySeconds === 0) this.notify.add(`${clusterId}\u0000${m.queue}`);
      return true;
    });
  }

  queueDepths(): QueueDepth[] {
    const rows = this.db
      .prepare(
        `SELECT cluster_id, queue, SUM(visible_at <= ?) AS visible, SUM(visible_at > ?) AS inflight
         FROM messages GROUP BY cluster_id, queue`,
      )
      .all(this.now(), this.now()) as {
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

  requestCounts(): { status: string; n: number }[] {
    return this.db.prepare("SELECT status, COUNT(*) AS n FROM requests GROUP BY status").all() as {
      status: string;
      n: number;
    }[];
  }
}

function parseInventory(s: string): Inventory {
  return JSON.parse(s) as Inventory;
}

function normalizeInventory(inv: Inventory): string {
  return JSON.stringify([...inv].sort((a, b) => a.gpuType.localeCompare(b.gpuType)));
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

/**
 * The database file is owner-only: created 0600 (SQLite gives its -wal and -shm files the same
 * mode), in a folder created 0700. An existing file others can read is made owner-only, or
 * refused when that is not possible.
 */
function preparePrivateFile(
  path: string,
  warn: (msg: string, detail: Record<string, unknown>) => void,
): void {
  if (path === ":memory:") return;
  const dir = dirname(path);
  if (!existsSync(dir)) mkdirSync(dir, { recursive: true, mode: 0o700 });
  try {
    closeSync(openSync(path, "wx", 0o600));
    return;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
  }
  for (const file of [path, `${path}-wal`, `${path}-shm`, `${path}-journal`]) {
    let mode: number;
    try {
      mode = statSync(file).mode & 0o777;
    } catch {
      continue;
    }
    if ((mode & 0o077) === 0) continue;
    try {
      chmodSync(file, 0o600);
    } catch (err) {
      throw new Error(
        `control plane database ${file} is readable by other users (mode ${mode.toString(8)}) and cannot be made owner-only (${(err as Error).message}); chmod 600 it`,
        { cause: err },
      );
    }
    warn("database file was readable by other users; made it owner-only (0600)", {
      file,
      mode: mode.toString(8),
    });
  }
}
