/**
 * What admission reads from the cluster besides caches and Leases, each with a short cache so the
 * hot path costs no API call per pod: a namespace's labels (opt-out, share-group) and the
 * cache-env template ConfigMap.
 */
import type * as k8s from "@kubernetes/client-node";
import { CACHE_ENV_CONFIGMAP } from "../core/contract.js";
import { parseCacheEnvTemplate } from "../core/cacheenv.js";
import { DEFAULT_CACHE_ENV_TEMPLATE, type CacheEnvTemplate } from "../core/decorate.js";
import { apiError, isNotFound } from "../common/kube.js";
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
