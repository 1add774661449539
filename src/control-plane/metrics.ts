/**
 * The control plane's Prometheus metrics: calls by route and status, registrations, deliveries,
 * and gauges read from the store when scraped (queue depth per cluster, requests by status).
 */
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import { RequestStatus } from "./api.js";
import type { Store } from "./store.js";

export interface ControlPlaneMetrics {
  registry: Registry;
  httpRequests: Counter<"method" | "route" | "status">;
  httpDuration: Histogram<"method" | "route">;
  registrations: Counter<"result">;
  delivered: Counter<"queue" | "redelivery">;
}

/** The gauges read nothing once `shutdown` is aborted (the store may be closed by then). */
export function createControlPlaneMetrics(store: Store, shutdown: AbortSignal): ControlPlaneMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, prefix: "warmstart_control_plane_" });
  const httpRequests = new Counter({
    name: "warmstart_control_plane_http_requests_total",
    help: "HTTP requests by route template, method and status",
    labelNames: ["method", "route", "status"] as const,
    registers: [registry],
  });
  const httpDuration = new Histogram({
    name: "warmstart_control_plane_http_request_duration_seconds",
    help: "HTTP request duration by route template (long polls included)",
    labelNames: ["method", "route"] as const,
    buckets: [0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 20],
    registers: [registry],
  });
  const registrations = new Counter({
    name: "warmstart_control_plane_registrations_total",
    help: "Cluster registrations, by whether the cluster was new",
    labelNames: ["result"] as const,
    registers: [registry],
  });
  const delivered = new Counter({
    name: "warmstart_control_plane_messages_delivered_total",
    help: "Queue messages delivered, by queue and whether it was a redelivery",
    labelNames: ["queue", "redelivery"] as const,
    registers: [registry],
  });
  new Gauge({
    name: "warmstart_control_plane_queue_depth",
    help: "Messages on each cluster queue, visible or in flight (received, not yet acknowledged)",
    labelNames: ["cluster", "queue", "state"] as const,
    registers: [registry],
    collect() {
      this.reset();
      if (shutdown.aborted) return;
      for (const d of store.queueDepths()) {
        this.set({ cluster: d.clusterId, queue: d.queue, state: "visible" }, d.visible);
        this.set({ cluster: d.clusterId, queue: d.queue, state: "inflight" }, d.inflight);
      }
    },
  });
  new Gauge({
    name: "warmstart_control_plane_requests",
    help: "Deployment requests by status",
    labelNames: ["status"] as const,
    registers: [registry],
    collect() {
      this.reset();
      if (shutdown.aborted) return;
      for (const s of RequestStatus.options) this.set({ status: s }, 0);
      for (const c of store.requestCounts()) this.set({ status: c.status }, c.n);
    },
  });
  return { registry, httpRequests, httpDuration, registrations, delivered };
}
