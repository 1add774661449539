import { Counter, Registry, collectDefaultMetrics } from "prom-client";

export interface ServerMetrics {
  registry: Registry;
  released: Counter;
  retired: Counter<"why">;
  evicted: Counter;
}

export function createServerMetrics(): ServerMetrics {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry });
  return {
    registry,
    released: new Counter({
      name: "warmstart_server_followers_released_total",
      help: "Gated followers released to restore",
      registers: [registry],
    }),
    retired: new Counter({
      name: "warmstart_server_elections_retired_total",
      help: "Elections retired, by cause",
      labelNames: ["why"],
      registers: [registry],
    }),
    evicted: new Counter({
      name: "warmstart_server_followers_evicted_total",
      help: "Followers evicted to be re-elected",
      registers: [registry],
    }),
  };
}
