/**
 * The agent's HTTP surface: /version (startup probe), /livez (always 200 while the process runs),
 * /healthz (readiness: 503 with the reason until registered with GPUs), /metrics.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
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
  // Probes are tiny; these only bound slow or stuck clients.
  server.headersTimeout = 10_000;
  server.requestTimeout = 10_000;
  server.keepAliveTimeout = 5_000;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(o.port, o.host, () => {
      server.off("error", reject);
      resolve();
    });
  }).catch((err: unknown) => {
    throw new Error(`cluster agent cannot listen on ${o.host}:${o.port}: ${(err as Error).message}`, {
      cause: err,
    });
  });
  const addr = server.address() as AddressInfo;
  const host =
    addr.family === "IPv6" ? `[${addr.address}]` : addr.address === "0.0.0.0" ? "127.0.0.1" : addr.address;
  return {
    url: `http://${host}:${addr.port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeIdleConnections();
      }),
  };
}
