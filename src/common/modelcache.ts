import type * as k8s from "@kubernetes/client-node";
import { MODELCACHE, shortHash } from "../core/contract.js";
import { apiError, isNotFound } from "./kube.js";

/** The durable record of one cache (CRD `modelcaches.warmstart.dev`), as every role reads it. */
export interface ModelCacheObject {
  apiVersion: string;
  kind: string;
  metadata: k8s.V1ObjectMeta;
  spec: {
    hash: string;
    model?: string;
    inputs?: unknown;
    electionId?: string;
    leader?: { namespace?: string; name?: string; uid?: string; node?: string };
  };
  status?: {
    phase?: string;
    reason?: string;
    message?: string;
    backend?: string;
    namespaces?: string[];
    [k: string]: unknown;
  };
}

/** The cache record of a hash (full or short), or undefined when there is none. */
export async function getModelCache(
  custom: k8s.CustomObjectsApi,
  hashOrShort: string,
): Promise<ModelCacheObject | undefined> {
  try {
    return (await custom.getClusterCustomObject({
      group: MODELCACHE.group,
      version: MODELCACHE.version,
      plural: MODELCACHE.plural,
      name: shortHash(hashOrShort),
    })) as ModelCacheObject;
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw apiError(`reading ModelCache ${shortHash(hashOrShort)}`, err);
  }
}
