/**
 * The reference control plane: plain node:http, a route table, one SQLite store. Cluster agents
 * register with a cluster token and then use short-lived queue credentials; operators use the
 * operator token. Bad input is answered with a 4xx and a JSON `{ error }`, never a crash.
 *
 * This file is the server: it wires the store, the routes (routes.ts), who may call what
 * (auth.ts), input checking (http-input.ts), long polls (long-poll.ts) and metrics (metrics.ts),
 * answers each call, serves TLS and shuts down.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { readFileSync, unwatchFile, watchFile } from "node:fs";
import type { AddressInfo } from "node:net";
import { parseConfig, type ControlPlaneConfig, type ControlPlaneConfigInput } from "./config.js";
import { authenticator } from "./auth.js";
import { ClusterTokens } from "./tokens.js";
import { ApiError } from "./errors.js";
import { parseJsonBody, validate } from "./http-input.js";
import { queueKey, Waiters } from "./long-poll.js";
import { createControlPlaneMetrics } from "./metrics.js";
import { Router, type HandlerContext } from "./router.js";
import { controlPlaneRoutes } from "./routes.js";
import { Store } from "./store.js";
import { createLogger, type Logger } from "../common/log.js";

export { CONTROL_PLANE_VERSION } from "./routes.js";

export interface ControlPlaneOptions extends ControlPlaneConfigInput {
  logger?: Logger;
}

export interface ControlPlane {
  url: string;
  port: number;
  close(): Promise<void>;
}

export async function startControlPlane(options: ControlPlaneOptions): Promise<ControlPlane> {
  const { logger, ...rest } = options;
  const config: ControlPlaneConfig = parseConfig(rest);
  const log = logger ?? createLogger("control-plane");

  const waiters = new Waiters();
  const clusterTokens = new ClusterTokens({
    fixed: config.clusterTokens,
    file: config.clusterTokenFile,
    reserved: [config.operatorToken],
    log,
  });
  const store = new Store({
    path: config.dbPath,
    onMessages: (clusterId, queue) => waiters.wake(queueKey(clusterId, queue)),
    onWarning: (msg, detail) => log.warn(detail, msg),
  });
  const shutdown = new AbortController();

  const { registry, httpRequests, httpDuration, registrations, delivered } = createControlPlaneMetrics(
    store,
    shutdown.signal,
  );
  const routes = controlPlaneRoutes({
    config,
    store,
    log,
    metrics: { registrations, delivered },
    waiters,
    shutdown: shutdown.signal,
  });
  const router = new Router(routes);
  const authenticate = authenticator({ operatorToken: config.operatorToken, clusterTokens, store });

  // --- request plumbing -----------------------------------------------------------------------

  function send(
    res: ServerResponse,
    status: number,
    body: unknown,
    headers: Record<string, string> = {},
  ): void {
    if (res.headersSent) return;
    const text = JSON.stringify(body);
    res.writeHead(status, {
      "content-type": "application/json; charset=utf-8",
      "content-length": Buffer.byteLength(text),
      "cache-control": "no-store",
      // While shutting down, answer and hang up so close() does not wait out keep-alive.
      ...(shutdown.signal.aborted ? { connection: "close" } : {}),
      ...headers,
    });
    res.end(text);
  }

  /** Answers one call; `meta.route` names the matched route template for metrics. */
  async function handle(req: IncomingMessage, res: ServerResponse, meta: { route: string }): Promise<number> {
    const url = new URL(req.url ?? "/", "http://control-plane");
    const matched = router.match(req.method ?? "GET", url.pathname);
    if (!matched.route) {
      if (matched.allowed.length > 0) {
        throw new ApiError(405, `${req.method} is not allowed on ${url.pathname}`, undefined, {
          allow: matched.allowed.join(", "),
        });
      }
      throw new ApiError(404, `no route for ${url.pathname}`);
    }
    const route = matched.route;
    meta.route = route.path;
    const params = route.params ? validate(route.params, matched.params, "path") : {};
    const credentialClusterId = authenticate(req, route, params as Record<string, string>);
    const query = route.query ? validate(route.query, Object.fromEntries(url.searchParams), "query") : {};
    const body = route.body ? await parseJsonBody(req, route.body, config.maxBodyBytes) : undefined;

    if (route.path === "/metrics") {
      const text = await registry.metrics();
      res.writeHead(200, { "content-type": registry.contentType });
      res.end(text);
      return 200;
    }

    const ac = new AbortController();
    res.on("close", () => {
      if (!res.writableFinished) ac.abort();
    });
    const ctx: HandlerContext = {
      params: params as Record<string, string>,
      query,
      body,
      credentialClusterId,
      signal: AbortSignal.any([ac.signal, shutdown.signal]),
    };
    const result = await route.handler(ctx);
    const status = route.status ?? 200;
    send(res, status, result);
    return status;
  }

  const onRequest = (req: IncomingMessage, res: ServerResponse): void => {
    const started = process.hrtime.bigint();
    const meta = { route: "unmatched" };
    handle(req, res, meta)
      .catch((err: unknown) => {
        if (err instanceof ApiError) {
          send(
            res,
            err.status,
            { error: err.message, ...(err.issues ? { issues: err.issues } : {}) },
            err.headers,
          );
          return err.status;
        }
        log.error({ err, method: req.method, url: req.url }, "request failed");
        send(res, 500, { error: "internal error; see the control plane log" });
        return 500;
      })
      .then((status) => {
        const method = req.method ?? "";
        httpRequests.inc({ method, route: meta.route, status: String(status) });
        httpDuration.observe({ method, route: meta.route }, Number(process.hrtime.bigint() - started) / 1e9);
      })
      .catch((err: unknown) => log.error({ err }, "could not record request metrics"));
  };
  const tls =
    config.tlsCertFile && config.tlsKeyFile
      ? { cert: config.tlsCertFile, key: config.tlsKeyFile }
      : undefined;
  const readTls = (): { cert: Buffer; key: Buffer } => ({
    cert: readFileSync(tls!.cert),
    key: readFileSync(tls!.key),
  });
  let server: Server;
  if (tls) {
    let initial: { cert: Buffer; key: Buffer };
    try {
      initial = readTls();
    } catch (err) {
      store.close();
      throw new Error(`control plane cannot read its TLS certificate: ${(err as Error).message}`, {
        cause: err,
      });
    }
    const https = createHttpsServer({ ...initial, minVersion: "TLSv1.2" }, onRequest);
    // A rotated Secret swaps the files under the mount: pick the new pair up without a restart.
    for (const f of [tls.cert, tls.key]) {
      watchFile(f, { interval: 2000 }, () => {
        try {
          https.setSecureContext({ ...readTls(), minVersion: "TLSv1.2" });
          log.info({ file: f }, "serving certificate reloaded");
        } catch (err) {
          log.warn({ err, file: f }, "could not reload the serving certificate; keeping the old one");
        }
      });
    }
    server = https;
  } else {
    server = createServer(onRequest);
  }
  // Long polls answer within 20 s; these bound slow or stuck clients, not slow handlers.
  server.headersTimeout = 10_000;
  server.requestTimeout = 30_000;
  server.keepAliveTimeout = 5_000;
  server.on("clientError", (err, socket) => {
    log.debug({ err }, "client error");
    if (socket.writable) socket.end("HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n");
    else socket.destroy();
  });

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(config.port, config.host, () => {
      server.off("error", reject);
      resolve();
    });
  }).catch((err: unknown) => {
    store.close();
    if (tls) for (const f of [tls.cert, tls.key]) unwatchFile(f);
    throw new Error(
      `control plane cannot listen on ${config.host}:${config.port}: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  });
  const addr = server.address() as AddressInfo;
  const host = addr.family === "IPv6" ? `[${addr.address}]` : addr.address;
  const url = `${tls ? "https" : "http"}://${host}:${addr.port}`;
  log.info(
    {
      url,
      db: config.dbPath,
      credentialTtlSeconds: config.credentialTtlSeconds,
      allowedNamespaces: config.allowedNamespaces,
    },
    "control plane listening",
  );

  let closing: Promise<void> | undefined;
  return {
    url,
    port: addr.port,
    close(): Promise<void> {
      closing ??= (async () => {
        shutdown.abort();
        waiters.wakeAll();
        if (tls) for (const f of [tls.cert, tls.key]) unwatchFile(f);
        const closed = new Promise<void>((resolve) => server.close(() => resolve()));
        server.closeIdleConnections();
        // In-flight calls are short (long polls were just woken); do not wait on a stuck client.
        const timer = setTimeout(() => server.closeAllConnections(), 5_000);
        await closed;
        clearTimeout(timer);
        store.close();
        log.info("control plane stopped");
      })();
      return closing;
    },
  };
}
