import { createServer, type Server } from "node:https";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { TLSSocket } from "node:tls";
import { readFileSync, watchFile, unwatchFile } from "node:fs";
import { z } from "zod";
import type { Logger } from "../common/log.js";
import type { Registry } from "prom-client";
import { listen } from "../common/http.js";

/** The part of an AdmissionReview v1 request the webhook reads. */
export const AdmissionReviewSchema = z.object({
  apiVersion: z.literal("admission.k8s.io/v1"),
  kind: z.literal("AdmissionReview"),
  request: z.object({
    uid: z.string().min(1),
    kind: z.object({ group: z.string(), version: z.string(), kind: z.string() }).optional(),
    resource: z.object({ group: z.string(), version: z.string(), resource: z.string() }).optional(),
    subResource: z.string().optional(),
    namespace: z.string().optional(),
    name: z.string().optional(),
    operation: z.string().optional(),
    dryRun: z.boolean().optional(),
    object: z.unknown().optional(),
    oldObject: z.unknown().optional(),
    userInfo: z
      .object({
        username: z.string().optional(),
        extra: z.record(z.string(), z.array(z.string())).optional(),
      })
      .optional(),
  }),
});
export type AdmissionReview = z.infer<typeof AdmissionReviewSchema>;

export interface AdmissionResponse {
  uid: string;
  /** Pods are always admitted (fail open); only a records review refuses. */
  allowed: boolean;
  status?: { code: number; message: string };
  patch?: string;
  patchType?: "JSONPatch";
  warnings?: string[];
}

export type AdmissionHandler = (review: AdmissionReview) => Promise<AdmissionResponse>;

/** Where the API server sends node agents' writes to cache records (records-review.ts). */
export const RECORDS_PATH = "/validate-records";

export interface ServerOptions {
  host: string;
  port: number;
  cert: { certFile: string; keyFile: string } | { cert: string; key: string };
  maxBodyBytes: number;
  handler: AdmissionHandler;
  /** Reviews of node agents' writes to cache records (RECORDS_PATH), when served. */
  recordsHandler?: AdmissionHandler;
  /** Called when the handler throws: answers must still carry the uid and admit the pod. */
  onHandlerError: (err: unknown, review: AdmissionReview) => AdmissionResponse;
  registry?: Registry;
  log: Logger;
  /**
   * Answer /mutate only for callers with a client certificate signed by this CA (and, when names
   * are given, issued to one of them: CN or DNS name). Health and metrics stay open.
   */
  clientAuth?: {
    caFile: string;
    names?: string[];
    onRefused?: (why: "no-certificate" | "untrusted" | "name") => void;
  };
}

export interface RunningServer {
  server: Server;
  url: string;
  close(): Promise<void>;
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

/**
 * HTTPS server for AdmissionReview v1: body cap, content-type check, schema check, and a response
 * that always carries the request uid. Certificates given as files are reloaded when they change
 * (a rotated Secret swaps the files under the mount).
 */
export async function startAdmissionServer(opts: ServerOptions): Promise<RunningServer> {
  const readCert = (): { cert: string; key: string; ca?: string } => ({
    ...("certFile" in opts.cert
      ? { cert: readFileSync(opts.cert.certFile, "utf8"), key: readFileSync(opts.cert.keyFile, "utf8") }
      : opts.cert),
    ...(opts.clientAuth ? { ca: readFileSync(opts.clientAuth.caFile, "utf8") } : {}),
  });

  // The certificate is asked for but checked per route: probes reach /healthz without one.
  const tls = opts.clientAuth ? { requestCert: true, rejectUnauthorized: false } : {};
  const server = createServer({ ...readCert(), ...tls }, (req, res) => {
    route(req, res).catch((err: unknown) => {
      opts.log.error({ err }, "request failed");
      if (!res.headersSent) send(res, 500, { error: "internal error" });
    });
  });

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? "/").split("?")[0];
    if (req.method === "GET" && (path === "/healthz" || path === "/livez" || path === "/readyz")) {
      return send(res, 200, { ok: true });
    }
    if (req.method === "GET" && path === "/metrics" && opts.registry) {
      res.writeHead(200, { "content-type": opts.registry.contentType });
      res.end(await opts.registry.metrics());
      return;
    }
    const handler =
      path === "/mutate" ? opts.handler : path === RECORDS_PATH ? opts.recordsHandler : undefined;
    if (!handler) return send(res, 404, { error: `no route for ${req.method} ${path}` });
    const refused = callerRefused(req);
    if (refused) {
      opts.clientAuth?.onRefused?.(refused.why);
      opts.log.warn(
        { remote: req.socket.remoteAddress, why: refused.message },
        "refused an admission request",
      );
      req.resume();
      return send(res, refused.status, { error: refused.message });
    }
    if (req.method !== "POST") return send(res, 405, { error: "use POST" });

    let review: AdmissionReview;
    try {
      review = parseReview(await readBody(req, opts.maxBodyBytes), req.headers["content-type"]);
    } catch (err) {
      const status = err instanceof HttpError ? err.status : 400;
      const message = err instanceof Error ? err.message : String(err);
      opts.log.warn({ status, message }, "rejected a malformed admission request");
      return send(res, status, { error: message });
    }
    let response: AdmissionResponse;
    try {
      response = await handler(review);
    } catch (err) {
      // A pod is admitted whatever failed; a record write that cannot be checked is refused.
      response =
        handler === opts.handler
          ? opts.onHandlerError(err, review)
          : { uid: review.request.uid, allowed: false, status: { code: 500, message: String(err) } };
    }
    send(res, 200, { apiVersion: "admission.k8s.io/v1", kind: "AdmissionReview", response });
  }

  /** Why this caller may not post reviews; undefined when it may. */
  function callerRefused(
    req: IncomingMessage,
  ): { status: number; why: "no-certificate" | "untrusted" | "name"; message: string } | undefined {
    if (!opts.clientAuth) return undefined;
    const socket = req.socket as TLSSocket;
    const peer = socket.getPeerCertificate();
    if (!peer || Object.keys(peer).length === 0)
      return { status: 401, why: "no-certificate", message: "a client certificate is required" };
    if (!socket.authorized)
      return {
        status: 403,
        why: "untrusted",
        message: `client certificate not trusted: ${String(socket.authorizationError)}`,
      };
    const names = opts.clientAuth.names ?? [];
    if (names.length) {
      const cn = peer.subject?.CN;
      const dns = (peer.subjectaltname ?? "")
        .split(",")
        .map((s) => s.trim())
        .filter((s) => s.startsWith("DNS:"))
        .map((s) => s.slice(4));
      const held = [...(Array.isArray(cn) ? cn : cn ? [cn] : []), ...dns];
      if (!held.some((n) => names.includes(n)))
        return {
          status: 403,
          why: "name",
          message: `client certificate ${held.join(",") || "(unnamed)"} is not allowed`,
        };
    }
    return undefined;
  }

  const listening = await listen(server, {
    host: opts.host,
    port: opts.port,
    role: "webhook",
    scheme: "https",
  });
  // The API server reuses its connections to us: keep them longer than the default.
  server.keepAliveTimeout = 30_000;
  // Watched once serving: a server that could not listen leaves no watcher behind.
  const watched = [
    ...("certFile" in opts.cert ? [opts.cert.certFile, opts.cert.keyFile] : []),
    ...(opts.clientAuth ? [opts.clientAuth.caFile] : []),
  ];
  for (const f of watched) {
    watchFile(f, { interval: 2000 }, () => {
      try {
        server.setSecureContext(readCert());
        opts.log.info({ file: f }, "serving certificate reloaded");
      } catch (err) {
        opts.log.warn({ err, file: f }, "could not reload the serving certificate; keeping the old one");
      }
    });
  }
  return {
    server,
    url: listening.url,
    close: async () => {
      for (const f of watched) unwatchFile(f);
      await listening.close();
    },
  };
}

function parseReview(body: Buffer, contentType: string | undefined): AdmissionReview {
  if (!contentType || !/^application\/json\b/i.test(contentType)) {
    throw new HttpError(415, `expected content-type application/json, got ${contentType ?? "none"}`);
  }
  let json: unknown;
  try {
    json = JSON.parse(body.toString("utf8"));
  } catch (err) {
    throw new HttpError(400, `body is not JSON: ${(err as Error).message}`);
  }
  const parsed = AdmissionReviewSchema.safeParse(json);
  if (!parsed.success) {
    const i = parsed.error.issues[0]!;
    throw new HttpError(
      400,
      `not an admission.k8s.io/v1 AdmissionReview: ${i.path.join(".") || "body"}: ${i.message}`,
    );
  }
  return parsed.data;
}

function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers["content-length"] ?? 0);
    if (declared > limit) {
      req.resume();
      return reject(new HttpError(413, `body of ${declared} bytes exceeds the ${limit}-byte limit`));
    }
    const chunks: Buffer[] = [];
    let size = 0;
    // A body without a length that grows past the limit is read to its end and dropped, not cut
    // off: destroying the request would leave its sender without an answer.
    req.on("data", (c: Buffer) => {
      size += c.length;
      if (size > limit) chunks.length = 0;
      else chunks.push(c);
    });
    req.on("end", () =>
      size > limit
        ? reject(new HttpError(413, `body exceeds the ${limit}-byte limit`))
        : resolve(Buffer.concat(chunks)),
    );
    req.on("error", reject);
  });
}

function send(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
}
