import * as k8s from "@kubernetes/client-node";
import type { Logger } from "../../common/log.js";
import { makeApiClient } from "../../common/kube.js";
import { Controller } from "../../common/controller/controller.js";
import { Informer } from "../../common/controller/informer.js";
import { resyncEvery } from "../../common/controller/resync.js";
import { LABEL_GATED, LABEL_HASH, LABEL_STORE, MODELCACHE } from "../../core/contract.js";
import { realClock, type Clock } from "../../common/clock.js";
import { reconcileHash, type ReleaseDeps } from "./release.js";
import type { ServerMetrics } from "../metrics.js";
import type { ModelCacheObject } from "../../common/modelcache.js";
import { parseModelCache } from "../../api/modelcache.js";

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

  constructor(private readonly o: ReleaseControllerOptions) {
    const clock = (this.clock = o.clock ?? realClock);
    const core = makeApiClient(o.kc, k8s.CoreV1Api);
    const coordination = makeApiClient(o.kc, k8s.CoordinationV1Api);
    const custom = makeApiClient(o.kc, k8s.CustomObjectsApi);
    const hashOf = (obj: k8s.KubernetesObject): string | undefined => obj.metadata?.labels?.[LABEL_HASH];
    // Every read of a pass, from the informers (listed before the workers start).
    const reads: ReleaseDeps["reads"] = {
      pods: (short) => this.informers.pods.list().filter((p) => hashOf(p) === short),
      lease: (name) => this.informers.leases.get(name, o.systemNamespace),
      // Checked against its schema, as a record read from the API server is.
      cache: (short) => {
        const c = this.informers.caches.get(short);
        return c && parseModelCache(c);
      },
    };
    const deps: ReleaseDeps = {
      reads,
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
      const short = hashOf(obj);
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
    const i = this.informers;
    this.cancelResync = resyncEvery({
      clock: this.clock,
      periodMs: this.o.resyncMs ?? 60_000,
      // Every hash an election, a follower or a record names, looked at again (a missed change, a
      // deadline no event marks, a pass that failed for good).
      keys: function* () {
        const gated = i.pods.list().filter((p) => p.metadata?.labels?.[LABEL_GATED] === "true");
        for (const obj of [...i.leases.list(), ...gated]) {
          const short = obj.metadata?.labels?.[LABEL_HASH];
          if (short) yield short;
        }
        for (const c of i.caches.list()) yield c.metadata.name!;
      },
      add: (key) => this.controller.add(key),
    });
  }

  async stop(): Promise<void> {
    this.cancelResync?.();
    await Promise.all(Object.values(this.informers).map((i) => i.stop()));
    await this.controller.stop();
  }
}
