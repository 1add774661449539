/**
 * A small proxy in front of the real API server that can answer chosen requests with an error
 * (or delay them) before they reach it. Everything else goes through unchanged, watches included
 * (responses are streamed). The proxy listens on plain HTTP on loopback and authenticates to the
 * API server with the kubeconfig's own credentials, so a client pointed at it needs none.
 */
import { writeFile } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { Agent, request as httpsRequest, type RequestOptions } from "node:https";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import * as k8s from "@kubernetes/client-node";

export interface FaultRule {
  /** Matches the method (exact, case-insensitive); any method when unset. */
  method?: string;
  /** Matches the request path (without the query). */
  path: RegExp;
  /** How many matching requests get the fault (default: all). */
  times?: number;
  /** The status codes answered, in turn (the last one repeats). Unset with `delayMs`: delay only. */
  status?: number[];
  /** Wait this long before answering (or forwarding, for a delay-only rule). */
  delayMs?: number;
  /** Matches the query string too (e.g. /watch=true/). */
  query?: RegExp;
  /** Acts on this share of the matching requests only (chaos); the rest go through. */
  probability?: number;
  /** Runs (and is awaited) when the rule acts, before the request is answered or forwarded: kill a process there. */
  onMatch?: (method: string, path: string) => void | Promise<void>;
  /** Forwards the request but cuts the response this long after it started (a dropped watch). */
  dropAfterMs?: number;
}

export interface RuleHandle {
  /** Requests this rule matched and acted on. */
  readonly hits: number;
  remove(): void;
}

export interface SeenRequest {
  method: string;
  path: string;
  /** The query string, with its `?` (empty when none). */
  query: string;
  /** The status sent back (injected or from the API server). */
  status: number;
  injected: boolean;
}

const REASONS: Record<number, string> = {
  409: "Conflict",
  429: "TooManyRequests",
  500: "InternalError",
  503: "ServiceUnavailable",
  504: "Timeout",
};

interface ActiveRule extends FaultRule {
  hits: number;
}

export class FaultProxy {
  private constructor(
    private readonly server: Server,
    readonly url: string,
    private readonly rules: ActiveRule[],
    readonly requests: SeenRequest[],
  ) {}

  /** Starts a proxy to the current cluster of `kc`. */
  static async start(kc: k8s.KubeConfig): Promise<FaultProxy> {
    const cluster = kc.getCurrentCluster();
    if (!cluster) throw new Error("kubeconfig has no current cluster");
    const upstream = new URL(cluster.server);
    const tls: RequestOptions = {};
    await kc.applyToHTTPSOptions(tls);
    const agent = new Agent({ ca: tls.ca, cert: tls.cert, key: tls.key, keepAlive: true, maxSockets: 64 });
    const headers = tls.headers ?? {};

    const rules: ActiveRule[] = [];
    const requests: SeenRequest[] = [];
    const server = createServer((req, res) => {
      serve(rules, requests, req, res, upstream, agent, headers as Record<string, string>).catch(
        (err: unknown) => {
          if (!res.headersSent) res.writeHead(502, { "content-type": "text/plain" });
          res.end(`fault proxy: ${(err as Error).message}`);
        },
      );
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(0, "127.0.0.1", () => resolve());
    });
    const { port } = server.address() as AddressInfo;
    const proxy = new FaultProxy(server, `http://127.0.0.1:${port}`, rules, requests);
    return proxy;
  }

  /** The proxy's kubeconfig as a file, for a process started with KUBECONFIG. */
  async kubeconfigFile(dir: string): Promise<string> {
    const file = join(dir, "fault-proxy.kubeconfig");
    await writeFile(file, this.kubeConfig().exportConfig());
    return file;
  }

  /** A kubeconfig whose only cluster is this proxy. */
  kubeConfig(): k8s.KubeConfig {
    const kc = new k8s.KubeConfig();
    kc.loadFromOptions({
      // Plain HTTP on loopback: client-node only allows an http:// server with skipTLSVerify set.
      clusters: [{ name: "fault-proxy", server: this.url, skipTLSVerify: true }],
      users: [{ name: "fault-proxy" }],
      contexts: [{ name: "fault-proxy", cluster: "fault-proxy", user: "fault-proxy" }],
      currentContext: "fault-proxy",
    });
    return kc;
  }

  /** Adds a rule; the first matching rule with faults left acts on a request. */
  inject(rule: FaultRule): RuleHandle {
    const active: ActiveRule = { ...rule, hits: 0 };
    this.rules.push(active);
    return {
      get hits() {
        return active.hits;
      },
      remove: () => {
        const i = this.rules.indexOf(active);
        if (i >= 0) this.rules.splice(i, 1);
      },
    };
  }

  clear(): void {
    this.rules.length = 0;
  }

  /** Requests seen so far whose method and path match. */
  seen(method: string, path: RegExp): SeenRequest[] {
    return this.requests.filter((r) => r.method === method.toUpperCase() && path.test(r.path));
  }

  async close(): Promise<void> {
    await new Promise<void>((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
    });
  }
}

async function serve(
  rules: ActiveRule[],
  requests: SeenRequest[],
  req: IncomingMessage,
  res: ServerResponse,
  upstream: URL,
  agent: Agent,
  authHeaders: Record<string, string>,
): Promise<void> {
  const method = (req.method ?? "GET").toUpperCase();
  const url = new URL(req.url ?? "/", "http://proxy");
  const path = url.pathname;
  const rule = rules.find(
    (r) =>
      (r.times === undefined || r.hits < r.times) &&
      (!r.method || r.method.toUpperCase() === method) &&
      r.path.test(path) &&
      (!r.query || r.query.test(url.search)) &&
      (r.probability === undefined || Math.random() < r.probability),
  );
  if (rule) {
    const index = rule.hits++;
    if (rule.onMatch) await rule.onMatch(method, path);
    if (rule.delayMs) await sleep(rule.delayMs);
    const codes = rule.status ?? [];
    if (codes.length) {
      const code = codes[Math.min(index, codes.length - 1)]!;
      req.resume();
      const body = JSON.stringify({
        kind: "Status",
        apiVersion: "v1",
        metadata: {},
        status: "Failure",
        message: `injected by the fault proxy (${method} ${path})`,
        reason: REASONS[code] ?? "InternalError",
        code,
      });
      res.writeHead(code, {
        "content-type": "application/json",
        ...(code === 429 ? { "retry-after": "1" } : {}),
      });
      res.end(body);
      requests.push({ method, path, query: url.search, status: code, injected: true });
      return;
    }
  }
  // The API server sees the kubeconfig's identity, whatever the client sent.
  const { authorization: _ignored, ...incoming } = req.headers;
  const headers = { ...incoming, ...authHeaders, host: upstream.host };
  await new Promise<void>((resolve, reject) => {
    const up = httpsRequest(
      {
        protocol: upstream.protocol,
        hostname: upstream.hostname,
        port: upstream.port,
        path: req.url,
        method,
        headers,
        agent,
      },
      (upRes) => {
        requests.push({ method, path, query: url.search, status: upRes.statusCode ?? 0, injected: false });
        res.writeHead(upRes.statusCode ?? 502, upRes.headers);
        upRes.pipe(res);
        if (rule?.dropAfterMs !== undefined) {
          const cut = setTimeout(() => {
            upRes.destroy();
            res.destroy();
          }, rule.dropAfterMs);
          res.once("close", () => clearTimeout(cut));
        }
        upRes.on("end", resolve);
        upRes.on("error", reject);
      },
    );
    up.on("error", reject);
    // A client that goes away (a watch being stopped) ends the upstream request too.
    res.on("close", () => {
      up.destroy();
      resolve();
    });
    req.pipe(up);
  });
}
