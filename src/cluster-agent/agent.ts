/**
 * The GPU-aware cluster agent, wired together: a node watch and poll feed the GPU monitor; the
 * registration manager turns accepted GPU states into registrations and keeps credentials fresh;
 * readiness gates the deployment queue; terminations, heartbeats and status reports run beside.
 * Queue messages are handled in messages.ts, the control plane's instruction in instructions.ts,
 * and every call to the control plane goes through control-plane-link.ts.
 */
import { readFileSync } from "node:fs";
import * as k8s from "@kubernetes/client-node";
import { loadKubeConfig } from "../common/kube.js";
import { createLogger, type Logger } from "../common/log.js";
import type { HeartbeatRequest } from "../control-plane/api.js";
import { fetchTrusting } from "../control-plane/client.js";
import { realClock, type Clock } from "../common/clock.js";
import type { AgentConfig } from "./config.js";
import { ControlPlaneLink } from "./control-plane-link.js";
import { SecretStore, type InstalledCredentials } from "./credentials.js";
import { Heartbeat } from "./heartbeat.js";
import { InstructionHandler } from "./instructions.js";
import { ResilientWatch, makeInformer } from "../common/watch.js";
import { inventoryFromNodes, nodeGpus, type GpuInventory } from "./inventory.js";
import { MessageHandler, type MessageHooks } from "./messages.js";
import { createMetrics, type AgentMetrics } from "./metrics.js";
import { GpuMonitor } from "./monitor.js";
import { QueueConsumer } from "./queue.js";
import { RegistrationManager, type RegistrationState } from "./registration.js";
import { formatSelector } from "./selector.js";
import { startHttp, type Health, type HttpHandle } from "./server.js";
import { StatusReporter } from "./status.js";
import { RequestLock } from "./request-lock.js";
import { LABEL_REQUEST_ID, Workloads } from "./workloads.js";

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

/** Points where tests hold the agent to play a race deterministically. */
export interface AgentHooks extends MessageHooks {
  /** An operation on a request waits because another one on the same request is running. */
  requestLockWait?(requestId: string): void;
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
  /** The node selector in the API server's syntax (undefined: every node). */
  private readonly selector: string | undefined;
  private readonly nodeSeen = new Map<string, string>();
  private readonly link: ControlPlaneLink;
  private readonly messages: MessageHandler;
  private readonly instructions: InstructionHandler;
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
    this.link = new ControlPlaneLink({
      cfg,
      version: this.version,
      fetch:
        opts.fetch ??
        (cfg.controlPlaneCaFile ? fetchTrusting(readFileSync(cfg.controlPlaneCaFile)) : undefined),
      token: () => this.registration.token,
      rejected: (token) => this.registration.credentialsRejected(token),
    });
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
        register: (capacity, signal) => this.link.register(capacity, signal),
        renew: (token, signal) => this.link.renew(token, signal),
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
          this.link.withQueueToken(async (c) => (await c.receive(cfg.clusterId, req, { signal })).messages),
      },
      handle: (queue, msg) => this.messages.handle(queue, msg),
    });

    this.status = new StatusReporter({
      clock: this.clock,
      log: log.child({ component: "status" }),
      workloads: this.workloads,
      resyncMs: cfg.statusInterval,
      registry: m.registry,
      hasCredentials: () => this.registration.token !== undefined,
      report: async (requestId, report) => {
        await this.link.withQueueToken((c) => c.reportStatus(requestId, report));
      },
    });

    this.messages = new MessageHandler({
      log,
      workloads: this.workloads,
      status: this.status,
      requestLock: this.requestLock,
      metrics: m,
      takingDeployments: () => this.queue.takingDeployments,
      inventory: () => this.monitor.current,
      controlPlane: {
        ack: (receiptHandle) => this.link.withQueueToken((c) => c.ack(cfg.clusterId, [receiptHandle])),
        release: (receiptHandle, delaySeconds) =>
          this.link.withQueueToken((c) => c.release(cfg.clusterId, receiptHandle, { delaySeconds })),
      },
      hooks: opts.hooks,
    });

    this.instructions = new InstructionHandler({
      log,
      workloads: this.workloads,
      status: this.status,
      requestLock: this.requestLock,
      cordon: (on) => this.queue.cordon(on),
    });

    this.heartbeat = new Heartbeat({
      clock: this.clock,
      log: log.child({ component: "heartbeat" }),
      intervalMs: () => cfg.heartbeatInterval ?? this.link.serverHeartbeatMs,
      snapshot: () => this.heartbeatSnapshot(),
      send: async (hb, signal) =>
        (await this.link.withQueueToken((c) => c.heartbeat(cfg.clusterId, hb, { signal }))).instruction,
      onInstruction: (i) => this.instructions.apply(i),
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
      this.log.warn({ err }, "could not read saved credentials; will register");
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
      this.log.error({ err }, err.message);
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
}
