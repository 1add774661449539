/**
 * Typed client for the control plane API, shared by the cluster agent and the operator CLI.
 * Every response is parsed with the same schemas the server validates with, so a contract drift
 * shows up as a clear error rather than as an undefined field deep inside the agent.
 */
import { Agent, request as httpsRequest } from "node:https";
import type { z } from "zod";
import {
  AckResponse,
  ClusterList,
  ClusterView,
  ErrorBody,
  HeartbeatResponse,
  ReceiveResponse,
  RegisterResponse,
  ReleaseResponse,
  RenewResponse,
  RequestList,
  RequestView,
  SubmitResponse,
  type HeartbeatRequest,
  type Instruction,
  type ReceiveRequest,
  type RegisterRequest,
  type ReleaseRequest,
  type StatusReport,
  type SubmitRequest,
} from "./api.js";

/** Which kind of token a call needs; lets one supplier serve both registration and queue calls. */
export type AuthKind = "cluster" | "queue" | "operator";

/** A fixed token, or a function asked before every call (so renewed credentials are picked up). */
export type TokenSupplier = string | ((kind: AuthKind) => string | undefined | Promise<string | undefined>);

export interface ControlPlaneClientOptions {
  baseUrl: string;
  token: TokenSupplier;
  /** Per-call timeout on top of any long-poll wait (default 30 s). */
  timeoutMs?: number;
  /** For tests and proxies; defaults to the global fetch. */
  fetch?: typeof fetch;
  /** PEM certificates to trust for an https base URL (a private CA), instead of the system's. */
  ca?: string | Buffer;
}

export interface CallOptions {
  signal?: AbortSignal;
}

/**
 * Any failure of a call. `status` is the HTTP status, 0 when no response came back (network error
 * or timeout). `retryable` is true for network errors, timeouts, 408, 429 and 5xx.
 */
export class ControlPlaneError extends Error {
  override readonly name = "ControlPlaneError";
  readonly status: number;
  readonly retryable: boolean;
  readonly body: unknown;

  constructor(
    message: string,
    status: number,
    opts: { retryable?: boolean; body?: unknown; cause?: unknown } = {},
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.status = status;
    this.retryable = opts.retryable ?? isRetryableStatus(status);
    this.body = opts.body;
  }
}

export function isRetryableStatus(status: number): boolean {
  return status === 0 || status === 408 || status === 429 || status >= 500;
}

export class ControlPlaneClient {
  readonly baseUrl: string;
  private readonly token: TokenSupplier;
  private readonly timeoutMs: number;
  private readonly fetchImpl: typeof fetch;

  constructor(opts: ControlPlaneClientOptions) {
    this.baseUrl = opts.baseUrl.replace(/\/+$/, "");
    this.token = opts.token;
    this.timeoutMs = opts.timeoutMs ?? 30_000;
    this.fetchImpl = opts.fetch ?? (opts.ca === undefined ? fetch : fetchTrusting(opts.ca));
  }

  // --- cluster agent -------------------------------------------------------------------------

  /** Register (or re-register) a cluster's inventory; needs a cluster token. */
  register(body: RegisterRequest, opts?: CallOptions): Promise<RegisterResponse> {
    return this.call("POST", "/v1/clusters/register", "cluster", body, RegisterResponse, opts);
  }

  /** New queue credentials; the current ones keep working until they expire. */
  renew(clusterId: string, opts?: CallOptions): Promise<RenewResponse> {
    return this.call(
      "POST",
      `/v1/clusters/${seg(clusterId)}/credentials/renew`,
      "queue",
      {},
      RenewResponse,
      opts,
    );
  }

  heartbeat(clusterId: string, body: HeartbeatRequest, opts?: CallOptions): Promise<HeartbeatResponse> {
    return this.call(
      "POST",
      `/v1/clusters/${seg(clusterId)}/heartbeat`,
      "queue",
      body,
      HeartbeatResponse,
      opts,
    );
  }

  /** Long-polls for up to `waitSeconds`; the call's timeout is extended by that much. */
  receive(clusterId: string, body: ReceiveRequest, opts?: CallOptions): Promise<ReceiveResponse> {
    const extraMs = (body.waitSeconds ?? 0) * 1000;
    return this.call(
      "POST",
      `/v1/clusters/${seg(clusterId)}/queues/receive`,
      "queue",
      body,
      ReceiveResponse,
      opts,
      extraMs,
    );
  }

  /** Stale handles are reported in `failed`, not thrown. */
  ack(clusterId: string, receiptHandles: string[], opts?: CallOptions): Promise<AckResponse> {
    return this.call(
      "POST",
      `/v1/clusters/${seg(clusterId)}/queues/ack`,
      "queue",
      { receiptHandles },
      AckResponse,
      opts,
    );
  }

  /** Make a received message visible again now (or after `delaySeconds`). */
  release(
    clusterId: string,
    receiptHandle: string,
    opts?: CallOptions & Omit<ReleaseRequest, "receiptHandle">,
  ): Promise<ReleaseResponse> {
    const body: ReleaseRequest = {
      receiptHandle,
      ...(opts?.delaySeconds === undefined ? {} : { delaySeconds: opts.delaySeconds }),
    };
    return this.call(
      "POST",
      `/v1/clusters/${seg(clusterId)}/queues/release`,
      "queue",
      body,
      ReleaseResponse,
      opts,
    );
  }

  reportStatus(requestId: string, report: StatusReport, opts?: CallOptions): Promise<RequestView> {
    return this.call("POST", `/v1/requests/${seg(requestId)}/status`, "queue", report, RequestView, opts);
  }

  // --- operator ------------------------------------------------------------------------------

  submit(request: SubmitRequest, opts?: CallOptions): Promise<SubmitResponse> {
    return this.call("POST", "/v1/requests", "operator", request, SubmitResponse, opts);
  }

  async listRequests(opts?: CallOptions): Promise<RequestView[]> {
    return (await this.call("GET", "/v1/requests", "operator", undefined, RequestList, opts)).requests;
  }

  getRequest(id: string, opts?: CallOptions): Promise<RequestView> {
    return this.call("GET", `/v1/requests/${seg(id)}`, "operator", undefined, RequestView, opts);
  }

  /** Idempotent: terminating an already terminating or terminated request returns it unchanged. */
  terminate(id: string, opts?: CallOptions): Promise<SubmitResponse> {
    return this.call("DELETE", `/v1/requests/${seg(id)}`, "operator", undefined, SubmitResponse, opts);
  }

  async listClusters(opts?: CallOptions): Promise<ClusterView[]> {
    return (await this.call("GET", "/v1/clusters", "operator", undefined, ClusterList, opts)).clusters;
  }

  setInstruction(clusterId: string, instruction: Instruction, opts?: CallOptions): Promise<ClusterView> {
    return this.call(
      "POST",
      `/v1/clusters/${seg(clusterId)}/instruction`,
      "operator",
      { instruction },
      ClusterView,
      opts,
    );
  }

  // --- plumbing ------------------------------------------------------------------------------

  private async call<S extends z.ZodType>(
    method: string,
    path: string,
    auth: AuthKind,
    body: unknown,
    schema: S,
    opts: CallOptions | undefined,
    extraTimeoutMs = 0,
  ): Promise<z.output<S>> {
    const token = typeof this.token === "string" ? this.token : await this.token(auth);
    if (!token)
      throw new ControlPlaneError(`no ${auth} token available for ${method} ${path}`, 401, {
        retryable: false,
      });

    const timeout = AbortSignal.timeout(this.timeoutMs + extraTimeoutMs);
    const signal = opts?.signal ? AbortSignal.any([opts.signal, timeout]) : timeout;
    const headers: Record<string, string> = { authorization: `Bearer ${token}`, accept: "application/json" };
    if (body !== undefined) headers["content-type"] = "application/json";

    let res: Response;
    let text: string;
    try {
      res = await this.fetchImpl(`${this.baseUrl}${path}`, {
        method,
        headers,
        signal,
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
      });
      text = await res.text();
    } catch (err) {
      // The caller's own cancellation is not a control plane failure: hand back its reason.
      if (opts?.signal?.aborted) throw opts.signal.reason;
      // fetch says only "fetch failed"; the reason (refused, a certificate it does not trust) is the cause.
      const cause = err instanceof Error && err.cause instanceof Error ? `: ${err.cause.message}` : "";
      const what = timeout.aborted
        ? "timed out"
        : `failed: ${err instanceof Error ? err.message : String(err)}${cause}`;
      throw new ControlPlaneError(`${method} ${path} ${what}`, 0, { retryable: true, cause: err });
    }

    let json: unknown;
    try {
      json = text === "" ? undefined : JSON.parse(text);
    } catch {
      json = undefined;
    }
    if (!res.ok) {
      const parsed = ErrorBody.safeParse(json);
      const detail = parsed.success ? parsed.data.error : text.slice(0, 200) || res.statusText;
      throw new ControlPlaneError(`${method} ${path}: ${res.status} ${detail}`, res.status, {
        body: json ?? text,
      });
    }
    const parsed = schema.safeParse(json);
    if (!parsed.success) {
      throw new ControlPlaneError(
        `${method} ${path}: unexpected response: ${parsed.error.message}`,
        res.status,
        {
          retryable: false,
          body: json,
        },
      );
    }
    return parsed.data;
  }
}

function seg(s: string): string {
  return encodeURIComponent(s);
}

/**
 * A fetch over node:https that trusts `ca`: the global fetch takes no CA (that needs undici's own
 * Agent, which Node does not expose). Enough of fetch for this client: method, headers, a string
 * body, a signal, and the answer's status, headers and text.
 */
export function fetchTrusting(ca: string | Buffer): typeof fetch {
  const agent = new Agent({ ca, keepAlive: true, minVersion: "TLSv1.2" });
  return (input, init) => {
    const url = new URL(input instanceof Request ? input.url : String(input));
    if (url.protocol !== "https:") return fetch(input, init);
    return new Promise<Response>((resolve, reject) => {
      const headers: Record<string, string> = {};
      new Headers(init?.headers).forEach((v, k) => (headers[k] = v));
      const req = httpsRequest(
        url,
        { method: init?.method ?? "GET", headers, agent, ...(init?.signal ? { signal: init.signal } : {}) },
        (res) => {
          const chunks: Buffer[] = [];
          res.on("data", (c: Buffer) => chunks.push(c));
          res.on("error", reject);
          res.on("end", () => {
            const h = new Headers();
            for (const [k, v] of Object.entries(res.headers)) {
              if (v !== undefined) for (const one of Array.isArray(v) ? v : [v]) h.append(k, one);
            }
            const status = res.statusCode ?? 502;
            const empty = status === 204 || status === 304;
            resolve(new Response(empty ? null : Buffer.concat(chunks), { status, headers: h }));
          });
        },
      );
      req.on("error", reject);
      req.end(typeof init?.body === "string" ? init.body : undefined);
    });
  };
}
