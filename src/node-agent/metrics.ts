import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";

export interface NodeAgentMetrics {
  registry: Registry;
  decisions: Counter<"decision">;
  marksInProgress: Gauge;
  marksReleased: Counter<"reason">;
  captures: Counter<"result">;
  captureSeconds: Histogram;
  capturedBytes: Counter;
  /** Waiting followers' fill volumes, by outcome (filled, cold). */
  fills: Counter<"outcome">;
  promotes: Counter<"result">;
  promoteSeconds: Histogram;
  claims: Counter<"result">;
  watchRestarts: Counter;
  evictions: Counter;
  /** Each pod's start by phase, from its engine's log (leader and restores side by side). */
  engineStartSeconds: Histogram<"phase" | "role" | "engine">;
  compileCaches: Counter<"result" | "role">;
  /** Trees served to and fetched from peers (node-store). */
  replication: ReplicationMetrics;
}

export function createNodeAgentMetrics(): NodeAgentMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  const r = [registry];
  return {
    registry,
    decisions: new Counter({
      name: "warmstart_node_agent_decisions_total",
      help: "What the agent decided about a pod event (skipped-<why>, scheduled, ...)",
      labelNames: ["decision"],
      registers: r,
    }),
    marksInProgress: new Gauge({
      name: "warmstart_node_agent_marks_in_progress",
      help: "Leader pods marked in progress (warming up, waiting for a slot, capturing, promoting)",
      registers: r,
    }),
    marksReleased: new Counter({
      name: "warmstart_node_agent_marks_released_total",
      help: "In-progress marks released without a committed capture, by reason",
      labelNames: ["reason"],
      registers: r,
    }),
    captures: new Counter({
      name: "warmstart_node_agent_captures_total",
      help: "Captures by result (captured, already-captured, failed, cancelled, discarded)",
      labelNames: ["result"],
      registers: r,
    }),
    captureSeconds: new Histogram({
      name: "warmstart_node_agent_capture_seconds",
      help: "Time to copy and commit one cache tree",
      buckets: [0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1200, 2400],
      registers: r,
    }),
    capturedBytes: new Counter({
      name: "warmstart_node_agent_captured_bytes_total",
      help: "Data bytes committed into the cache store",
      registers: r,
    }),
    fills: new Counter({
      name: "warmstart_node_agent_fills_total",
      help: "Waiting followers' fill volumes by outcome (filled: the tree copied in; cold: the cold marker written)",
      labelNames: ["outcome"],
      registers: r,
    }),
    promotes: new Counter({
      name: "warmstart_node_agent_promotes_total",
      help: "Promotes by result (ready, failed, unsupported)",
      labelNames: ["result"],
      registers: r,
    }),
    promoteSeconds: new Histogram({
      name: "warmstart_node_agent_promote_seconds",
      help: "Time from a committed capture to the cache published Ready or Failed",
      buckets: [0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300],
      registers: r,
    }),
    claims: new Counter({
      name: "warmstart_node_agent_claims_total",
      help: "Claim ensures per namespace by result (created, exists, gone, retry, failed)",
      labelNames: ["result"],
      registers: r,
    }),
    evictions: new Counter({
      name: "warmstart_node_agent_store_evictions_total",
      help: "Caches removed from the store to make room under its budget",
      registers: r,
    }),
    watchRestarts: new Counter({
      name: "warmstart_node_agent_watch_restarts_total",
      help: "Pod watch restarts after an error",
      registers: r,
    }),
    engineStartSeconds: new Histogram({
      name: "warmstart_engine_start_seconds",
      help: "Seconds per start-up phase of each pod of a cache on this node, as its engine's log says (download, weightLoad, modelLoad, compile, cudaGraph, engineInit, ready)",
      labelNames: ["phase", "role", "engine"],
      // Engines take minutes to start: buckets reach 30 minutes.
      buckets: [0.5, 1, 2, 5, 10, 20, 30, 60, 90, 120, 180, 300, 600, 900, 1200, 1800],
      registers: r,
    }),
    compileCaches: new Counter({
      name: "warmstart_compile_cache_total",
      help: "Pods' compile caches as their engines reported them: hit, miss or unknown, by role",
      labelNames: ["result", "role"],
      registers: r,
    }),
    replication: createReplicationMetrics(registry),
  };
}

/** Replication between node agents (node-store backend): both the serving and receiving side. */
export interface ReplicationMetrics {
  /** Bytes received, by the source node they came from. */
  receivedBytes: Counter<"source">;
  /** Trees by result (replicated, present, failed, aborted). */
  trees: Counter<"result">;
  replicationSeconds: Histogram;
  /** Each replicated tree's receive rate, in bytes per second. */
  replicationRate: Histogram;
  /** Sources given up on during a replication, by reason (error, timeout, status, protocol,
   * corrupt, manifest). */
  sourcesDropped: Counter<"reason">;
  /** Sources that served another tree than the record's (manifest, corrupt): tampering. */
  tampered: Counter<"reason">;
  /** Bytes this node served to its peers. */
  servedBytes: Counter;
  /** File streams this node is serving to its peers now. */
  servingStreams: Gauge;
  /** Bytes of each tree being filled from peers now, and of the whole tree (the series go when it ends). */
  fillingBytes: Gauge<"hash">;
  fillingTotalBytes: Gauge<"hash">;
}

/** Replication's metrics, registered on the agent's registry (or a test's own). */
export function createReplicationMetrics(registry: Registry): ReplicationMetrics {
  const r = [registry];
  return {
    receivedBytes: new Counter({
      name: "warmstart_node_agent_replication_received_bytes_total",
      help: "Tree bytes received from peer node agents, by source node",
      labelNames: ["source"],
      registers: r,
    }),
    trees: new Counter({
      name: "warmstart_node_agent_replications_total",
      help: "Trees replicated from peers by result (replicated, present, failed, aborted)",
      labelNames: ["result"],
      registers: r,
    }),
    replicationSeconds: new Histogram({
      name: "warmstart_node_agent_replication_seconds",
      help: "Time to replicate one tree from its peers, manifest to commit",
      buckets: [0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200, 2400],
      registers: r,
    }),
    replicationRate: new Histogram({
      name: "warmstart_node_agent_replication_bytes_per_second",
      help: "Receive rate of each replicated tree (all sources together)",
      buckets: [1e6, 1e7, 5e7, 1e8, 2.5e8, 5e8, 1e9, 2.5e9, 5e9, 1e10],
      registers: r,
    }),
    sourcesDropped: new Counter({
      name: "warmstart_node_agent_replication_sources_dropped_total",
      help: "Sources dropped during a replication, by reason",
      labelNames: ["reason"],
      registers: r,
    }),
    tampered: new Counter({
      name: "warmstart_node_agent_replication_tampered_total",
      help: "Sources that served a tree other than the record's (a manifest off its digest, bytes off the manifest), by reason",
      labelNames: ["reason"],
      registers: r,
    }),
    servedBytes: new Counter({
      name: "warmstart_node_agent_replication_served_bytes_total",
      help: "Tree bytes served to peer node agents",
      registers: r,
    }),
    servingStreams: new Gauge({
      name: "warmstart_node_agent_replication_serving_streams",
      help: "File streams being served to peer node agents now",
      registers: r,
    }),
    fillingBytes: new Gauge({
      name: "warmstart_node_agent_replication_filling_bytes",
      help: "Bytes of each tree filled from peers so far, while it fills",
      labelNames: ["hash"],
      registers: r,
    }),
    fillingTotalBytes: new Gauge({
      name: "warmstart_node_agent_replication_filling_total_bytes",
      help: "Size of each tree being filled from peers, while it fills",
      labelNames: ["hash"],
      registers: r,
    }),
  };
}
