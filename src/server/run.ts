import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import * as k8s from "@kubernetes/client-node";
import { createLogger, type Logger } from "../common/log.js";
import { SYSTEM_NAMESPACE, loadKubeConfig } from "../common/kube.js";
import { ReleaseController } from "./controller.js";
import { createServerMetrics } from "./metrics.js";
import { fetchSnapshot } from "./views.js";
import { DASHBOARD_HTML } from "./dashboard.js";
import { listen } from "../common/http.js";

export interface ServerConfig {
  host: string;
  port: number;
  systemNamespace: string;
  leaderGraceMs?: number;
  recheckMs?: number;
}

export interface RunningServer {
  url: string;
  stop(): Promise<void>;
}

/** `warmstart server`: the release controller, the operators' API and the dashboard. */
export async function runServer(
  cfg: ServerConfig,
  opts: { kubeConfig?: k8s.KubeConfig; log?: Logger } = {},
): Promise<RunningServer> {
  const log = opts.log ?? createLogger("server");
  const kc = opts.kubeConfig ?? loadKubeConfig();
  const metrics = createServerMetrics();
  const controller = new ReleaseController({
    kc,
    systemNamespace: cfg.systemNamespace,
    log,
    metrics,
    leaderGraceMs: cfg.leaderGraceMs,
    recheckMs: cfg.recheckMs,
  });
  controller.start();

  const send = (res: ServerResponse, status: number, type: string, body: string): void => {
    res.writeHead(status, { "content-type": type, "content-length": Buffer.byteLength(body) });
    res.end(body);
  };
  const route = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = (req.url ?? "/").split("?")[0];
    if (req.method !== "GET") return send(res, 405, "application/json", '{"error":"use GET"}');
    switch (path) {
      case "/":
        return send(res, 200, "text/html; charset=utf-8", DASHBOARD_HTML);
      case "/healthz":
      case "/livez":
        return send(res, 200, "application/json", '{"ok":true}');
      case "/metrics":
        return send(res, 200, metrics.registry.contentType, await metrics.registry.metrics());
      case "/api/snapshot":
        return send(
          res,
          200,
          "application/json",
          JSON.stringify(await fetchSnapshot(kc, cfg.systemNamespace)),
        );
      default:
        return send(res, 404, "application/json", JSON.stringify({ error: `no route ${path}` }));
    }
  };
  const http = createServer((req, res) => {
    route(req, res).catch((err: unknown) => {
      log.warn({ err }, "request failed");
      if (!res.headersSent)
        send(res, 502, "application/json", JSON.stringify({ error: (err as Error).message }));
    });
  });
  const listening = await listen(http, { host: cfg.host, port: cfg.port, role: "server" });
  const url = listening.url;
  log.info({ url }, "server serving (release controller, API, dashboard)");
  return {
    url,
    stop: async () => {
      await controller.stop();
      await listening.close();
    },
  };
}

export function defaultServerConfig(flags: { host?: string; port?: string }): ServerConfig {
  const port = Number(flags.port ?? process.env.WARMSTART_SERVER_PORT ?? 8080);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`invalid port: ${flags.port}`);
  return { host: flags.host ?? "0.0.0.0", port, systemNamespace: SYSTEM_NAMESPACE };
}
