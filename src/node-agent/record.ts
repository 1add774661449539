/**
 * The durable cache record (ModelCache, cluster-scoped, named by the short hash) as the node agent
 * moves it: Capturing, Promoting, then Ready or Failed. Every status write is conditional on the
 * resourceVersion it was computed from, so a Ready written by anyone is never overwritten by a
 * stale transition.
 */
import * as k8s from "@kubernetes/client-node";
import { apiError, isAlreadyExists, isConflict, isNotFound } from "../common/kube.js";
import { LABEL_HASH, MODELCACHE, type CachePhase, shortHash } from "../core/contract.js";
import type { ModelCacheObject } from "../common/modelcache.js";

const ref = { group: MODELCACHE.group, version: MODELCACHE.version, plural: MODELCACHE.plural };
const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);

export type StatusPatch = Record<string, unknown> & { phase?: CachePhase; reason?: string; message?: string };

export class CacheRecords {
  constructor(private readonly custom: k8s.CustomObjectsApi) {}

  async get(hashOrShort: string): Promise<ModelCacheObject | undefined> {
    try {
      return (await this.custom.getClusterCustomObject({
        ...ref,
        name: shortHash(hashOrShort),
      })) as ModelCacheObject;
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw apiError(`reading ModelCache ${shortHash(hashOrShort)}`, err);
    }
  }

  /** The record of this hash; created (with what the leader pod tells) when admission left none. */
  async ensure(
    hash: string,
    spec: {
      model?: string;
      electionId?: string;
      leader: { namespace?: string; name?: string; uid?: string; node?: string };
    },
  ): Promise<{ cache: ModelCacheObject; created: boolean }> {
    const existing = await this.get(hash);
    if (existing) return { cache: existing, created: false };
    const name = shortHash(hash);
    try {
      const created = (await this.custom.createClusterCustomObject({
        ...ref,
        body: {
          apiVersion: `${MODELCACHE.group}/${MODELCACHE.version}`,
          kind: MODELCACHE.kind,
          metadata: { name, labels: { [LABEL_HASH]: name } },
          spec: {
            hash,
            ...(spec.model ? { model: spec.model } : {}),
            ...(spec.electionId ? { electionId: spec.electionId } : {}),
            leader: spec.leader,
          },
        },
      })) as ModelCacheObject;
      return { cache: created, created: true };
    } catch (err) {
      if (!isAlreadyExists(err)) throw apiError(`creating ModelCache ${name}`, err);
      const raced = await this.get(hash);
      if (!raced) throw new Error(`ModelCache ${name} vanished right after it existed`);
      return { cache: raced, created: false };
    }
  }

  /**
   * Computes the next status from the current record and writes it if the record has not changed
   * since it was read (re-reading and recomputing on a conflict). `next` returns undefined to leave
   * the record as it is. Returns the record as written (or as found, when left alone).
   */
  async transition(
    hashOrShort: string,
    next: (current: ModelCacheObject) => StatusPatch | undefined,
  ): Promise<{ cache: ModelCacheObject; written: boolean } | undefined> {
    const name = shortHash(hashOrShort);
    for (let attempt = 0; attempt < 8; attempt++) {
      const current = await this.get(name);
      if (!current) return undefined;
      const patch = next(current);
      if (!patch) return { cache: current, written: false };
      try {
        const written = (await this.custom.patchClusterCustomObjectStatus(
          {
            ...ref,
            name,
            body: {
              metadata: { resourceVersion: current.metadata.resourceVersion },
              status: { ...patch, lastTransitionTime: new Date().toISOString() },
            },
          },
          merge,
        )) as ModelCacheObject;
        return { cache: written, written: true };
      } catch (err) {
        if (isConflict(err)) continue;
        if (isNotFound(err)) return undefined;
        throw apiError(`updating ModelCache ${name} status`, err);
      }
    }
    throw new Error(`ModelCache ${name}: status kept changing under 8 attempts`);
  }

  /** Sets one annotation (the promoted source, written before the cache can turn Ready). */
  async annotate(hashOrShort: string, key: string, value: string): Promise<void> {
    const name = shortHash(hashOrShort);
    try {
      await this.custom.patchClusterCustomObject(
        { ...ref, name, body: { metadata: { annotations: { [key]: value } } } },
        merge,
      );
    } catch (err) {
      throw apiError(`annotating ModelCache ${name}`, err);
    }
  }
}
