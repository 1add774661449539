/**
 * What admission reads from the cluster besides caches and Leases, each with a short cache so the
 * hot path costs no API call per pod: a namespace's labels (opt-out, share-group), the
 * cache-env template ConfigMap, and the device classes of a pod's DRA claims.
 */
import type * as k8s from "@kubernetes/client-node";
import { CACHE_ENV_CONFIGMAP } from "../core/contract.js";
import { parseCacheEnvTemplate } from "../core/cacheenv.js";
import type { ClaimRef } from "../core/classify.js";
import { DEFAULT_CACHE_ENV_TEMPLATE, type CacheEnvTemplate } from "../core/decorate.js";
import { claimDeviceClasses, claimKey, gpuClassesOf, isGpuDeviceClass } from "../core/gpu.js";
import { isRecord } from "../core/guards.js";
import { apiError, apiErrorInfo, isNotFound } from "../common/kube.js";
import type { Logger } from "../common/log.js";
import { TtlCache } from "../common/ttl-cache.js";

export { TtlCache };

/** A namespace's labels; a namespace that does not exist has none. */
export function namespaceLabels(
  core: k8s.CoreV1Api,
  log: Logger,
  ttlMs: number,
): TtlCache<Record<string, string>> {
  return new TtlCache(
    ttlMs,
    async (name) => {
      try {
        return (await core.readNamespace({ name })).metadata?.labels ?? {};
      } catch (err) {
        if (isNotFound(err)) return {};
        throw apiError(`reading namespace ${name}`, err);
      }
    },
    (name, err) => log.warn({ namespace: name, err }, "namespace unreadable; using its labels as last read"),
  );
}

/**
 * The cache-env template: ConfigMap `warmstart-cache-env` in the system namespace, or the built-in
 * one when there is none. A ConfigMap with any bad entry is refused as a whole (a template half
 * applied would scatter caches), reported once in the log and by `onInvalid`, and the built-in
 * template is used.
 */
export class CacheEnvConfig {
  private readonly cache: TtlCache<CacheEnvTemplate>;
  private lastReport = "";

  constructor(
    private readonly core: k8s.CoreV1Api,
    private readonly namespace: string,
    private readonly log: Logger,
    ttlMs: number,
    private readonly onInvalid: (invalid: boolean) => void = () => {},
  ) {
    this.cache = new TtlCache(
      ttlMs,
      () => this.load(),
      (_k, err) => log.warn({ err }, "cache-env ConfigMap unreadable; using the template last read"),
    );
  }

  template(): Promise<CacheEnvTemplate> {
    return this.cache.get("");
  }

  private async load(): Promise<CacheEnvTemplate> {
    let data: Record<string, string> | undefined;
    try {
      data = (
        await this.core.readNamespacedConfigMap({ name: CACHE_ENV_CONFIGMAP, namespace: this.namespace })
      ).data;
    } catch (err) {
      if (!isNotFound(err)) throw apiError(`reading ConfigMap ${this.namespace}/${CACHE_ENV_CONFIGMAP}`, err);
      this.report("");
      return DEFAULT_CACHE_ENV_TEMPLATE;
    }
    const { template, errors } = parseCacheEnvTemplate(data);
    this.report(errors.join("; "));
    return errors.length ? DEFAULT_CACHE_ENV_TEMPLATE : template;
  }

  private report(errors: string): void {
    this.onInvalid(errors !== "");
    if (errors === this.lastReport) return;
    this.lastReport = errors;
    if (errors)
      this.log.error(
        { configMap: `${this.namespace}/${CACHE_ENV_CONFIGMAP}`, errors },
        "invalid cache-env template refused; using the built-in one",
      );
    else this.log.info({ configMap: CACHE_ENV_CONFIGMAP }, "cache-env template in use");
  }
}

/**
 * What admission reads of Dynamic Resource Allocation (resource.k8s.io). A claim that does not
 * exist reads as undefined; so does every kind when the cluster serves no DRA version.
 */
export interface DraApi {
  readClaimTemplate(namespace: string, name: string): Promise<unknown>;
  readClaim(namespace: string, name: string): Promise<unknown>;
  listDeviceClasses(): Promise<unknown[]>;
}

/** Whether an API error's Status names an object (`details.name`): it is about that object, not the API. */
function namesObject(err: unknown): boolean {
  let body = (err as { body?: unknown } | undefined)?.body;
  if (typeof body === "string") {
    try {
      body = JSON.parse(body);
    } catch {
      return false;
    }
  }
  return (
    isRecord(body) &&
    isRecord(body.details) &&
    typeof body.details.name === "string" &&
    body.details.name !== ""
  );
}

/**
 * The DRA API at resource.k8s.io/v1 (Kubernetes 1.34 on), or v1beta1 where v1 is not served
 * (1.32 and 1.33 with DRA enabled).
 */
export function draApi(v1: k8s.ResourceV1Api, v1beta1: k8s.ResourceV1beta1Api): DraApi {
  const read = async <T>(what: string, versions: Array<() => Promise<T>>): Promise<T | undefined> => {
    for (const call of versions) {
      try {
        return await call();
      } catch (err) {
        if (apiErrorInfo(err).code !== 404) throw apiError(`reading ${what}`, err);
        // A Status that names the object: no such object. Any other 404: this version is not served.
        if (namesObject(err)) return undefined;
      }
    }
    return undefined;
  };
  return {
    readClaimTemplate: (namespace, name) =>
      read(`ResourceClaimTemplate ${namespace}/${name}`, [
        () => v1.readNamespacedResourceClaimTemplate({ namespace, name }),
        () => v1beta1.readNamespacedResourceClaimTemplate({ namespace, name }),
      ]),
    readClaim: (namespace, name) =>
      read(`ResourceClaim ${namespace}/${name}`, [
        () => v1.readNamespacedResourceClaim({ namespace, name }),
        () => v1beta1.readNamespacedResourceClaim({ namespace, name }),
      ]),
    listDeviceClasses: async () =>
      (
        await read<{ items: unknown[] }>("DeviceClasses", [
          () => v1.listDeviceClass(),
          () => v1beta1.listDeviceClass(),
        ])
      )?.items ?? [],
  };
}

/**
 * Which of a pod's DRA claims ask for NVIDIA GPUs, from the claims' objects and the cluster's
 * DeviceClasses, never from the names a pod's author gives them. A claim or class that does not
 * exist holds no GPU; a read that fails with nothing read before throws, and the caller admits
 * the pod as it is (fail open).
 */
export class DraLookups {
  private readonly claims: TtlCache<readonly string[]>;
  private readonly classes: TtlCache<ReadonlyMap<string, boolean>>;
  /** The claims read, oldest first: past `maxClaims` the oldest is forgotten (a pod's author picks the keys). */
  private readonly held = new Set<string>();

  constructor(
    api: DraApi,
    log: Logger,
    ttlMs: number,
    private readonly maxClaims = 4096,
  ) {
    this.claims = new TtlCache(
      ttlMs,
      async (key) => {
        const [namespace = "", kind, ...rest] = key.split("/");
        const name = rest.join("/");
        if (kind === "template") {
          const t = (await api.readClaimTemplate(namespace, name)) as
            { spec?: { spec?: unknown } } | undefined;
          return claimDeviceClasses(t?.spec?.spec);
        }
        const c = (await api.readClaim(namespace, name)) as { spec?: unknown } | undefined;
        return claimDeviceClasses(c?.spec);
      },
      (key, err) =>
        log.warn({ claim: key, err }, "DRA claim unreadable; using its device classes as last read"),
    );
    this.classes = new TtlCache(
      ttlMs,
      async () => {
        const out = new Map<string, boolean>();
        for (const c of await api.listDeviceClasses()) {
          const name = (c as { metadata?: { name?: unknown } }).metadata?.name;
          if (typeof name === "string") out.set(name, isGpuDeviceClass(c));
        }
        return out;
      },
      (_k, err) => log.warn({ err }, "DeviceClasses unreadable; using them as last read"),
    );
  }

  /** The NVIDIA GPU classes of each claim (by claimKey), as classify is to be told them. */
  async gpuClasses(
    namespace: string,
    refs: readonly ClaimRef[],
  ): Promise<ReadonlyMap<string, readonly string[]>> {
    const keys = [...new Set(refs.map(claimKey).filter((k): k is string => k !== undefined))];
    if (!keys.length) return new Map();
    const [classes, ...asked] = await Promise.all([
      this.classes.get(""),
      ...keys.map((k) => this.claim(`${namespace}/${k}`)),
    ]);
    return new Map(keys.map((k, i) => [k, gpuClassesOf(asked[i]!, (n) => classes.get(n) === true)]));
  }

  private claim(key: string): Promise<readonly string[]> {
    this.held.delete(key);
    this.held.add(key);
    for (const oldest of this.held) {
      if (this.held.size <= this.maxClaims) break;
      this.held.delete(oldest);
      this.claims.invalidate(oldest);
    }
    return this.claims.get(key);
  }
}
