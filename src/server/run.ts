import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createHash, timingSafeEqual } from "node:crypto";
import { readFile } from "node:fs/promises";
import { isIP } from "node:net";
import type * as k8s from "@kubernetes/client-node";
import type { Registry } from "prom-client";
import { createLogger, type Logger } from "../common/log.js";
import { SYSTEM_NAMESPACE, loadKubeConfig } from "../common/kube.js";
import { ReleaseController } from "./release-controller/controller.js";
import { createServerMetrics } from "./metrics.js";
import { buildSnapshot, published, type Snapshot } from "./dashboard/views.js";
import { DASHBOARD_CSP, DASHBOARD_HTML } from "./dashboard/dashboard.js";
import { listen, type Listening } from "../common/http.js";
import { serverOptions } from "./config.js";

export interface ServerConfig {
  host: string;
  port: number;
  systemNamespace: string;
  /** Bearer token for the API, the dashboard's data and the metrics; required off loopback. */
  token?: string | undefined;
  leaderGraceMs?: number;
  recheckMs?: number;
  /** How often the controller re-lists what it watches (default 60 s). */
  resyncMs?: number;
}

export interface RunningServer {
  url: string;
  stop(): Promise<void>;
}

/** Whether `host` only accepts connections from this machine. */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, "").toLowerCase();
  if (h === "localhost") return true;
  if (isIP(h) === 4) return h.startsWith("127.");
  return h === "::1" || h === "0:0:0:0:0:0:0:1";
}

/** Off loopback the dashboard and API answer only with a token: refuse to start without one. */
export function checkExposure(cfg: Pick<ServerConfig, "host" | "token">): void {
  if (!isLoopback(cfg.host) && !cfg.token) {
    throw new Error(
      `refusing to serve the dashboard and API on ${cfg.host} without a token: set --token-file, --token or WARMSTART_SERVER_TOKEN (or listen on 127.0.0.1)`,
    );
  }
}

/** On every answer: no sniffing, no framing, no referrer. */
const BASE_HEADERS = {
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
  "cross-origin-resource-policy": "same-origin",
} as const;
/** On data answers: a policy that lets nothing render, and never stored by a browser or a proxy. */
const API_HEADERS = {
  ...BASE_HEADERS,
  "content-security-policy": "default-src 'none'; frame-ancestors 'none'",
  "cache-control": "no-store",
} as const;

export interface ApiOptions {
  /** The snapshot from the controller's caches; undefined while they have not listed yet. */
  snapshot: () => Snapshot | undefined;
  registry: Registry;
  log: Logger;
  token?: string | undefined;
  /** The address it listens on: on loopback, requests for any other host name are refused. */
  host: string;
}

/**
 * The HTTP side of `warmstart server`: the dashboard page (no data in it), /api/snapshot and
 * /metrics (behind the token when one is set), and the probes. Every answer comes from memory:
 * no request reaches the API server.
 */
export function apiServer(o: ApiOptions): Server {
  const digest = (s: string): Buffer => createHash("sha256").update(s).digest();
  const tokenDigest = o.token ? digest(o.token) : undefined;
  const loopbackOnly = isLoopback(o.host);

  const send = (
    res: ServerResponse,
    status: number,
    type: string,
    body: string,
    headers: Record<string, string> = API_HEADERS,
  ): void => {
    res.writeHead(status, { ...headers, "content-type": type, "content-length": Buffer.byteLength(body) });
    res.end(res.req.method === "HEAD" ? undefined : body);
  };
  const json = (
    res: ServerResponse,
    status: number,
    body: unknown,
    extra: Record<string, string> = {},
  ): void =>
    send(res, status, "application/json; charset=utf-8", JSON.stringify(body), { ...API_HEADERS, ...extra });

  const authorized = (req: IncomingMessage): boolean => {
    if (!tokenDigest) return true;
    const m = /^Bearer\s+(\S+)\s*$/i.exec(req.headers.authorization ?? "");
    return m?.[1] !== undefined && timingSafeEqual(digest(m[1]), tokenDigest);
  };

  /**
   * A page on another site can make the browser send requests to 127.0.0.1 under its own host
   * name (DNS rebinding); on loopback, only this machine's names are answered.
   */
  const hostAllowed = (req: IncomingMessage): boolean => {
    if (!loopbackOnly) return true;
    const raw = req.headers.host ?? "";
    const name = raw.startsWith("[") ? raw.slice(0, raw.indexOf("]") + 1) : raw.split(":")[0]!;
    return isLoopback(name);
  };

  const route = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const path = (req.url ?? "/").split("?")[0];
    if (req.method !== "GET" && req.method !== "HEAD")
      return json(res, 405, { error: "use GET" }, { allow: "GET, HEAD" });
    if (path === "/healthz" || path === "/livez") return json(res, 200, { ok: true });
    if (!hostAllowed(req)) return json(res, 403, { error: "unknown host name for a loopback server" });
    if (path === "/")
      return send(res, 200, "text/html; charset=utf-8", DASHBOARD_HTML, {
        ...BASE_HEADERS,
        "content-security-policy": DASHBOARD_CSP,
        "cache-control": "no-cache",
      });
    if (path !== "/metrics" && path !== "/api/snapshot") return json(res, 404, { error: `no route ${path}` });
    if (!authorized(req))
      return json(
        res,
        401,
        { error: "a bearer token is needed" },
        { "www-authenticate": 'Bearer realm="warmstart"' },
      );
    if (path === "/metrics") return send(res, 200, o.registry.contentType, await o.registry.metrics());
    const s = o.snapshot();
    if (!s)
      return json(res, 503, { error: "warming up: the caches have not listed yet" }, { "retry-after": "1" });
    return json(res, 200, published(s));
  };

  return createServer((req, res) => {
    route(req, res).catch((err: unknown) => {
      o.log.warn({ err }, "request failed");
      if (!res.headersSent) json(res, 500, { error: "internal error" });
    });
  });
}

/** `warmstart server`: the release controller, the operators' API and the dashboard. */
export async function runServer(
  cfg: ServerConfig,
  opts: { kubeConfig?: k8s.KubeConfig; log?: Logger } = {},
): Promise<RunningServer> {
  checkExposure(cfg);
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
    resyncMs: cfg.resyncMs,
  });
  controller.start();

  const http = apiServer({
    host: cfg.host,
    token: cfg.token,
    registry: metrics.registry,
    log,
    snapshot: () => {
      const c = controller.cached();
      return c && buildSnapshot(c.caches, c.leases, c.pods, c.stores);
    },
  });
  let listening: Listening;
  try {
    listening = await listen(http, { host: cfg.host, port: cfg.port, role: "server" });
  } catch (err) {
    // Nothing serves: the controller it started must not go on watching and reconciling.
    await controller.stop();
    throw err;
  }
  const url = listening.url;
  log.info(
    { url, token: cfg.token ? "required" : "none (loopback)" },
    "server serving (release controller, API, dashboard)",
  );
  return {
    url,
    stop: async () => {
      await controller.stop();
      await listening.close();
    },
  };
}

/** `host`, `port`, `token`, `tokenFile` as a flag or variable would write them. */
export type ServerFlags = Parameters<typeof serverOptions.load>[0];

/** Flags over environment: listen on loopback unless told otherwise; a token from a flag, env or file. */
export async function defaultServerConfig(
  flags: ServerFlags,
  env: NodeJS.ProcessEnv = process.env,
): Promise<ServerConfig> {
  const { host, port, tokenFile, ...given } = serverOptions.load(flags, env);
  let token = given.token || undefined;
  if (!token && tokenFile) {
    token = (await readFile(tokenFile, "utf8")).trim();
    if (!token) throw new Error(`token file ${tokenFile} is empty`);
  }
  if (token !== undefined && token.length < 16)
    throw new Error("the server token must be at least 16 characters");
  const cfg: ServerConfig = { host, port, systemNamespace: SYSTEM_NAMESPACE, token };
  checkExposure(cfg);
  return cfg;
}
