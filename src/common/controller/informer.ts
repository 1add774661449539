/**
 * A cache of one kind of object kept by a list and a watch that restarts itself (ResilientWatch):
 * controllers read from it instead of the API server, and enqueue keys from its changes.
 */
import type * as k8s from "@kubernetes/client-node";
import type { Clock } from "../clock.js";
import type { Logger } from "../log.js";
import { ResilientWatch, makeInformer } from "../watch.js";

export type ChangeKind = "add" | "update" | "delete";

export interface InformerOptions<T extends k8s.KubernetesObject> {
  name: string;
  kc: k8s.KubeConfig;
  /** The watch path, e.g. `/api/v1/pods`. */
  path: string;
  list: k8s.ListPromise<T>;
  labelSelector?: string;
  fieldSelector?: string;
  clock: Clock;
  log: Logger;
  /** Called on every (re)connect, e.g. to count restarts. */
  onConnect?: () => void;
  onError?: () => void;
}

export class Informer<T extends k8s.KubernetesObject> {
  private readonly cache: k8s.ListWatch<T>;
  private readonly watch: ResilientWatch<T>;
  private readonly handlers: ((obj: T, kind: ChangeKind) => void)[] = [];
  private connected = false;

  constructor(o: InformerOptions<T>) {
    const list = async (): Promise<k8s.KubernetesListObject<T>> => {
      const l = await o.list();
      this.connected = true;
      return l;
    };
    this.cache = makeInformer<T>(o.kc, o.path, list, o.labelSelector, o.fieldSelector);
    this.cache.on("error", () => {
      this.connected = false;
      o.onError?.();
    });
    this.watch = new ResilientWatch<T>({
      name: o.name,
      clock: o.clock,
      log: o.log,
      informer: this.cache,
      onChange: (obj, kind) => {
        for (const h of this.handlers) h(obj, kind);
      },
      onConnect: () => {
        // A restarted watch resumes from its resourceVersion without listing again.
        this.connected = this.synced();
        o.onConnect?.();
      },
    });
  }

  /** Call `handler` on every change seen from now on. */
  onChange(handler: (obj: T, kind: ChangeKind) => void): this {
    this.handlers.push(handler);
    return this;
  }

  /** Listed at least once: the cache holds the state of the cluster as of that list or later. */
  synced(): boolean {
    return (this.cache as unknown as { latestResourceVersion(): string }).latestResourceVersion() !== "";
  }

  /** Listed, and the watch is up now (not restarting after an error). */
  healthy(): boolean {
    return this.synced() && this.connected;
  }

  list(): T[] {
    return [...this.cache.list()];
  }

  get(name: string, namespace?: string): T | undefined {
    return this.cache.get(name, namespace);
  }

  start(): void {
    this.watch.start();
  }

  stop(): Promise<void> {
    return this.watch.stop();
  }
}
