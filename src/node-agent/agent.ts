/**
 * The node agent (ADR 0006), wired: a pod reconciler (`namespace/name`) starts a capture job per
 * elected leader past its warm-up; a job copies its cache into the store and enqueues the cache;
 * a cache reconciler (short hash) promotes committed trees, keeps claims, records this node's
 * copies for peers (ADR 0010) and removes deleted caches' trees. Reads come from informers; what
 * must survive a restart is in the record or the store.
 */
import * as k8s from "@kubernetes/client-node";
import { CacheRecords } from "../common/cache-record.js";
import { realClock, type Clock } from "../common/clock.js";
import { Controller, type Reconciler } from "../common/controller/controller.js";
import type { Informer } from "../common/controller/informer.js";
import { makeApiClient } from "../common/kube.js";
import { createLogger, type Logger } from "../common/log.js";
import { storeFinalizer, type ModelCacheObject } from "../common/modelcache.js";
import { promoteClients } from "../promote/claims.js";
import { StorageProfiles } from "../promote/profiles.js";
import { removeTree, StoreBudget } from "./budget.js";
import { cacheReconciler, cacheReconcilerDeps } from "./cache-reconciler.js";
import { CaptureJobs } from "./capture-jobs.js";
import { WaitingFills } from "./fills.js";
import { LABEL_HASH, LABEL_WAITING } from "../core/contract.js";
import { storeDriverFor } from "./csi/serve.js";
import type { NodeAgentConfig } from "./config.js";
import { observedMarks, type CaptureMarks } from "./marks.js";
import { agentInformers } from "./informers.js";
import { createNodeAgentMetrics, type NodeAgentMetrics } from "./metrics.js";
import type { AgentParts, NodeAgentHooks } from "./parts.js";
import { podReconciler, podReconcilerDeps } from "./pod-reconciler.js";
import { PeerServing } from "./peers.js";
import { Promoter } from "./promoter.js";
import { CacheStore } from "./store.js";
import { publishStoreQuietly, StoreStorageInfo } from "./store-lease.js";

export type { NodeAgentHooks } from "./parts.js";

export interface NodeAgentOptions {
  cfg: NodeAgentConfig;
  kc: k8s.KubeConfig;
  log?: Logger;
  metrics?: NodeAgentMetrics;
  hooks?: NodeAgentHooks;
  clock?: Clock;
}

export class NodeAgent {
  readonly marks: CaptureMarks;
  readonly metrics: NodeAgentMetrics;
  readonly store: CacheStore;
  readonly budget: StoreBudget;
  private readonly p: AgentParts;
  private readonly pods: Informer<k8s.V1Pod>;
  private readonly caches: Informer<ModelCacheObject>;
  private readonly podController: Controller;
  private readonly cacheController: Controller;
  private readonly jobs: CaptureJobs;
  private readonly fills: WaitingFills;
  private readonly fillController: Controller;
  private readonly peers: PeerServing | undefined;
  private readonly csi: ReturnType<typeof storeDriverFor>;
  private stopped = true;
  private lastResync = 0;
  private cancelResync: (() => void) | undefined;

  constructor(o: NodeAgentOptions) {
    const { cfg, kc } = o;
    const clock = o.clock ?? realClock;
    const log = (o.log ?? createLogger("node-agent")).child({ node: cfg.node });
    const metrics = (this.metrics = o.metrics ?? createNodeAgentMetrics());
    const core = makeApiClient(kc, k8s.CoreV1Api);
    const clients = promoteClients(kc);
    this.marks = observedMarks(metrics, log);
    this.store = new CacheStore(cfg.store);
    const informers = { kc, node: cfg.node, core, custom: clients.custom, clock, log, metrics };
    ({ pods: this.pods, caches: this.caches } = agentInformers(informers));
    const p = (this.p = {
      ...{ cfg, log, metrics, clock, core, clients, store: this.store, marks: this.marks },
      hooks: o.hooks ?? {},
      coordination: makeApiClient(kc, k8s.CoordinationV1Api),
      records: new CacheRecords(clients.custom),
      finalizer: storeFinalizer(cfg.node),
      record: (short: string) => this.caches.get(short),
      pod: (namespace: string, name: string) => this.pods.get(name, namespace),
    });
    const storage = new StoreStorageInfo(cfg, kc, new StorageProfiles(core, cfg.systemNamespace, log));
    const peers = (this.peers = PeerServing.from(p, kc, metrics.replication));
    const promoter = new Promoter(p, storage);
    const busy = (short: string): boolean =>
      this.jobs.busyWith(short) || this.fills.busyWith(short) || this.cacheController.queue.isActive(short);
    this.budget = new StoreBudget(p, {
      busy,
      removeTree: (short, why) => this.removeTree(short, why),
      scopeShare: cfg.storeScopeShare,
    });
    const fetched = (short: string): void => this.cacheController.add(short);
    this.csi = storeDriverFor(p, { budget: this.budget, peers, fetched });
    this.fills = new WaitingFills(p, {
      budget: this.budget,
      peers,
      fetched,
      ended: (podKey, retryMs) =>
        retryMs ? this.fillController.addAfter(podKey, retryMs) : this.fillController.add(podKey),
    });
    this.jobs = new CaptureJobs(p, {
      budget: this.budget,
      storage,
      storeChanged: () => publishStoreQuietly(this.p),
      ended: (podKey, short) => {
        this.podController.add(podKey);
        this.cacheController.add(short);
      },
    });
    const synced = [(): boolean => this.pods.synced(), (): boolean => this.caches.synced()];
    const controller = (name: string, reconcile: Reconciler, workers: number): Controller =>
      new Controller({ name, reconcile, log, clock, registry: metrics.registry, workers, synced });
    this.podController = controller(
      "node-agent-pods",
      podReconciler(
        podReconcilerDeps(p, {
          startCapture: (mark, pod, election) => this.jobs.start(mark, pod, election),
          enqueueCache: (short) => this.cacheController.add(short),
        }),
      ),
      4,
    );
    this.cacheController = controller(
      "node-agent-caches",
      cacheReconciler(
        cacheReconcilerDeps(p, {
          promoter,
          peers,
          capturing: (short) => this.jobs.busyWith(short),
          removeTree: (short, why) => this.removeTree(short, why, { unlessMounted: true }),
          lastResync: () => this.lastResync,
        }),
      ),
      2,
    );
    this.fillController = controller("node-agent-waiting-followers", this.fills.reconcile, 2);
    const keyOf = (pod: k8s.V1Pod): string => `${pod.metadata?.namespace}/${pod.metadata?.name}`;
    const waiting = (pod: k8s.V1Pod): boolean => pod.metadata?.labels?.[LABEL_WAITING] === "true";
    this.pods.onChange((pod) => {
      this.podController.add(keyOf(pod));
      if (waiting(pod)) this.fillController.add(keyOf(pod));
    });
    this.caches.onChange((c) => {
      this.cacheController.add(c.metadata.name!);
      // Its waiting followers on this node: the record turning Ready (or Failed) is their cue.
      for (const pod of this.pods.list())
        if (waiting(pod) && pod.metadata?.labels?.[LABEL_HASH] === c.metadata.name)
          this.fillController.add(keyOf(pod));
    });
  }

  async start(): Promise<void> {
    if (!this.stopped) return;
    this.stopped = false;
    await this.store.init();
    const peers = await this.peers?.start();
    await this.csi?.start();
    this.pods.start();
    this.caches.start();
    void this.podController.start();
    void this.cacheController.start();
    void this.fillController.start();
    this.scheduleResync();
    await publishStoreQuietly(this.p);
    const { store, storeBudget: budget, warmupMs, concurrency } = this.p.cfg;
    this.p.log.info({ store, budget, warmupMs, concurrency, peers }, "node agent watching pods on its node");
  }

  async stop(): Promise<void> {
    if (this.stopped) return;
    this.stopped = true;
    this.cancelResync?.();
    await Promise.all([this.pods.stop(), this.caches.stop()]);
    // A capture in progress stops cleanly (its staging tree removed, nothing committed).
    await Promise.all([
      this.podController.stop(),
      this.cacheController.stop(),
      this.fillController.stop(),
      this.jobs.stopAll(),
      this.fills.stopAll(),
    ]);
    await Promise.all([this.peers?.stop(), this.csi?.stop()]);
  }

  health(): { ready: boolean; reason: string; inProgress: number; committed: number } {
    const ready = !this.stopped && this.pods.healthy();
    return {
      ready,
      reason: ready ? "watching pods" : this.stopped ? "stopped" : "pod watch not connected",
      inProgress: this.marks.inProgressCount,
      committed: this.marks.committedCount,
    };
  }

  /**
   * Everything again, level-based: every pod on the node (a missed transition is caught here) and
   * every tree in the store, then the store's use published.
   */
  async resync(): Promise<void> {
    this.lastResync = this.p.clock.now();
    for (const pod of this.pods.list()) {
      this.podController.add(`${pod.metadata?.namespace}/${pod.metadata?.name}`);
      if (pod.metadata?.labels?.[LABEL_WAITING] === "true")
        this.fillController.add(`${pod.metadata?.namespace}/${pod.metadata?.name}`);
    }
    for (const { short } of await this.store.list()) this.cacheController.add(short);
    await publishStoreQuietly(this.p);
  }

  /** Until no reconcile is due now and no capture runs (tests wait on this). */
  async idle(): Promise<void> {
    const controllers = [this.podController, this.cacheController, this.fillController];
    while (!controllers.every((c) => c.queue.idle) || this.jobs.size || this.fills.size)
      await Promise.all([...controllers.map((c) => c.idle()), this.jobs.idle(), this.fills.idle()]);
  }

  private removeTree(short: string, why: string, o: { unlessMounted?: boolean } = {}): Promise<void> {
    return removeTree(this.p, short, why, {
      ...o,
      removed: async () => this.peers?.forget(this.p.records, short),
      stopCaptures: () => this.jobs.stopFor(short, "cache-deleted"),
      storeChanged: () => publishStoreQuietly(this.p),
    });
  }

  private scheduleResync(): void {
    this.cancelResync = this.p.clock.setTimeout(() => {
      if (this.stopped) return;
      this.resync()
        .catch((err: unknown) => this.p.log.warn({ err }, "resync failed; the next one retries"))
        .finally(() => !this.stopped && this.scheduleResync());
    }, this.p.cfg.resyncMs);
  }
}
