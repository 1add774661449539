import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";

export interface WebhookMetrics {
  registry: Registry;
  decisions: Counter<"role" | "reason">;
  latency: Histogram<"outcome">;
  failOpen: Counter<"cause">;
  events: Counter<"result">;
  stampsRemoved: Counter<"kind">;
  configInvalid: Gauge<"config">;
  unauthenticated: Counter<"why">;
}

export function createWebhookMetrics(): WebhookMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  return {
    registry,
    decisions: new Counter({
      name: "warmstart_webhook_decisions_total",
      help: "Admission decisions by role (leader, follower, restore, cold, pass) and reason",
      labelNames: ["role", "reason"],
      registers: [registry],
    }),
    latency: new Histogram({
      name: "warmstart_webhook_admission_duration_seconds",
      help: "Time to answer one AdmissionReview",
      labelNames: ["outcome"],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers: [registry],
    }),
    failOpen: new Counter({
      name: "warmstart_webhook_fail_open_total",
      help: "Pods admitted without a decision (their stamps still removed) because something went wrong",
      labelNames: ["cause"],
      registers: [registry],
    }),
    events: new Counter({
      name: "warmstart_webhook_events_total",
      help: "Kubernetes Events posted about admitted pods",
      labelNames: ["result"],
      registers: [registry],
    }),
    stampsRemoved: new Counter({
      name: "warmstart_webhook_stamps_removed_total",
      help: "warmstart.dev/* labels, annotations and gates a pod's author set, removed at admission",
      labelNames: ["kind"],
      registers: [registry],
    }),
    configInvalid: new Gauge({
      name: "warmstart_webhook_config_invalid",
      help: "1 while a configuration the webhook reads (e.g. the cache-env ConfigMap) is refused as invalid",
      labelNames: ["config"],
      registers: [registry],
    }),
    unauthenticated: new Counter({
      name: "warmstart_webhook_unauthenticated_requests_total",
      help: "Admission requests refused because the caller presented no trusted client certificate",
      labelNames: ["why"],
      registers: [registry],
    }),
  };
}
