import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";

export interface NodeAgentMetrics {
  registry: Registry;
  decisions: Counter<"decision">;
  marksInProgress: Gauge;
  marksReleased: Counter<"reason">;
  captures: Counter<"result">;
  captureSeconds: Histogram;
  capturedBytes: Counter;
  promotes: Counter<"result">;
  promoteSeconds: Histogram;
  claims: Counter<"result">;
  watchRestarts: Counter;
  evictions: Counter;
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
  };
}
