/**
 * The last step before a cache may be published Ready: claim `rox-<short>` must exist in every
 * namespace that holds pods stamped with the hash, because a follower released into a namespace
 * without its claim stays Pending for good (it is never admitted again). Each namespace is retried
 * with bounded backoff; if one still fails, the caller publishes Failed, not Ready, so the
 * followers are re-elected instead of released.
 */
import type * as k8s from "@kubernetes/client-node";
import { setTimeout as sleep } from "node:timers/promises";
import { LABEL_HASH } from "../core/contract.js";
import { Backoff } from "../core/backoff.js";
import { apiError, isNotFound } from "../common/kube.js";
import { namespaceInScope, scopeNeedsLabels } from "../core/scope.js";
import type { Logger } from "../common/log.js";
import {
  ensureClaim,
  SupersededError,
  UnsupportedBackendError,
  type CreateOptions,
  type EnsureOutcome,
  type PromoteClients,
} from "./claims.js";
import type { CacheSource } from "./source.js";

export interface RetryOptions {
  attempts: number;
  initialMs: number;
  maxMs: number;
  signal?: AbortSignal;
  /** Errors that no retry can fix end the loop at once. */
  retryable?: (err: unknown) => boolean;
  onRetry?: (attempt: number, err: unknown, delayMs: number) => void;
}

export const DEFAULT_CLAIM_RETRY = { attempts: 5, initialMs: 200, maxMs: 5_000 } as const;

/** Runs `fn` until it succeeds, at most `attempts` times, waiting with capped exponential backoff in between. */
export async function retry<T>(fn: (attempt: number) => Promise<T>, o: RetryOptions): Promise<T> {
  const backoff = new Backoff({ initialMs: o.initialMs, maxMs: o.maxMs });
  for (let attempt = 1; ; attempt++) {
    try {
      return await fn(attempt);
    } catch (err) {
      if (attempt >= o.attempts || o.retryable?.(err) === false || o.signal?.aborted) throw err;
      const delay = backoff.next();
      o.onRetry?.(attempt, err, delay);
      await sleep(delay, undefined, o.signal ? { signal: o.signal } : undefined);
    }
  }
}

export interface NamespaceResult {
  namespace: string;
  outcome?: EnsureOutcome;
  attempts: number;
  error?: string;
}

export interface ClaimsResult {
  ok: boolean;
  /** Namespaces that now have the claim. */
  namespaces: string[];
  results: NamespaceResult[];
  unsupported?: string;
  /** `current` said the election moved on: the namespaces left were not tried. */
  superseded?: true;
}

/** The namespaces holding pods stamped with this cache's short hash (any phase: a gated follower counts). */
export async function stampedNamespaces(core: k8s.CoreV1Api, short: string): Promise<string[]> {
  try {
    const pods = await core.listPodForAllNamespaces({ labelSelector: `${LABEL_HASH}=${short}` });
    return [
      ...new Set(pods.items.map((p) => p.metadata?.namespace).filter((n): n is string => Boolean(n))),
    ].sort();
  } catch (err) {
    throw apiError(`listing pods of cache ${short}`, err);
  }
}

export interface EnsureAllOptions extends CreateOptions {
  clients: PromoteClients;
  short: string;
  /** The cache's scope key (its record's): no claim is made in a namespace outside it. */
  scope: string;
  source: CacheSource;
  log: Logger;
  /** Namespaces to cover besides those found by label (the leader's). */
  extraNamespaces?: string[];
  /** The snapshot-clone store claim's namespace (its snapshot already has the clone's source name). */
  storeNamespace?: string;
  retry?: Partial<Pick<RetryOptions, "attempts" | "initialMs" | "maxMs">>;
  parallel?: number;
  signal?: AbortSignal;
  onAttempt?: (namespace: string, result: "created" | "exists" | "gone" | "retry" | "failed") => void;
  /**
   * Whether the objects are still wanted (a promote's election is still the record's), asked
   * before each attempt creates anything: once it says no, nothing more is created.
   */
  current?: () => Promise<boolean>;
}

async function inScope(o: EnsureAllOptions, namespace: string): Promise<boolean> {
  if (!scopeNeedsLabels(o.scope)) return namespaceInScope(o.scope, namespace, undefined);
  const labels = await retry(
    async () => {
      try {
        return (await o.clients.core.readNamespace({ name: namespace })).metadata?.labels ?? {};
      } catch (err) {
        if (isNotFound(err)) return undefined;
        throw apiError(`reading Namespace ${namespace}`, err);
      }
    },
    { ...DEFAULT_CLAIM_RETRY, ...o.retry, signal: o.signal },
  );
  return labels !== undefined && namespaceInScope(o.scope, namespace, labels);
}

/**
 * Ensures the claim in every namespace inside the cache's scope with stamped pods, each with its
 * own bounded retries.
 */
export async function ensureClaimsForStampedPods(o: EnsureAllOptions): Promise<ClaimsResult> {
  const found = await retry(() => stampedNamespaces(o.clients.core, o.short), {
    ...DEFAULT_CLAIM_RETRY,
    ...o.retry,
    signal: o.signal,
  });
  const wanted = [...new Set([...found, ...(o.extraNamespaces ?? [])])].sort();
  // A stamp is a claim, not a proof (the webhook may have failed open on a forged one).
  const namespaces: string[] = [];
  for (const ns of wanted) {
    if (await inScope(o, ns)) namespaces.push(ns);
    else
      o.log.warn(
        { namespace: ns, scope: o.scope },
        "pods stamped with this cache in a namespace outside its scope: no claim there",
      );
  }
  const results: NamespaceResult[] = [];
  let unsupported: string | undefined;
  let superseded = false;
  const queue = [...namespaces];
  const worker = async (): Promise<void> => {
    for (let ns = queue.shift(); ns !== undefined && !superseded; ns = queue.shift()) {
      const namespace = ns;
      const r: NamespaceResult = { namespace, attempts: 0 };
      try {
        r.outcome = await retry(
          async (attempt) => {
            r.attempts = attempt;
            if (o.current && !(await o.current())) throw new SupersededError("the election moved on");
            return ensureClaim(o.clients, o.short, o.source, namespace, {
              storeNamespace: o.storeNamespace,
              ...(o.created ? { created: o.created } : {}),
            });
          },
          {
            ...DEFAULT_CLAIM_RETRY,
            ...o.retry,
            signal: o.signal,
            retryable: (err) => !(err instanceof UnsupportedBackendError || err instanceof SupersededError),
            onRetry: (attempt, err, delayMs) => {
              o.onAttempt?.(namespace, "retry");
              o.log.warn({ namespace, attempt, retryInMs: delayMs, err }, "claim not ensured yet; retrying");
            },
          },
        );
        o.onAttempt?.(namespace, r.outcome === "namespace-gone" ? "gone" : r.outcome);
      } catch (err) {
        if (err instanceof SupersededError) {
          superseded = true;
          continue;
        }
        if (err instanceof UnsupportedBackendError) unsupported = err.message;
        r.error = (err as Error).message;
        o.onAttempt?.(namespace, "failed");
      }
      results.push(r);
    }
  };
  await Promise.all(
    Array.from({ length: Math.max(1, Math.min(o.parallel ?? 4, namespaces.length)) }, worker),
  );
  results.sort((a, b) => (a.namespace < b.namespace ? -1 : 1));
  const ok = !superseded && results.every((r) => !r.error);
  return {
    ok,
    namespaces: results
      .filter((r) => r.outcome === "created" || r.outcome === "exists")
      .map((r) => r.namespace),
    results,
    ...(unsupported ? { unsupported } : {}),
    ...(superseded ? { superseded: true as const } : {}),
  };
}

/** One line naming each namespace whose claim could not be made, for the cache's status message. */
export function describeFailures(r: ClaimsResult): string {
  return r.results
    .filter((x) => x.error)
    .map((x) => `claim in ${x.namespace} failed after ${x.attempts} attempt(s): ${x.error}`)
    .join("; ");
}
