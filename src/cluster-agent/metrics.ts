import { Counter, Gauge, Registry, collectDefaultMetrics } from "prom-client";

/** The agent's Prometheus metrics, on a registry of its own (several agents can share a process in tests). */
export function createMetrics(): {
  registry: Registry;
  registrationAttempts: Counter<"kind">;
  registrationFailures: Counter<"kind">;
  backoffSeconds: Gauge<"kind">;
  ready: Gauge;
  gpus: Gauge<"gpu_type">;
  messages: Counter<"queue" | "outcome">;
  lookupFailures: Counter;
} {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: "warmstart_cluster_agent_" });
  const registers = [registry];
  return {
    registry,
    registrationAttempts: new Counter({
      name: "warmstart_cluster_agent_registration_attempts_total",
      help: "Calls to the control plane that register or renew credentials",
      labelNames: ["kind"] as const,
      registers,
    }),
    registrationFailures: new Counter({
      name: "warmstart_cluster_agent_registration_failures_total",
      help: "Failed registrations and renewals (each is retried)",
      labelNames: ["kind"] as const,
      registers,
    }),
    backoffSeconds: new Gauge({
      name: "warmstart_cluster_agent_backoff_seconds",
      help: "The wait before the current retry (0 when not retrying)",
      labelNames: ["kind"] as const,
      registers,
    }),
    ready: new Gauge({
      name: "warmstart_cluster_agent_ready",
      help: "1 when registered with GPUs and taking work",
      registers,
    }),
    gpus: new Gauge({
      name: "warmstart_cluster_agent_gpus",
      help: "Allocatable GPUs on counted nodes, by type",
      labelNames: ["gpu_type"] as const,
      registers,
    }),
    messages: new Counter({
      name: "warmstart_cluster_agent_messages_total",
      help: "Queue messages handled, by queue and outcome",
      labelNames: ["queue", "outcome"] as const,
      registers,
    }),
    lookupFailures: new Counter({
      name: "warmstart_cluster_agent_gpu_lookup_failures_total",
      help: "Failed GPU inventory lookups (the last known state is kept)",
      registers,
    }),
  };
}

export type AgentMetrics = ReturnType<typeof createMetrics>;
