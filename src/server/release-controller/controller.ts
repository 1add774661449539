import * as k8s from "@kubernetes/client-node";
import type { Logger } from "../../common/log.js";
import { makeApiClient } from "../../common/kube.js";
import { Controller } from "../../common/controller/controller.js";
import { Informer } from "../../common/controller/informer.js";
import { LABEL_GATED, LABEL_HASH, LABEL_STORE, MODELCACHE } from "../../core/contract.js";
import { realClock, type Clock } from "../../common/clock.js";
import { reconcileHash, type ReleaseDeps } from "./release.js";
import type { ServerMetrics } from "../metrics.js";
import type { ModelCacheObject } from "../../common/modelcache.js";

/** The objects the views are built from, as the controller's informers hold them. */
export interface CachedObjects {
  caches: ModelCacheObject[];
  leases: k8s.V1Lease[];
  pods: k8s.V1Pod[];
  /** The node agents' store Leases (use and budget of each node's store). */
  stores: k8s.V1Lease[];
}

export interface ReleaseControllerOptions {
  kc: k8s.KubeConfig;
  systemNamespace: string;
  log: Logger;
  metrics: ServerMetrics;
  clock?: Clock;
  workers?: number;
  leaderGraceMs?: number;
  recheckMs?: number;
  resyncMs?: number;
  /** Tests: hooks into the reconcile (see ReleaseDeps). */
  deps?: Partial<Pick<ReleaseDeps, "beforeEvict" | "onRestore">>;
}

/**
 * Watches everything that can change an election's outcome (the stamped pods, the election
 * Leases, the cache records) and reconciles per cache hash on the controller runtime.
 * Restart-safe: all state is re-derived from the cluster on start and on every resync.
 */
export class ReleaseController {
  private readonly controller: Controller;
  private readonly informers: {
    pods: Informer<k8s.V1Pod>;
    leases: Informer<k8s.V1Lease>;
    caches: Informer<ModelCacheObject>;
    stores: Informer<k8s.V1Lease>;
  };
  private readonly clock: Clock;
  private cancelResync: (() => void) | undefined;
  private stopped = false;

  constructor(private readonly o: ReleaseControllerOptions) {
    const clock = (this.clock = o.clock ?? realClock);
    const core = makeApiClient(o.kc, k8s.CoreV1Api);
    const coordination = makeApiClient(o.kc, k8s.CoordinationV1Api);
    const custom = makeApiClient(o.kc, k8s.CustomObjectsApi);
    const deps: ReleaseDeps = {
      core,
      coordination,
      custom,
      systemNamespace: o.systemNamespace,
      log: o.log,
      now: () => clock.now(),
      leaderGraceMs: o.leaderGraceMs ?? 30_000,
      recheckMs: o.recheckMs ?? 15_000,
      onRelease: (_h, n) => o.metrics.released.inc(n),
      // The reason, never the message: a message names pods, and a label value per pod grows without bound.
      onRetire: (_h, reason) => o.metrics.retired.inc({ why: reason }),
      onEvict: (_h, n) => o.metrics.evicted.inc(n),
      ...o.deps,
    };
    const common = { kc: o.kc, clock, log: o.log };
    const leasesPath = `/apis/coordination.k8s.io/v1/namespaces/${o.systemNamespace}/leases`;
    const listLeases = (labelSelector: string) => () =>
      coordination.listNamespacedLease({ namespace: o.systemNamespace, labelSelector });
    this.informers = {
      pods: new Informer<k8s.V1Pod>({
        ...common,
        name: "pods",
        path: "/api/v1/pods",
        list: () => core.listPodForAllNamespaces({ labelSelector: LABEL_HASH }),
        labelSelector: LABEL_HASH,
      }),
      leases: new Informer<k8s.V1Lease>({
        ...common,
        name: "leases",
        path: leasesPath,
        list: listLeases(LABEL_HASH),
        labelSelector: LABEL_HASH,
      }),
      caches: new Informer<ModelCacheObject>({
        ...common,
        name: "modelcaches",
        path: `/apis/${MODELCACHE.group}/${MODELCACHE.version}/${MODELCACHE.plural}`,
        list: () =>
          custom.listClusterCustomObject({
            group: MODELCACHE.group,
            version: MODELCACHE.version,
            plural: MODELCACHE.plural,
          }) as Promise<k8s.KubernetesListObject<ModelCacheObject>>,
      }),
      // The stores are only shown, never reconciled.
      stores: new Informer<k8s.V1Lease>({
        ...common,
        name: "store leases",
        path: leasesPath,
        list: listLeases(LABEL_STORE),
        labelSelector: LABEL_STORE,
      }),
    };
    const i = this.informers;
    this.controller = new Controller({
      name: "release",
      reconcile: (short) => reconcileHash(short, deps),
      log: o.log,
      clock,
      registry: o.metrics.registry,
      workers: o.workers ?? 4,
      synced: [() => i.pods.synced(), () => i.leases.synced(), () => i.caches.synced()],
    });
    const byLabel = (obj: k8s.KubernetesObject): void => {
      const short = obj.metadata?.labels?.[LABEL_HASH];
      if (short) this.controller.add(short);
    };
    i.pods.onChange(byLabel);
    i.leases.onChange(byLabel);
    i.caches.onChange((c) => this.controller.add(c.metadata.name!));
  }

  /**
   * The watched objects from the informers' caches, without a call to the API server; undefined
   * until each informer has listed once (an empty cache then would show an empty cluster).
   */
  cached(): CachedObjects | undefined {
    const i = this.informers;
    if (![i.pods, i.leases, i.caches, i.stores].every((x) => x.synced())) return undefined;
    return { pods: i.pods.list(), leases: i.leases.list(), caches: i.caches.list(), stores: i.stores.list() };
  }

  start(): void {
    for (const i of Object.values(this.informers)) i.start();
    void this.controller.start();
    this.resync();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    this.cancelResync?.();
    await Promise.all(Object.values(this.informers).map((i) => i.stop()));
    await this.controller.stop();
  }

  /**
   * Every hash the cluster names, looked at again (a missed change is caught here): from fresh
   * lists, not the informers, so a watch that silently fell behind cannot hide an election.
   */
  private resync(): void {
    if (this.stopped) return;
    this.resyncAll()
      .catch((err: unknown) => this.o.log.warn({ err }, "resync failed; the next one retries"))
      .finally(() => {
        if (!this.stopped)
          this.cancelResync = this.clock.setTimeout(() => this.resync(), this.o.resyncMs ?? 60_000);
      });
  }

  private async resyncAll(): Promise<void> {
    const { kc, systemNamespace } = this.o;
    const core = makeApiClient(kc, k8s.CoreV1Api);
    const coordination = makeApiClient(kc, k8s.CoordinationV1Api);
    const custom = makeApiClient(kc, k8s.CustomObjectsApi);
    const [leases, caches, gated] = await Promise.all([
      coordination.listNamespacedLease({ namespace: systemNamespace, labelSelector: LABEL_HASH }),
      custom.listClusterCustomObject({
        group: MODELCACHE.group,
        version: MODELCACHE.version,
        plural: MODELCACHE.plural,
      }) as Promise<{ items: k8s.KubernetesObject[] }>,
      core.listPodForAllNamespaces({ labelSelector: `${LABEL_GATED}=true` }),
    ]);
    for (const obj of [...leases.items, ...gated.items]) {
      const short = obj.metadata?.labels?.[LABEL_HASH];
      if (short) this.controller.add(short);
    }
    for (const c of caches.items) this.controller.add(c.metadata!.name!);
  }
}
