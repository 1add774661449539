/**
 * The reference control plane: plain node:http, a route table, one SQLite store. Cluster agents
 * register with a cluster token and then use short-lived queue credentials; operators use the
 * operator token. Bad input is answered with a 4xx and a JSON `{ error }`, never a crash.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import { createHash, timingSafeEqual } from "node:crypto";
import { readFileSync, unwatchFile, watchFile } from "node:fs";
import type { AddressInfo } from "node:net";
import { z } from "zod";
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import {
  AckRequest,
  AckResponse,
  ClusterId,
  ClusterList,
  ClusterView,
  HealthResponse,
  HeartbeatRequest,
  HeartbeatResponse,
  ReceiveRequest,
  ReceiveResponse,
  RegisterRequest,
  RegisterResponse,
  ReleaseRequest,
  ReleaseResponse,
  RenewResponse,
  RequestId,
  RequestList,
  RequestStatus,
  RequestView,
  SetInstructionRequest,
  StatusReport,
  SubmitRequest,
  SubmitResponse,
} from "./api.js";
import {
  namespaceAllowed,
  parseConfig,
  renewBeforeSeconds,
  type ControlPlaneConfig,
  type ControlPlaneConfigInput,
} from "./config.js";
import { ClusterTokens } from "./tokens.js";
import { ApiError } from "./errors.js";
import { Router, openApiDocument, type HandlerContext, type Route, type RouteAuth } from "./router.js";
import { Store } from "./store.js";
import { createLogger, type Logger } from "../common/log.js";

export const CONTROL_PLANE_VERSION = "0.1.0";

export interface ControlPlaneOptions extends ControlPlaneConfigInput {
  logger?: Logger;
}

export interface ControlPlane {
  url: string;
  port: number;
  close(): Promise<void>;
}

/** Long-poll waiters per cluster queue, woken when a message becomes visible there. */
class Waiters {
  private readonly byKey = new Map<string, Set<() => void>>();

  wait(key: string, ms: number, signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      const set = this.byKey.get(key) ?? new Set<() => void>();
      this.byKey.set(key, set);
      const done = (): void => {
        clearTimeout(timer);
        signal.removeEventListener("abort", done);
        set.delete(done);
        if (set.size === 0 && this.byKey.get(key) === set) this.byKey.delete(key);
        resolve();
      };
      const timer = setTimeout(done, Math.max(0, ms));
      signal.addEventListener("abort", done, { once: true });
      set.add(done);
    });
  }

  wake(key: string): void {
    for (const fn of [...(this.byKey.get(key) ?? [])]) fn();
  }

  wakeAll(): void {
    for (const key of [...this.byKey.keys()]) this.wake(key);
  }
}

const queueKey = (clusterId: string, queue: string): string => `${clusterId}\u0000${queue}`;

const sha256 = (s: string): Buffer => createHash("sha256").update(s).digest();

/** Constant-time membership test: compares digests so token length leaks nothing either. */
function tokenIn(token: string, candidates: Buffer[]): boolean {
  const d = sha256(token);
  let found = false;
  for (const c of candidates) found = timingSafeEqual(d, c) || found;
  return found;
}

const AUTH_NAMES: Record<Exclude<RouteAuth, "none">, string> = {
  cluster: "cluster registration token",
  queue: "queue credential",
  operator: "operator token",
};

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
  const operatorDigest = [sha256(config.operatorToken)];
  const shutdown = new AbortController();

  // --- metrics --------------------------------------------------------------------------------
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
      if (shutdown.signal.aborted) return;
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
      if (shutdown.signal.aborted) return;
      for (const s of RequestStatus.options) this.set({ status: s }, 0);
      for (const c of store.requestCounts()) this.set({ status: c.status }, c.n);
    },
  });

  // --- routes ---------------------------------------------------------------------------------
  const clusterParams = z.object({ id: ClusterId });
  const requestParams = z.object({ requestId: RequestId });

  const issue = (clusterId: string): { token: string; expiresAt: string } => {
    const c = store.issueCredential(clusterId, config.credentialTtlSeconds);
    return { token: c.token, expiresAt: new Date(c.expiresAt).toISOString() };
  };

  const routes: Route[] = [
    {
      method: "GET",
      path: "/healthz",
      operationId: "health",
      summary: "Liveness and readiness",
      auth: "none",
      response: HealthResponse,
      handler: () => ({ status: "ok" }),
    },
    {
      method: "GET",
      path: "/metrics",
      operationId: "metrics",
      summary: "Prometheus metrics",
      auth: "none",
      response: { mediaType: "text/plain" },
      handler: () => undefined, // answered by the server itself (text, not JSON)
    },
    {
      method: "GET",
      path: "/openapi.json",
      operationId: "openapi",
      summary: "This document",
      auth: "none",
      response: { mediaType: "application/json" },
      handler: () => openapi,
    },
    {
      method: "POST",
      path: "/v1/clusters/register",
      operationId: "register",
      summary: "Register or re-register a cluster's GPU inventory; returns queue credentials",
      auth: "cluster",
      body: RegisterRequest,
      response: RegisterResponse,
      handler: ({ body, credentialClusterId }) => {
        const b = body as z.output<typeof RegisterRequest>;
        // A cluster token registers its own cluster only: another's would hand over its queue.
        if (b.clusterId !== credentialClusterId) {
          throw new ApiError(
            403,
            `this cluster token was issued to cluster ${credentialClusterId}, not ${b.clusterId}`,
          );
        }
        const { created, token, expiresAt } = store.registerWithCredential(b, config.credentialTtlSeconds);
        registrations.inc({ result: created ? "created" : "updated" });
        log.info(
          {
            clusterId: b.clusterId,
            created,
            inventory: b.inventory,
            namespaces: b.namespaces,
            agentVersion: b.agentVersion,
          },
          "cluster registered",
        );
        return {
          clusterId: b.clusterId,
          credentials: { token, expiresAt: new Date(expiresAt).toISOString() },
          queues: { deploy: store.deployQueues(b.clusterId), termination: true },
          heartbeatIntervalSeconds: config.heartbeatIntervalSeconds,
          renewBeforeSeconds: renewBeforeSeconds(config.credentialTtlSeconds),
        };
      },
    },
    {
      method: "POST",
      path: "/v1/clusters/{id}/credentials/renew",
      operationId: "renew",
      summary: "New queue credentials; the current ones keep working until they expire",
      auth: "queue",
      params: clusterParams,
      response: RenewResponse,
      handler: ({ params }) => {
        const id = params.id ?? "";
        return {
          clusterId: id,
          credentials: issue(id),
          renewBeforeSeconds: renewBeforeSeconds(config.credentialTtlSeconds),
        };
      },
    },
    {
      method: "POST",
      path: "/v1/clusters/{id}/heartbeat",
      operationId: "heartbeat",
      summary: "Report inventory and readiness; answers with the operator's instruction",
      auth: "queue",
      params: clusterParams,
      body: HeartbeatRequest,
      response: HeartbeatResponse,
      handler: ({ params, body }) => ({
        instruction: store.heartbeat(params.id ?? "", body as z.output<typeof HeartbeatRequest>),
      }),
    },
    {
      method: "POST",
      path: "/v1/clusters/{id}/queues/receive",
      operationId: "receive",
      summary: "Receive up to maxMessages, long-polling up to waitSeconds",
      auth: "queue",
      params: clusterParams,
      body: ReceiveRequest,
      response: ReceiveResponse,
      handler: async ({ params, body, signal }) => {
        const id = params.id ?? "";
        const b = body as z.output<typeof ReceiveRequest>;
        const vt = b.visibilityTimeoutSeconds ?? config.visibilityTimeoutSeconds;
        const deadline = Date.now() + b.waitSeconds * 1000;
        for (;;) {
          if (shutdown.signal.aborted) return { messages: [] };
          const messages = store.receive(id, b.queue, {
            gpuTypes: b.gpuTypes,
            maxMessages: b.maxMessages,
            visibilityTimeoutSeconds: vt,
          });
          for (const m of messages) delivered.inc({ queue: b.queue, redelivery: String(m.receiveCount > 1) });
          const left = deadline - Date.now();
          if (messages.length > 0 || left <= 0 || signal.aborted) return { messages };
          // Wake on a new message, on a timed-out delivery becoming visible, or at the deadline.
          const next = store.nextVisibleAt(id, b.queue);
          await waiters.wait(
            queueKey(id, b.queue),
            Math.min(left, next === undefined ? left : next - Date.now()),
            signal,
          );
        }
      },
    },
    {
      method: "POST",
      path: "/v1/clusters/{id}/queues/ack",
      operationId: "ack",
      summary: "Acknowledge (delete) received messages; stale handles are reported per handle",
      auth: "queue",
      params: clusterParams,
      body: AckRequest,
      response: AckResponse,
      handler: ({ params, body }) =>
        store.ack(params.id ?? "", (body as z.output<typeof AckRequest>).receiptHandles),
    },
    {
      method: "POST",
      path: "/v1/clusters/{id}/queues/release",
      operationId: "release",
      summary: "Make a received message visible again now (or after delaySeconds)",
      auth: "queue",
      params: clusterParams,
      body: ReleaseRequest,
      response: ReleaseResponse,
      handler: ({ params, body }) => {
        const b = body as z.output<typeof ReleaseRequest>;
        return store.release(params.id ?? "", b.receiptHandle, b.delaySeconds)
          ? { released: true }
          : { released: false, reason: "stale or unknown receipt handle" };
      },
    },
    {
      method: "POST",
      path: "/v1/requests/{requestId}/status",
      operationId: "reportStatus",
      summary: "Report a request's phase and instances (by the cluster it is assigned to)",
      auth: "queue",
      params: requestParams,
      body: StatusReport,
      response: RequestView,
      handler: ({ params, body, credentialClusterId }) =>
        store.reportStatus(
          credentialClusterId ?? "",
          params.requestId ?? "",
          body as z.output<typeof StatusReport>,
        ),
    },
    {
      method: "POST",
      path: "/v1/clusters/{id}/instruction",
      operationId: "setInstruction",
      summary: "Set the instruction a cluster gets on its next heartbeat",
      auth: "operator",
      params: clusterParams,
      body: SetInstructionRequest,
      response: ClusterView,
      handler: ({ params, body }) =>
        store.setInstruction(params.id ?? "", (body as z.output<typeof SetInstructionRequest>).instruction),
    },
    {
      method: "GET",
      path: "/v1/clusters",
      operationId: "listClusters",
      summary: "Registered clusters with GPU capacity, readiness and instruction",
      auth: "operator",
      response: ClusterList,
      handler: () => ({ clusters: store.listClusters() }),
    },
    {
      method: "POST",
      path: "/v1/requests",
      operationId: "submit",
      summary: "Submit a deployment request",
      auth: "operator",
      body: SubmitRequest,
      response: SubmitResponse,
      status: 201,
      handler: ({ body }) => {
        const b = body as z.output<typeof SubmitRequest>;
        if (!namespaceAllowed(config.allowedNamespaces, b.namespace)) {
          throw new ApiError(
            403,
            `namespace ${b.namespace} is not one deployment requests may target (allowed: ${config.allowedNamespaces.join(", ")})`,
          );
        }
        const r = store.submit(b);
        log.info(
          { requestId: r.id, name: r.name, namespace: r.namespace, status: r.status },
          "request submitted",
        );
        return { id: r.id, status: r.status };
      },
    },
    {
      method: "GET",
      path: "/v1/requests",
      operationId: "listRequests",
      summary: "Deployment requests with status and instances",
      auth: "operator",
      query: z.object({ status: RequestStatus.optional() }),
      response: RequestList,
      handler: ({ query }) => ({ requests: store.listRequests(query.status as RequestStatus | undefined) }),
    },
    {
      method: "GET",
      path: "/v1/requests/{requestId}",
      operationId: "getRequest",
      summary: "One deployment request",
      auth: "operator",
      params: requestParams,
      response: RequestView,
      handler: ({ params }) => store.getRequest(params.requestId ?? ""),
    },
    {
      method: "DELETE",
      path: "/v1/requests/{requestId}",
      operationId: "terminate",
      summary: "Terminate a request: queues a termination message to the cluster that has it",
      auth: "operator",
      params: requestParams,
      response: SubmitResponse,
      status: 202,
      handler: ({ params }) => {
        const r = store.terminate(params.requestId ?? "");
        log.info({ requestId: r.id, status: r.status }, "request terminated");
        return { id: r.id, status: r.status };
      },
    },
  ];
  const openapi = openApiDocument(routes, {
    title: "Warmstart control plane",
    version: CONTROL_PLANE_VERSION,
  });
  const router = new Router(routes);

  // --- request plumbing -----------------------------------------------------------------------

  function authenticate(
    req: IncomingMessage,
    route: Route,
    params: Record<string, string>,
  ): string | undefined {
    if (route.auth === "none") return undefined;
    const header = req.headers.authorization ?? "";
    const m = /^Bearer\s+(\S+)\s*$/i.exec(header);
    const challenge = { "www-authenticate": 'Bearer realm="warmstart"' };
    if (!m?.[1])
      throw new ApiError(401, "missing bearer token (Authorization: Bearer <token>)", undefined, challenge);
    const token = m[1];
    const need = route.auth;
    let kind: Exclude<RouteAuth, "none">;
    let clusterId: string | undefined;
    const isOperator = tokenIn(token, operatorDigest);
    const tokenCluster = isOperator ? undefined : clusterTokens.clusterOf(token);
    if (isOperator) kind = "operator";
    else if (tokenCluster !== undefined) {
      kind = "cluster";
      clusterId = tokenCluster;
    } else {
      const cred = store.identifyCredential(token);
      if (!cred) throw new ApiError(401, "unknown token", undefined, challenge);
      if (cred.kind === "expired") {
        throw new ApiError(
          401,
          `queue credential expired at ${new Date(cred.expiresAt).toISOString()}; renew earlier or register again`,
          undefined,
          challenge,
        );
      }
      kind = "queue";
      clusterId = cred.clusterId;
    }
    if (kind !== need) {
      throw new ApiError(403, `this call needs a ${AUTH_NAMES[need]}, not a ${AUTH_NAMES[kind]}`);
    }
    if (kind === "queue" && params.id !== undefined && params.id !== clusterId) {
      throw new ApiError(403, `this credential was issued to cluster ${clusterId}, not ${params.id}`);
    }
    return clusterId;
  }

  /** Reads the body up to the cap; past it, drains (so the caller reads the answer) and refuses. */
  function readBody(req: IncomingMessage): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      const chunks: Buffer[] = [];
      let size = 0;
      let tooLarge = false;
      const declared = Number(req.headers["content-length"] ?? 0);
      if (declared > config.maxBodyBytes * 16) {
        reject(
          new ApiError(
            413,
            `request body of ${declared} bytes is over the ${config.maxBodyBytes}-byte limit`,
          ),
        );
        return;
      }
      const over = (): ApiError =>
        new ApiError(413, `request body is over the ${config.maxBodyBytes}-byte limit`);
      req.on("data", (chunk: Buffer) => {
        size += chunk.length;
        if (size > config.maxBodyBytes) tooLarge = true;
        else chunks.push(chunk);
        // Far past the cap without a declared length: stop reading and hang up.
        if (size > config.maxBodyBytes * 16) {
          reject(over());
          req.destroy();
        }
      });
      req.on("end", () => (tooLarge ? reject(over()) : resolve(Buffer.concat(chunks))));
      req.on("close", () => {
        if (!req.complete) reject(new ApiError(400, "request body was cut short"));
      });
      req.on("error", reject);
    });
  }

  function validate<T>(schema: z.ZodType<T>, value: unknown, what: string): T {
    const r = schema.safeParse(value);
    if (r.success) return r.data;
    const issues = r.error.issues.map((i) => ({ path: i.path.map(String).join("."), message: i.message }));
    const summary = issues.map((i) => (i.path ? `${i.path}: ${i.message}` : i.message)).join("; ");
    throw new ApiError(400, `invalid ${what}: ${summary}`, issues);
  }

  async function parseJsonBody(req: IncomingMessage, schema: z.ZodType): Promise<unknown> {
    const raw = await readBody(req);
    const type = (req.headers["content-type"] ?? "").split(";")[0]?.trim().toLowerCase() ?? "";
    if (raw.length > 0 && type !== "" && type !== "application/json" && !type.endsWith("+json")) {
      throw new ApiError(415, `request body must be application/json, not ${type}`);
    }
    let value: unknown = {};
    if (raw.length > 0) {
      try {
        value = JSON.parse(raw.toString("utf8"));
      } catch (err) {
        throw new ApiError(400, `request body is not valid JSON: ${(err as Error).message}`);
      }
    }
    return validate(schema, value, "request body");
  }

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
    const body = route.body ? await parseJsonBody(req, route.body) : undefined;

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
