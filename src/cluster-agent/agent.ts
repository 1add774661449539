/**
 * The GPU-aware cluster agent, wired together: a node watch and poll feed the GPU monitor; the
 * registration manager turns accepted GPU states into registrations and keeps credentials fresh;
 * readiness gates the deployment queue; terminations, heartbeats and status reports run beside.
 */
import { readFileSync } from "node:fs";
import * as k8s from "@kubernetes/client-node";
import { loadKubeConfig } from "../common/kube.js";
import { createLogger, type Logger } from "../common/log.js";
import type {
  DeploymentRequest,
  HeartbeatRequest,
  Instruction,
  QueueMessage,
  QueueName,
  TerminationRequest,
} from "../control-plane/api.js";
import { ControlPlaneClient, ControlPlaneError, fetchTrusting } from "../control-plane/client.js";
import { realClock, type Clock } from "../common/clock.js";
import type { AgentConfig } from "./config.js";
import { SecretStore, type InstalledCredentials } from "./credentials.js";
import { Heartbeat } from "./heartbeat.js";
import { ResilientWatch, makeInformer } from "../common/watch.js";
import { describe, fits, inventoryFromNodes, nodeGpus, type GpuInventory } from "./inventory.js";
import { createMetrics, type AgentMetrics } from "./metrics.js";
import { GpuMonitor } from "./monitor.js";
import { QueueConsumer } from "./queue.js";
import { RegistrationManager, type IssuedCredentials, type RegistrationState } from "./registration.js";
import { formatSelector } from "./selector.js";
import { startHttp, type Health, type HttpHandle } from "./server.js";
import { StatusReporter } from "./status.js";
import { RequestLock } from "./request-lock.js";
import {
  isTerminalApiError,
  LABEL_REQUEST_ID,
  NamespaceNotAllowedError,
  OwnershipError,
  Workloads,
  type RequestRecord,
} from "./workloads.js";

/** How long a request this cluster cannot hold stays invisible before it is offered again. */
const NO_CAPACITY_RELEASE_S = 10;
/** How soon a request that failed for a passing reason is offered again. */
const RETRY_RELEASE_S = 5;
/** Message ids remembered in memory; older ones fall back on the durable record. */
const HANDLED_MEMORY = 10_000;

export function agentVersion(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL("../../../package.json", import.meta.url), "utf8")) as {
      version?: string;
    };
    return pkg.version ?? "0.0.0";
  } catch {
    return "0.0.0";
  }
}

export interface AgentOptions {
  config: AgentConfig;
  kubeConfig?: k8s.KubeConfig;
  log?: Logger;
  clock?: Clock;
  fetch?: typeof fetch;
  version?: string;
  /** Called when the agent cannot go on (only with graceful no-GPU off and no GPUs). */
  onFatal?: (err: Error) => void;
  /** Points where tests hold the agent to play a race deterministically. */
  hooks?: AgentHooks;
}

export interface AgentHooks {
  /** A deployment has recorded its request and is about to create the workload. */
  beforeApply?(requestId: string): Promise<void>;
  /** An operation on a request waits because another one on the same request is running. */
  requestLockWait?(requestId: string): void;
  /** A message was handled to the end (acknowledged, released or failed). */
  handled?(queue: QueueName, msg: QueueMessage, outcome: string): void;
}

export class ClusterAgent {
  readonly metrics: AgentMetrics;
  readonly log: Logger;
  readonly registration: RegistrationManager;
  readonly monitor: GpuMonitor;
  readonly queue: QueueConsumer;
  private readonly cfg: AgentConfig;
  private readonly clock: Clock;
  private readonly version: string;
  private readonly core: k8s.CoreV1Api;
  private readonly secrets: SecretStore;
  private readonly workloads: Workloads;
  private readonly status: StatusReporter;
  private readonly heartbeat: Heartbeat;
  private readonly nodeWatch: ResilientWatch<k8s.V1Node>;
  private readonly podWatches: ResilientWatch<k8s.V1Pod>[];
  /** Deploy and terminate of one request never interleave. */
  private readonly requestLock: RequestLock;
  private readonly fetchImpl: typeof fetch | undefined;
  /** The node selector in the API server's syntax (undefined: every node). */
  private readonly selector: string | undefined;
  private readonly nodeSeen = new Map<string, string>();
  /** Message ids handled to the end in this run; the durable record covers restarts. */
  private readonly handled = new Set<string>();
  private serverHeartbeatMs = 30_000;
  private draining = false;
  private http: HttpHandle | undefined;
  private stopping: Promise<void> | undefined;

  constructor(private readonly opts: AgentOptions) {
    const cfg = (this.cfg = opts.config);
    this.clock = opts.clock ?? realClock;
    this.log = opts.log ?? createLogger("cluster-agent");
    this.version = opts.version ?? agentVersion();
    this.metrics = createMetrics();
    const kc = opts.kubeConfig ?? loadKubeConfig(cfg.kubeconfig);
    this.core = kc.makeApiClient(k8s.CoreV1Api);
    const apps = kc.makeApiClient(k8s.AppsV1Api);
    this.secrets = new SecretStore(this.core, cfg.secretNamespace, cfg.secretName);
    this.workloads = new Workloads(
      this.core,
      apps,
      cfg.namespace,
      { nodeSelector: cfg.nodeSelector.requirements, gpuTypeLabel: cfg.gpuTypeLabel },
      cfg.namespaces,
      cfg.workloadNamespace,
    );
    this.requestLock = new RequestLock((id) => opts.hooks?.requestLockWait?.(id));
    this.fetchImpl =
      opts.fetch ??
      (cfg.controlPlaneCaFile ? fetchTrusting(readFileSync(cfg.controlPlaneCaFile)) : undefined);
    const log = this.log;
    const m = this.metrics;

    this.monitor = new GpuMonitor({
      clock: this.clock,
      log: log.child({ component: "gpu-monitor" }),
      pollIntervalMs: cfg.gpuPollInterval,
      debounceMs: cfg.debounce,
      lookup: () => this.lookupInventory(),
      onChange: (inv) => this.inventoryChanged(inv),
      onLookupError: () => m.lookupFailures.inc(),
    });

    this.registration = new RegistrationManager({
      clock: this.clock,
      log: log.child({ component: "registration" }),
      issuer: `${cfg.controlPlaneUrl}#${cfg.clusterId}`,
      pollIntervalMs: cfg.gpuPollInterval,
      backoffCapMs: cfg.backoffCap,
      refreshIntervalMs: cfg.refreshInterval,
      ...(cfg.renewBefore === undefined ? {} : { renewBeforeMs: cfg.renewBefore }),
      inventory: () => this.monitor.current,
      persist: (c) => this.secrets.save(c),
      api: {
        register: (capacity, signal) => this.register(capacity, signal),
        renew: (token, signal) => this.renew(token, signal),
      },
      onState: (s) => this.registrationState(s),
      events: {
        attempt: (kind) => m.registrationAttempts.inc({ kind }),
        failure: (kind, retryInMs) => {
          m.registrationFailures.inc({ kind });
          m.backoffSeconds.set({ kind }, retryInMs / 1000);
        },
        installed: () => {
          m.backoffSeconds.set({ kind: "register" }, 0);
          m.backoffSeconds.set({ kind: "renew" }, 0);
        },
      },
    });

    this.queue = new QueueConsumer({
      clock: this.clock,
      log: log.child({ component: "queue" }),
      batch: cfg.queueBatch,
      waitSeconds: Math.floor(cfg.queueWait / 1000),
      visibilityTimeoutSeconds: Math.ceil(cfg.visibilityTimeout / 1000),
      gpuTypes: () => this.deployTypes(),
      hasCredentials: () => this.registration.token !== undefined,
      api: {
        receive: (req, signal) =>
          this.withQueueToken(async (c) => (await c.receive(cfg.clusterId, req, { signal })).messages),
      },
      handle: (queue, msg) => this.handle(queue, msg),
    });

    this.status = new StatusReporter({
      clock: this.clock,
      log: log.child({ component: "status" }),
      workloads: this.workloads,
      resyncMs: cfg.statusInterval,
      hasCredentials: () => this.registration.token !== undefined,
      report: async (requestId, report) => {
        await this.withQueueToken((c) => c.reportStatus(requestId, report));
      },
    });

    this.heartbeat = new Heartbeat({
      clock: this.clock,
      log: log.child({ component: "heartbeat" }),
      intervalMs: () => cfg.heartbeatInterval ?? this.serverHeartbeatMs,
      snapshot: () => this.heartbeatSnapshot(),
      send: async (hb, signal) =>
        (await this.withQueueToken((c) => c.heartbeat(cfg.clusterId, hb, { signal }))).instruction,
      onInstruction: (i) => this.applyInstruction(i),
      exclusive: (fn, signal) => this.registration.gate.run(fn, signal),
    });

    const selector = (this.selector = formatSelector(cfg.nodeSelector.requirements) || undefined);
    this.nodeWatch = new ResilientWatch<k8s.V1Node>({
      name: "nodes",
      clock: this.clock,
      log: log.child({ component: "node-watch" }),
      informer: makeInformer(
        kc,
        "/api/v1/nodes",
        () => this.core.listNode({ labelSelector: selector }),
        selector,
      ),
      onChange: (node, kind) => this.nodeEvent(node, kind),
      onConnect: () => this.monitor.trigger(),
    });
    // Pods are watched only where workloads may be: the agent reads nothing cluster-wide but nodes.
    this.podWatches = cfg.namespaces.map(
      (namespace) =>
        new ResilientWatch<k8s.V1Pod>({
          name: `pods in ${namespace}`,
          clock: this.clock,
          log: log.child({ component: "pod-watch", namespace }),
          informer: makeInformer(
            kc,
            `/api/v1/namespaces/${namespace}/pods`,
            () => this.core.listNamespacedPod({ namespace, labelSelector: LABEL_REQUEST_ID }),
            LABEL_REQUEST_ID,
          ),
          onChange: (pod) => {
            const id = pod.metadata?.labels?.[LABEL_REQUEST_ID];
            if (id) this.status.enqueue(id);
          },
        }),
    );
  }

  get url(): string {
    if (!this.http) throw new Error("the agent is not started");
    return this.http.url;
  }

  health(): Health {
    const s = this.registration.state;
    const inv = this.monitor.current;
    return {
      ready: s.ready,
      reason: s.reason,
      gpus: inv?.total ?? null,
      gpuTypes: inv?.byType ?? [],
      paused: this.queue.isPaused,
      cordoned: this.queue.isCordoned,
      instruction: this.heartbeat.instruction,
      credentialsExpireAt: this.registration.installed
        ? new Date(this.registration.installed.expiresAt).toISOString()
        : null,
    };
  }

  async start(): Promise<void> {
    const cfg = this.cfg;
    this.http = await startHttp({
      host: cfg.listenHost,
      port: cfg.port,
      version: this.version,
      health: () => this.health(),
      registry: this.metrics.registry,
      log: this.log.child({ component: "http" }),
    });
    let persisted: InstalledCredentials | undefined;
    try {
      persisted = await this.secrets.load();
    } catch (err) {
      this.log.warn({ err: (err as Error).message }, "could not read saved credentials; will register");
    }
    if (persisted && this.registration.restore(persisted))
      this.log.info(
        { expiresAt: new Date(persisted.expiresAt).toISOString(), capacity: persisted.capacity },
        "resuming with saved credentials",
      );
    this.log.info(
      {
        url: this.http.url,
        version: this.version,
        clusterId: cfg.clusterId,
        controlPlane: cfg.controlPlaneUrl,
        nodeSelector: cfg.nodeSelector.text || "(all nodes)",
        namespaces: cfg.namespaces,
      },
      "cluster agent started",
    );
    this.nodeWatch.start();
    for (const w of this.podWatches) w.start();
    this.monitor.start();
    this.registration.start();
    this.queue.start();
    this.heartbeat.start();
    this.status.start();
  }

  /** Stop taking work, finish what is in hand, clear every timer. Idempotent. */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      this.log.info("stopping");
      await this.queue.stop();
      await Promise.all([
        this.heartbeat.stop(),
        this.status.stop(),
        this.registration.stop(),
        this.monitor.stop(),
      ]);
      await Promise.all([this.nodeWatch.stop(), ...this.podWatches.map((w) => w.stop())]);
      await this.http?.close();
      this.log.info("stopped");
    })();
    return this.stopping;
  }

  // --- inventory ---------------------------------------------------------------------------

  private async lookupInventory(): Promise<GpuInventory> {
    const nodes = await this.core.listNode({ labelSelector: this.selector });
    return inventoryFromNodes(nodes.items, this.cfg.gpuTypeLabel);
  }

  /** Only node changes that could change the count trigger a lookup (heartbeats do not). */
  private nodeEvent(node: k8s.V1Node, kind: "add" | "update" | "delete"): void {
    const name = node.metadata?.name ?? "";
    const key = kind === "delete" ? "" : JSON.stringify(nodeGpus(node, this.cfg.gpuTypeLabel) ?? null);
    if (this.nodeSeen.get(name) === key) return;
    if (kind === "delete") this.nodeSeen.delete(name);
    else this.nodeSeen.set(name, key);
    this.monitor.trigger();
  }

  private inventoryChanged(inv: GpuInventory): void {
    this.metrics.gpus.reset();
    for (const t of inv.byType) this.metrics.gpus.set({ gpu_type: t.gpuType }, t.count);
    if (inv.total === 0 && !this.cfg.gracefulNoGpu) {
      const err = new Error("no GPUs in the cluster and --graceful-no-gpu is off");
      this.log.error(err.message);
      this.opts.onFatal?.(err);
    }
    this.registration.inventoryChanged();
    this.queue.poke();
  }

  /** GPU types to take deployment requests for: registered with the control plane and present now. */
  private deployTypes(): string[] {
    const registered = this.registration.installed?.capacity ?? [];
    const inv = this.monitor.current;
    if (!inv) return [];
    const present = new Set(inv.byType.filter((t) => t.count > 0).map((t) => t.gpuType));
    return registered.filter((t) => t.count > 0 && present.has(t.gpuType)).map((t) => t.gpuType);
  }

  private registrationState(s: RegistrationState): void {
    this.metrics.ready.set(s.ready ? 1 : 0);
    this.log.info(
      { ready: s.ready, reason: s.reason, hasCredentials: s.hasCredentials },
      s.ready ? "ready" : "not ready",
    );
    if (s.ready) {
      this.queue.resume();
      this.heartbeat.now();
    } else this.queue.pause();
    this.queue.poke();
  }

  // --- control plane calls -----------------------------------------------------------------

  private client(token: string): ControlPlaneClient {
    return new ControlPlaneClient({
      baseUrl: this.cfg.controlPlaneUrl,
      token,
      ...(this.fetchImpl ? { fetch: this.fetchImpl } : {}),
    });
  }

  private async register(capacity: GpuInventory["byType"], signal: AbortSignal): Promise<IssuedCredentials> {
    const r = await this.client(this.cfg.clusterToken).register(
      {
        clusterId: this.cfg.clusterId,
        ...(this.cfg.clusterName ? { name: this.cfg.clusterName } : {}),
        agentVersion: this.version,
        inventory: capacity,
        // With one workload namespace for every request, any request namespace will do.
        ...(this.cfg.workloadNamespace ? {} : { namespaces: this.cfg.namespaces }),
      },
      { signal },
    );
    this.serverHeartbeatMs = r.heartbeatIntervalSeconds * 1000;
    return {
      token: r.credentials.token,
      expiresAt: Date.parse(r.credentials.expiresAt),
      renewBeforeMs: r.renewBeforeSeconds * 1000,
    };
  }

  private async renew(token: string, signal: AbortSignal): Promise<IssuedCredentials> {
    const r = await this.client(token).renew(this.cfg.clusterId, { signal });
    return {
      token: r.credentials.token,
      expiresAt: Date.parse(r.credentials.expiresAt),
      renewBeforeMs: r.renewBeforeSeconds * 1000,
    };
  }

  /** A queue-credential call; a 401 means the credentials are gone and registration must run again. */
  private async withQueueToken<T>(fn: (c: ControlPlaneClient) => Promise<T>): Promise<T> {
    const token = this.registration.token;
    if (!token) throw new ControlPlaneError("no valid queue credentials", 401, { retryable: true });
    try {
      return await fn(this.client(token));
    } catch (err) {
      if (err instanceof ControlPlaneError && err.status === 401)
        this.registration.credentialsRejected(token);
      throw err;
    }
  }

  private heartbeatSnapshot(): HeartbeatRequest | undefined {
    const installed = this.registration.installed;
    if (!installed || this.registration.token === undefined) return undefined;
    // The registered capacity, not the live one: capacity changes go through registration only.
    return {
      inventory: installed.capacity,
      ready: this.registration.state.ready,
      paused: !this.queue.takingDeployments,
    };
  }

  private async applyInstruction(i: Instruction): Promise<void> {
    this.queue.cordon(i !== "none");
    if (i !== "drain") {
      this.draining = false;
      return;
    }
    if (this.draining) return;
    this.draining = true;
    try {
      const records = await this.workloads.listRecords();
      for (const rec of records.filter((r) => r.state === "applied")) {
        const removed = await this.requestLock.run(rec.requestId, async () => {
          // A termination may have removed it while this waited for the lock.
          const now = await this.workloads.readRecord(rec.requestId);
          if (now?.state !== "applied") return false;
          await this.workloads.remove(rec.requestId, rec.namespace, rec.name);
          await this.workloads.writeRecord({
            ...rec,
            state: "terminated",
            updatedAt: new Date().toISOString(),
          });
          return true;
        });
        if (!removed) continue;
        this.status.forget(rec.requestId);
        this.log.info(
          { requestId: rec.requestId, name: rec.name, namespace: rec.namespace },
          "drained: workload removed",
        );
        await this.status
          .reportNow(rec.requestId, {
            phase: "Failed",
            message: "removed: the cluster was drained",
            instances: [],
          })
          .catch((err: unknown) =>
            this.log.warn({ err: (err as Error).message }, "could not report the drained request"),
          );
      }
    } catch (err) {
      // The next drain instruction must try again.
      this.draining = false;
      throw err;
    }
  }

  // --- messages ----------------------------------------------------------------------------

  private async handle(queue: QueueName, msg: QueueMessage): Promise<void> {
    const body = msg.body;
    const log = this.log.child({
      queue,
      messageId: msg.messageId,
      requestId: body.requestId,
      name: body.name,
      namespace: body.namespace,
      receiveCount: msg.receiveCount,
    });
    const outcome = await this.requestLock.run(body.requestId, async () => {
      try {
        return body.kind === "deploy"
          ? await this.deploy(msg, body, log)
          : await this.terminate(msg, body, log);
      } catch (err) {
        // A passing failure (API server or control plane unreachable): offer it again soon.
        log.warn(
          { err: err instanceof Error ? err.message : String(err) },
          "could not handle the message; it will be retried",
        );
        await this.release(msg, RETRY_RELEASE_S, log);
        return "retry";
      }
    });
    this.metrics.messages.inc({ queue, outcome });
    this.opts.hooks?.handled?.(queue, msg, outcome);
  }

  private async deploy(msg: QueueMessage, req: DeploymentRequest, log: Logger): Promise<string> {
    if (this.handled.has(msg.messageId)) {
      log.info("redelivered message already handled; acknowledging it again");
      await this.ackTaken(msg, log);
      return "duplicate";
    }
    if (!this.queue.takingDeployments) {
      await this.release(msg, 0, log);
      return "released";
    }
    const inv = this.monitor.current;
    if (!inv || !fits(inv, req.gpuType, req.gpus, req.replicas)) {
      log.info(
        {
          gpuType: req.gpuType,
          gpus: req.gpus,
          replicas: req.replicas,
          have: inv ? describe(inv) : "unknown",
        },
        "no capacity for this request here; released",
      );
      await this.release(msg, NO_CAPACITY_RELEASE_S, log);
      return "skipped";
    }
    const namespace = this.workloads.targetNamespace(req);
    const refused = this.workloads.refusal(req);
    if (refused) {
      // Whatever the control plane sends, nothing is created outside the configured namespaces.
      log.warn({ target: namespace }, "request refused: its namespace is not one this agent deploys into");
      await this.status.reportNow(req.requestId, { phase: "Failed", message: refused, instances: [] });
      await this.ackTaken(msg, log);
      this.remember(msg.messageId);
      return "refused";
    }
    const existing = await this.workloads.readRecord(req.requestId);
    if (existing && existing.state !== "accepted") {
      // Durable dedupe: applied (or terminated, or failed) in an earlier delivery, perhaps by an
      // earlier run of the agent. Never create it again.
      log.info({ state: existing.state }, "request already handled; acknowledging without creating it again");
      await this.ackTaken(msg, log);
      this.remember(msg.messageId);
      return "duplicate";
    }
    const rec: RequestRecord = {
      requestId: req.requestId,
      messageId: msg.messageId,
      name: req.name,
      namespace,
      state: "accepted",
      updatedAt: new Date().toISOString(),
    };
    if (!existing) await this.workloads.writeRecord(rec);
    await this.opts.hooks?.beforeApply?.(req.requestId);
    try {
      await this.workloads.apply(req, msg.messageId);
    } catch (err) {
      const terminal =
        err instanceof OwnershipError ||
        err instanceof NamespaceNotAllowedError ||
        isTerminalApiError((err as Error).cause ?? err);
      if (!terminal) throw err;
      const message = (err as Error).message;
      log.warn({ err: message }, "request cannot be deployed here; reporting it failed");
      await this.workloads.writeRecord({ ...rec, state: "failed", updatedAt: new Date().toISOString() });
      await this.status.reportNow(req.requestId, { phase: "Failed", message, instances: [] });
      await this.ackTaken(msg, log);
      this.remember(msg.messageId);
      return "failed";
    }
    await this.workloads.writeRecord({ ...rec, state: "applied", updatedAt: new Date().toISOString() });
    log.info({ replicas: req.replicas, gpus: req.gpus, gpuType: req.gpuType }, "workload applied");
    await this.ackTaken(msg, log);
    this.remember(msg.messageId);
    await this.status
      .reportNow(req.requestId, {
        phase: "Accepted",
        message: `Deployment ${namespace}/${req.name}`,
        instances: [],
      })
      .catch((err: unknown) =>
        log.warn({ err: (err as Error).message }, "could not report acceptance; the next report will"),
      );
    this.status.enqueue(req.requestId);
    return "accepted";
  }

  private async terminate(msg: QueueMessage, req: TerminationRequest, log: Logger): Promise<string> {
    const rec = await this.workloads.readRecord(req.requestId);
    const namespace = rec?.namespace || this.workloads.targetNamespace(req);
    const name = rec?.name || req.name;
    // Outside the allowlist nothing was ever created (and the agent may not even read there).
    if (this.workloads.allows(namespace)) await this.workloads.remove(req.requestId, namespace, name);
    // A tombstone, so that a late redelivery of the deployment request is not deployed again.
    await this.workloads.writeRecord({
      requestId: req.requestId,
      messageId: rec?.messageId ?? "",
      name,
      namespace,
      state: "terminated",
      updatedAt: new Date().toISOString(),
    });
    this.status.forget(req.requestId);
    log.info("workload removed");
    await this.status
      .reportNow(req.requestId, { phase: "Terminated", message: "workload removed", instances: [] })
      .catch((err: unknown) => log.warn({ err: (err as Error).message }, "could not report the termination"));
    await this.ack(msg, log);
    return "terminated";
  }

  private remember(messageId: string): void {
    this.handled.add(messageId);
    if (this.handled.size > HANDLED_MEMORY) this.handled.delete(this.handled.values().next().value!);
  }

  /**
   * Acknowledges a deployment request this cluster has taken (its outcome is on record here). If
   * that fails the message must not be released: a released message counts as never taken, so
   * the control plane could hand it to another cluster, or end it without telling this one. Left
   * alone, it comes back after its visibility timeout and the record acknowledges it then.
   */
  private async ackTaken(msg: QueueMessage, log: Logger): Promise<void> {
    try {
      await this.ack(msg, log);
    } catch (err) {
      log.warn(
        { err: err instanceof Error ? err.message : String(err) },
        "could not acknowledge the request; it comes back after its visibility timeout and is acknowledged then",
      );
    }
  }

  private async ack(msg: QueueMessage, log: Logger): Promise<void> {
    const r = await this.withQueueToken((c) => c.ack(this.cfg.clusterId, [msg.receiptHandle]));
    for (const f of r.failed) log.warn({ reason: f.reason }, "acknowledgement refused");
  }

  private async release(msg: QueueMessage, delaySeconds: number, log: Logger): Promise<void> {
    try {
      await this.withQueueToken((c) => c.release(this.cfg.clusterId, msg.receiptHandle, { delaySeconds }));
    } catch (err) {
      // The visibility timeout makes it visible again anyway.
      log.warn(
        { err: (err as Error).message },
        "could not release the message; it returns after its visibility timeout",
      );
    }
  }
}
