import https from "node:https";
import * as k8s from "@kubernetes/client-node";

/** Load a KubeConfig from an explicit path, $KUBECONFIG, or the in-cluster service account. */
export function loadKubeConfig(path?: string): k8s.KubeConfig {
  const kc = new k8s.KubeConfig();
  const file = path ?? process.env.KUBECONFIG;
  if (file) kc.loadFromFile(file);
  else kc.loadFromDefault();
  return kc;
}

/**
 * API clients that reuse connections. client-node 1.4 builds a new https.Agent (so a new TLS
 * handshake) for every request; on a webhook's hot path that costs ~10 ms per call. This keeps the
 * kubeconfig's own authentication (headers, tokens) per request but one keep-alive agent per TLS
 * identity (CA, client cert and key), so a rotated certificate gets a fresh agent.
 */
export function makeApiClient<T>(kc: k8s.KubeConfig, api: new (config: k8s.Configuration) => T): T {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new Error("kubeconfig has no current cluster");
  const agents = new Map<string, https.Agent>();
  const auth: k8s.SecurityAuthentication = {
    getName: () => "keepalive",
    applySecurityAuthentication: async (context) => {
      await kc.applySecurityAuthentication(context);
      const fresh = context.getAgent() as (https.Agent & { options: https.AgentOptions }) | undefined;
      if (!fresh || !(fresh instanceof https.Agent)) return;
      const o = fresh.options;
      const key = [o.ca, o.cert, o.key, o.rejectUnauthorized, o.servername].map(String).join("|");
      let agent = agents.get(key);
      if (!agent) {
        agents.clear();
        agent = new https.Agent({ ...o, keepAlive: true, maxSockets: 64 });
        agents.set(key, agent);
      }
      context.setAgent(agent);
    },
  };
  const config = k8s.createConfiguration({
    baseServer: new k8s.ServerConfiguration(cluster.server, {}),
    authMethods: { default: auth },
    httpApi: new RetryingHttpLibrary(),
  });
  return new api(config);
}

/**
 * Transient answers are retried in place, a few times with a short backoff: a 429 for any method
 * (the request was not processed; its Retry-After is honoured up to a cap), and for reads also a
 * 5xx or a dropped connection. Writes that may have been applied are left to their callers, whose
 * conditioned writes and requeues handle them. Without this, a controller's step of a dozen calls
 * fails as a whole whenever one read meets an API server shedding load.
 */
export class RetryingHttpLibrary implements k8s.HttpLibrary {
  constructor(
    private readonly attempts = 4,
    private readonly inner: k8s.HttpLibrary = new k8s.IsomorphicFetchHttpLibrary(),
  ) {}

  send(request: k8s.RequestContext): k8s.Observable<k8s.ResponseContext> {
    return new k8s.Observable(this.sendWithRetries(request));
  }

  private async sendWithRetries(request: k8s.RequestContext): Promise<k8s.ResponseContext> {
    const read =
      request.getHttpMethod() === k8s.HttpMethod.GET && !/[?&]watch=(true|1)\b/.test(request.getUrl());
    for (let attempt = 1; ; attempt++) {
      const last = attempt >= this.attempts || request.getSignal()?.aborted === true;
      let res: k8s.ResponseContext;
      try {
        res = await this.inner.send(request).toPromise();
      } catch (err) {
        if (!read || last) throw err;
        await sleep(backoffMs(attempt));
        continue;
      }
      const transient = res.httpStatusCode === 429 || (read && res.httpStatusCode >= 500);
      if (!transient || last) return res;
      const retryAfter = Number(res.headers["retry-after"]);
      await sleep(retryAfter > 0 ? Math.min(retryAfter * 1000, 2_000) : backoffMs(attempt));
    }
  }
}

/** 100, 200, 400 ms ... with jitter, so that clients shed together do not return together. */
const backoffMs = (attempt: number): number =>
  Math.min(100 * 2 ** (attempt - 1), 1_000) * (0.5 + Math.random());
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** The reason and status code of a failed API call, whatever shape the error has. */
export function apiErrorInfo(err: unknown): { code?: number; reason?: string; message: string } {
  if (err instanceof k8s.ApiException) {
    const body = parseBody(err.body);
    return { code: err.code, reason: body?.reason, message: body?.message ?? String(err.message) };
  }
  const e = err as { code?: unknown; statusCode?: unknown; body?: unknown; message?: unknown };
  const code =
    typeof e?.code === "number" ? e.code : typeof e?.statusCode === "number" ? e.statusCode : undefined;
  const body = parseBody(e?.body);
  return { code, reason: body?.reason, message: body?.message ?? String(e?.message ?? err) };
}

function parseBody(body: unknown): { reason?: string; message?: string } | undefined {
  if (body && typeof body === "object") return body;
  if (typeof body !== "string") return undefined;
  try {
    return JSON.parse(body) as { reason?: string; message?: string };
  } catch {
    return undefined;
  }
}

export const isNotFound = (err: unknown): boolean => apiErrorInfo(err).code === 404;
export const isAlreadyExists = (err: unknown): boolean => {
  const i = apiErrorInfo(err);
  return i.code === 409 && (i.reason === "AlreadyExists" || i.reason === undefined);
};
export const isConflict = (err: unknown): boolean => {
  const i = apiErrorInfo(err);
  return i.code === 409 && i.reason === "Conflict";
};

/** Wrap an API error with context, keeping the original as `cause`. */
export function apiError(context: string, err: unknown): Error {
  const i = apiErrorInfo(err);
  return new Error(
    `${context}: ${i.code ?? "?"} ${i.reason ?? ""} ${i.message}`.replace(/\s+/g, " ").trim(),
    {
      cause: err,
    },
  );
}

/** Names shared by every role. */
export const SYSTEM_NAMESPACE = process.env.WARMSTART_NAMESPACE ?? "warmstart-system";
