/**
 * The control plane's routes: each names its method, path, who may call it, and the schemas of
 * its input and answer (from which the OpenAPI document is generated). Handlers are thin: they
 * check what only the server knows (which cluster a token belongs to, allowed namespaces), call
 * the store and log what changed.
 */
import { z } from "zod";
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
import { namespaceAllowed, renewBeforeSeconds, type ControlPlaneConfig } from "./config.js";
import { ApiError } from "./errors.js";
import { queueKey, type Waiters } from "./long-poll.js";
import type { ControlPlaneMetrics } from "./metrics.js";
import { openApiDocument, type Route } from "./router.js";
import type { Store } from "./store.js";
import type { Logger } from "../common/log.js";

export const CONTROL_PLANE_VERSION = "0.1.0";

export interface RouteDeps {
  config: ControlPlaneConfig;
  store: Store;
  log: Logger;
  metrics: Pick<ControlPlaneMetrics, "registrations" | "delivered">;
  waiters: Waiters;
  /** Aborted when the server shuts down: long polls answer at once. */
  shutdown: AbortSignal;
}

/** Every route; `/metrics` is answered by the server itself (text, not JSON). */
export function controlPlaneRoutes(d: RouteDeps): Route[] {
  const { config, store, log, waiters, shutdown } = d;
  const { registrations, delivered } = d.metrics;
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
          if (shutdown.aborted) return { messages: [] };
          const { messages, nextVisibleAt: next } = store.receive(id, b.queue, {
            gpuTypes: b.gpuTypes,
            maxMessages: b.maxMessages,
            visibilityTimeoutSeconds: vt,
          });
          for (const m of messages) delivered.inc({ queue: b.queue, redelivery: String(m.receiveCount > 1) });
          const left = deadline - Date.now();
          if (messages.length > 0 || left <= 0 || signal.aborted) return { messages };
          // Wake on a new message, on a timed-out delivery becoming visible, or at the deadline.
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
  return routes;
}
