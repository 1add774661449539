/**
 * What admission needs from promote: the restore settings of a cache's storage profile, and its
 * claim in a namespace that has none yet (a restore admitted after the promote, in a namespace the
 * promote never saw).
 */
import type * as k8s from "@kubernetes/client-node";
import { createLogger, type Logger } from "../common/log.js";
import { claimName, shortHash } from "../core/contract.js";
import { apiError, isNotFound } from "../common/kube.js";
import { ensureClaim, promoteClients, type EnsureOutcome, type PromoteClients } from "./claims.js";
import { DEFAULT_PREWARM_PARALLELISM, StorageProfiles, unshareable, type Backend } from "./profiles.js";
import { sourceOf, treeSubPath } from "./source.js";

/** The parts of a ModelCache this reads. */
export interface CacheRecord {
  metadata?: { name?: string; annotations?: Record<string, string> };
  spec: { hash: string };
}

export interface RestoreSettings {
  prewarm: boolean;
  prewarmParallelism: number;
  /** The tree's folder inside the volume the restore mounts ("." when the volume is the tree). */
  treePath: string;
}

export interface Promotion {
  restoreProfile(cache: CacheRecord): Promise<RestoreSettings>;
  /**
   * The prewarm policy of the cluster's cache stores (by their provisioner), for followers: they
   * are decorated before anyone knows which node's store their cache will come from.
   */
  storeProfile(
    provisioner: string,
    volumeType?: string,
  ): Promise<{
    prewarm: boolean;
    prewarmParallelism: number;
    backend: Backend;
    why?: string;
    /** Why no pod of this store can restore through a shared claim (they start cold). */
    unshareable?: string;
  }>;
  ensureClaim(cache: CacheRecord, namespace: string): Promise<EnsureOutcome>;
}

export function createPromotion(clients: PromoteClients, profiles: StorageProfiles): Promotion {
  return {
    async restoreProfile(cache) {
      const source = sourceOf(cache);
      if (!source) return { prewarm: true, prewarmParallelism: DEFAULT_PREWARM_PARALLELISM, treePath: "." };
      const p = await profiles.resolve(source.provisioner, source.volumeType);
      return { prewarm: p.prewarm, prewarmParallelism: p.prewarmParallelism, treePath: treeSubPath(source) };
    },
    async storeProfile(provisioner, volumeType) {
      const p = await profiles.resolve(provisioner, volumeType);
      const refused = unshareable(p);
      return {
        prewarm: p.prewarm,
        prewarmParallelism: p.prewarmParallelism,
        backend: p.backend,
        ...((p.why ?? p.note) ? { why: p.why ?? p.note } : {}),
        ...(refused ? { unshareable: refused } : {}),
      };
    },
    async ensureClaim(cache, namespace) {
      const short = shortHash(cache.spec.hash);
      const source = sourceOf(cache);
      if (source) return ensureClaim(clients, short, source, namespace);
      // Nothing says what to make the claim from: only a claim that is already there will do.
      if (await claimPresent(clients, short, namespace)) return "exists";
      throw new Error(`cache ${short} records no promoted source; cannot make its claim in ${namespace}`);
    },
  };
}

async function claimPresent(c: PromoteClients, short: string, namespace: string): Promise<boolean> {
  try {
    await c.core.readNamespacedPersistentVolumeClaim({ name: claimName(short), namespace });
    return true;
  } catch (err) {
    if (isNotFound(err)) return false;
    throw apiError(`reading claim ${namespace}/${claimName(short)}`, err);
  }
}

const byConfig = new WeakMap<k8s.KubeConfig, Map<string, Promotion>>();

/** One Promotion per kubeconfig and system namespace, reused across admissions (keep-alive clients, cached profiles). */
export function promotion(kc: k8s.KubeConfig, systemNamespace: string, log?: Logger): Promotion {
  let m = byConfig.get(kc);
  if (!m) byConfig.set(kc, (m = new Map<string, Promotion>()));
  let p = m.get(systemNamespace);
  if (!p) {
    const clients = promoteClients(kc);
    const profiles = new StorageProfiles(
      clients.core,
      systemNamespace,
      (log ?? createLogger("promote")).child({ component: "promote" }),
    );
    m.set(systemNamespace, (p = createPromotion(clients, profiles)));
  }
  return p;
}
