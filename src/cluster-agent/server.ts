/**
 * The agent's HTTP surface: /version (startup probe), /livez (always 200 while the process runs),
 * /healthz (readiness: 503 with the reason until registered with GPUs), /metrics.
 */
import { createServer, type Server } from "node:http";
import { listen } from "../common/http.js";
import type { Registry } from "prom-client";
import type { Logger } from "../common/log.js";

export interface Health {
  ready: boolean;
  reason: string;
  [k: string]: unknown;
}

export interface HttpOptions {
  host: string;
  port: number;
  version: string;
  health: () => Health;
  registry: Registry;
  log: Logger;
}

export interface HttpHandle {
  url: string;
  close(): Promise<void>;
}

export async function startHttp(o: HttpOptions): Promise<HttpHandle> {
  const json = (status: number, body: unknown): [number, string, string] => [
    status,
    "application/json; charset=utf-8",
    JSON.stringify(body),
  ];
  const server: Server = createServer((req, res) => {
    const path = new URL(req.url ?? "/", "http://agent").pathname;
    const answer = async (): Promise<[number, string, string]> => {
      if (req.method !== "GET" && req.method !== "HEAD") return json(405, { error: "only GET" });
      switch (path) {
        case "/version":
          return json(200, { version: o.version });
        case "/livez":
          return json(200, { live: true });
        case "/healthz": {
          const h = o.health();
          return json(h.ready ? 200 : 503, h);
        }
        case "/metrics":
          return [200, o.registry.contentType, await o.registry.metrics()];
        default:
          return json(404, { error: `no route for ${path}` });
      }
    };
    answer()
      .catch((err: unknown): [number, string, string] => {
        o.log.error({ err, path }, "HTTP handler failed");
        return json(500, { error: "internal error" });
      })
      .then(([status, type, body]) => {
        res.writeHead(status, {
          "content-type": type,
          "content-length": Buffer.byteLength(body),
          "cache-control": "no-store",
        });
        res.end(req.method === "HEAD" ? undefined : body);
      })
      .catch((err: unknown) => o.log.debug({ err }, "could not answer"));
  });
  return listen(server, { host: o.host, port: o.port, role: "cluster agent" });
}
