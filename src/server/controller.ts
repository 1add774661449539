import * as k8s from "@kubernetes/client-node";
import type { Logger } from "../common/log.js";
import { makeApiClient } from "../common/kube.js";
import { WorkQueue } from "../common/workqueue.js";
import { LABEL_GATED, LABEL_HASH, LABEL_STORE, MODELCACHE } from "../core/contract.js";
import { ResilientWatch, makeInformer } from "../common/watch.js";
import { realClock } from "../common/clock.js";
import { reconcileHash, type ReleaseDeps } from "./release.js";
import type { ServerMetrics } from "./metrics.js";
import type { ModelCacheObject } from "../common/modelcache.js";

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
  workers?: number;
  leaderGraceMs?: number;
  recheckMs?: number;
  resyncMs?: number;
  /** Tests: hooks into the reconcile (see ReleaseDeps). */
  deps?: Partial<Pick<ReleaseDeps, "beforeEvict" | "onRestore">>;
}

/**
 * Watches everything that can change an election's outcome (the stamped pods, the election
 * Leases, the cache records) and reconciles per cache hash. Restart-safe: all state is re-derived
 * from the cluster on start and on every resync.
 */
export class ReleaseController {
  private readonly queue: WorkQueue;
  private readonly watches: ResilientWatch<k8s.KubernetesObject>[] = [];
  private readonly informers: {
    pods: k8s.ObjectCache<k8s.V1Pod> & { latestResourceVersion(): string };
    leases: k8s.ObjectCache<k8s.V1Lease> & { latestResourceVersion(): string };
    caches: k8s.ObjectCache<k8s.KubernetesObject> & { latestResourceVersion(): string };
    stores: k8s.ObjectCache<k8s.V1Lease> & { latestResourceVersion(): string };
  };
  private resync: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;

  constructor(private readonly o: ReleaseControllerOptions) {
    const core = makeApiClient(o.kc, k8s.CoreV1Api);
    const coordination = makeApiClient(o.kc, k8s.CoordinationV1Api);
    const custom = makeApiClient(o.kc, k8s.CustomObjectsApi);
    const deps: ReleaseDeps = {
      core,
      coordination,
      custom,
      systemNamespace: o.systemNamespace,
      log: o.log,
      now: Date.now,
      leaderGraceMs: o.leaderGraceMs ?? 30_000,
      recheckMs: o.recheckMs ?? 15_000,
      onRelease: (_h, n) => o.metrics.released.inc(n),
      // The reason, never the message: a message names pods, and a label value per pod grows without bound.
      onRetire: (_h, reason) => o.metrics.retired.inc({ why: reason }),
      onEvict: (_h, n) => o.metrics.evicted.inc(n),
      ...o.deps,
    };
    this.queue = new WorkQueue(
      async (short) => {
        const end = o.metrics.reconcileSeconds.startTimer();
        try {
          return await reconcileHash(short, deps);
        } finally {
          end();
        }
      },
      {
        workers: o.workers ?? 4,
        onError: (key, err) => {
          o.metrics.reconcileErrors.inc();
          o.log.warn(
            { hash: key, err: err instanceof Error ? err.message : String(err) },
            "reconcile failed; will retry",
          );
        },
      },
    );

    const enqueue = (obj: k8s.KubernetesObject): void => {
      const short =
        obj.metadata?.labels?.[LABEL_HASH] ?? (obj.kind === MODELCACHE.kind ? obj.metadata?.name : undefined);
      if (short) this.queue.add(short);
    };
    const pods = makeInformer(
      o.kc,
      "/api/v1/pods",
      () => core.listPodForAllNamespaces({ labelSelector: LABEL_HASH }),
      LABEL_HASH,
    );
    const leases = makeInformer(
      o.kc,
      `/apis/coordination.k8s.io/v1/namespaces/${o.systemNamespace}/leases`,
      () => coordination.listNamespacedLease({ namespace: o.systemNamespace, labelSelector: LABEL_HASH }),
      LABEL_HASH,
    );
    const caches = makeInformer(
      o.kc,
      `/apis/${MODELCACHE.group}/${MODELCACHE.version}/${MODELCACHE.plural}`,
      () =>
        custom.listClusterCustomObject({
          group: MODELCACHE.group,
          version: MODELCACHE.version,
          plural: MODELCACHE.plural,
        }) as Promise<k8s.KubernetesListObject<k8s.KubernetesObject>>,
    );
    const stores = makeInformer(
      o.kc,
      `/apis/coordination.k8s.io/v1/namespaces/${o.systemNamespace}/leases`,
      () => coordination.listNamespacedLease({ namespace: o.systemNamespace, labelSelector: LABEL_STORE }),
      LABEL_STORE,
    );
    this.informers = {
      pods: listWatch(pods, "pods"),
      leases: listWatch(leases, "leases"),
      caches: listWatch(caches, "modelcaches"),
      stores: listWatch(stores, "store leases"),
    };
    // The stores are only shown, never reconciled.
    this.watches.push(
      new ResilientWatch<k8s.KubernetesObject>({
        name: "store leases",
        clock: realClock,
        log: o.log,
        informer: stores,
        onChange: () => undefined,
      }),
    );
    for (const [name, informer] of [
      ["pods", pods],
      ["leases", leases],
      ["modelcaches", caches],
    ] as const) {
      const watch = new ResilientWatch<k8s.KubernetesObject>({
        name,
        clock: realClock,
        log: o.log,
        informer: informer,
        onChange: (obj) => enqueue({ ...obj, kind: name === "modelcaches" ? MODELCACHE.kind : obj.kind }),
      });
      this.watches.push(watch);
    }
    this.resyncAll = async (): Promise<void> => {
      const [l, c] = await Promise.all([
        coordination.listNamespacedLease({ namespace: o.systemNamespace, labelSelector: LABEL_HASH }),
        custom.listClusterCustomObject({
          group: MODELCACHE.group,
          version: MODELCACHE.version,
          plural: MODELCACHE.plural,
        }) as Promise<{ items: k8s.KubernetesObject[] }>,
      ]);
      for (const lease of l.items) enqueue(lease);
      for (const cache of c.items) this.queue.add(cache.metadata!.name!);
      const gated = await core.listPodForAllNamespaces({ labelSelector: `${LABEL_GATED}=true` });
      for (const p of gated.items) enqueue(p);
    };
  }

  private readonly resyncAll: () => Promise<void>;

  /**
   * The watched objects from the informers' caches, without a call to the API server; undefined
   * until each informer has listed once (an empty cache then would show an empty cluster).
   */
  cached(): CachedObjects | undefined {
    const i = this.informers;
    if ([i.pods, i.leases, i.caches, i.stores].some((x) => x.latestResourceVersion() === ""))
      return undefined;
    return {
      pods: [...i.pods.list()],
      leases: [...i.leases.list()],
      caches: [...i.caches.list()] as ModelCacheObject[],
      stores: [...i.stores.list()],
    };
  }

  start(): void {
    for (const w of this.watches) w.start();
    this.running = this.queue.run();
    const resync = (): void => {
      this.resyncAll().catch((err: unknown) => this.o.log.warn({ err }, "resync failed"));
    };
    resync();
    this.resync = setInterval(resync, this.o.resyncMs ?? 60_000);
  }

  async stop(): Promise<void> {
    clearInterval(this.resync);
    this.queue.stop();
    await Promise.all(this.watches.map((w) => w.stop()));
    await this.running;
  }
}

/**
 * client-node's informers are ListWatches: caches that also tell the resourceVersion they last saw
 * ("" until their first list). The type only promises an ObjectCache, so check for it once here.
 */
function listWatch<T>(
  informer: k8s.ObjectCache<T>,
  name: string,
): k8s.ObjectCache<T> & { latestResourceVersion(): string } {
  if (typeof (informer as { latestResourceVersion?: unknown }).latestResourceVersion !== "function")
    throw new Error(`the ${name} informer keeps no resourceVersion; client-node changed`);
  return informer as k8s.ObjectCache<T> & { latestResourceVersion(): string };
}
