/** The agent's HTTP surface: /livez (the process runs), /healthz (the pod watch is up), /metrics. */
import { createServer, type Server } from "node:http";
import { listen } from "../common/http.js";
import type { Registry } from "prom-client";
import type { Logger } from "../common/log.js";

export interface HttpHandle {
  url: string;
  close(): Promise<void>;
}

/** A client on loopback: only this pod's containers (or, with the host network, the node's processes). */
export function isLoopback(address: string | undefined): boolean {
  if (!address) return false;
  const v4 = address.startsWith("::ffff:") ? address.slice(7) : address;
  return v4.startsWith("127.") || address === "::1";
}

export async function startHttp(o: {
  host: string;
  port: number;
  /** Serve /metrics to every client; otherwise loopback clients only (the probes stay open). */
  metricsRemote?: boolean;
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
        if (!o.metricsRemote && !isLoopback(req.socket.remoteAddress))
          return json(403, { error: "metrics are served on loopback only (--metrics-remote)" });
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
  return listen(server, { host: o.host, port: o.port, role: "node agent" });
}
