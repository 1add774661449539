/**
 * The control plane database's tables and the rows read from them. The schema version is stored
 * in the database; a newer one than this code knows is refused, an older one migrated on open
 * (store-database.ts).
 */
import type { Inventory } from "./api.js";

/** 2: clusters say which namespaces they deploy into. */
export const SCHEMA_VERSION = 2;

export const SCHEMA = `
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

export interface ClusterRow {
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

export interface RequestRow {
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

export interface MessageRow {
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

/** Statuses that still hold GPUs on their cluster (a Failed deployment may still have pods). */
export const HOLDS_CAPACITY = "status NOT IN ('Pending', 'Terminated')";

export const iso = (ms: number): string => new Date(ms).toISOString();

export function parseInventory(s: string): Inventory {
  return JSON.parse(s) as Inventory;
}

export function normalizeInventory(inv: Inventory): string {
  return JSON.stringify([...inv].sort((a, b) => a.gpuType.localeCompare(b.gpuType)));
}
