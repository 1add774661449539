/** The agent's HTTP surface: /livez (the process runs), /healthz (the pod watch is up), /metrics. */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { Registry } from "prom-client";
import type { Logger } from "../common/log.js";

export interface HttpHandle {
  url: string;
  close(): Promise<void>;
}

export async function startHttp(o: {
  host: string;
  port: number;
  registry: Registry;
  health: () => { ready: boolean; [k: string]: unknown };
  log: Logger;
}): Promise<HttpHandle> {
  const server: Server = createServer((req, res) => {
    const path = new URL(req.url ?? "/", "http://agent").pathname;
    const send = (status: number, type: string, body: string): void => {
      res.writeHead(status, {
        "content-type": type,
        "content-length": Buffer.byteLength(body),
        "cache-control": "no-store",
      });
      res.end(req.method === "HEAD" ? undefined : body);
    };
    const json = (status: number, body: unknown): void =>
      send(status, "application/json; charset=utf-8", JSON.stringify(body));
    if (req.method !== "GET" && req.method !== "HEAD") return json(405, { error: "only GET" });
    switch (path) {
      case "/livez":
        return json(200, { live: true });
      case "/healthz":
      case "/readyz": {
        const h = o.health();
        return json(h.ready ? 200 : 503, h);
      }
      case "/metrics":
        o.registry.metrics().then(
          (body) => send(200, o.registry.contentType, body),
          (err: unknown) => {
            o.log.error({ err }, "metrics failed");
            json(500, { error: "internal error" });
          },
        );
        return;
      default:
        return json(404, { error: `no route for ${path}` });
    }
  });
  // Probes and scrapes are small; these only bound slow or stuck clients.
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
    throw new Error(`node agent cannot listen on ${o.host}:${o.port}: ${(err as Error).message}`, {
      cause: err,
    });
  });
  const addr = server.address() as AddressInfo;
  const host = addr.family === "IPv6" ? `[${addr.address}]` : addr.address;
  return {
    url: `http://${host === "0.0.0.0" ? "127.0.0.1" : host}:${addr.port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
