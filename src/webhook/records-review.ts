/**
 * Which node may capture an election's tree: the node its leader pod runs on, and no other. The
 * records policy (chart, CEL) holds a node agent to writing the manifest digest once and with its
 * own node as `status.node`, but CEL cannot look the leader up: a node agent could claim a capture
 * first, or create a record for a hash nobody elected yet. The API server sends exactly those
 * writes of a node agent here (the registration's match conditions): the record's creation, and a
 * change of `status.node` or `status.manifestDigest`; each is allowed only for the node its token
 * is bound to (the user extra `authentication.kubernetes.io/node-name`) when that is the node of the
 * pod the election names, and a creation only for an election the capture Lease holds.
 */
import type * as k8s from "@kubernetes/client-node";
import { ANN_ELECTION_ID, LABEL_HASH, leaseName, shortHash } from "../core/contract.js";
import { apiError, isNotFound } from "../common/kube.js";
import type { Logger } from "../common/log.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import type { AdmissionHandler } from "./server.js";

const NODE_NAME = "authentication.kubernetes.io/node-name";

export interface RecordWrite {
  operation?: string;
  userInfo?: { username?: string; extra?: Record<string, string[]> };
  object?: unknown;
  oldObject?: unknown;
}

/** What the review reads from the cluster (the webhook's clients; fakes in unit tests). */
export interface RecordLookups {
  /** Pods of `namespace` with the cache's hash label (where the election's leader is found). */
  podsOfCache(namespace: string, short: string): Promise<k8s.V1Pod[]>;
  /** The election's capture Lease (`warmstart-capture-<short>`), if any. */
  captureLease(name: string): Promise<k8s.V1Lease | undefined>;
}

export type RecordVerdict = { allowed: true } | { allowed: false; message: string };

const allow: RecordVerdict = { allowed: true };
const deny = (message: string): RecordVerdict => ({ allowed: false, message });

/** Whether this write by a node agent may stand. */
export async function reviewRecordWrite(w: RecordWrite, look: RecordLookups): Promise<RecordVerdict> {
  const cache = w.object as ModelCacheObject | undefined;
  const old = w.oldObject as ModelCacheObject | undefined;
  if (!cache?.spec?.hash) return deny("not a cache record");
  const creating = w.operation === "CREATE";
  const captureClaimed =
    (cache.status?.node ?? "") !== (old?.status?.node ?? "") ||
    (cache.status?.manifestDigest ?? "") !== (old?.status?.manifestDigest ?? "");
  if (!creating && !captureClaimed) return allow;
  const node = w.userInfo?.extra?.[NODE_NAME]?.[0];
  if (!node) return deny("a node agent's token bound to no node cannot speak for a capture");
  const short = shortHash(cache.spec.hash);
  const election = cache.spec.electionId;
  if (!election) return deny(`cache ${short} names no election`);
  if (creating) {
    const lease = await look.captureLease(leaseName(short));
    if (lease?.spec?.holderIdentity !== election)
      return deny(`no capture Lease holds election ${election} of cache ${short}: nobody elected it`);
  }
  // A status write that clears them (an election reset) is the webhook's, never matched here.
  if (!creating && !cache.status?.node && !cache.status?.manifestDigest) return allow;
  const leader = await leaderOf(cache, look);
  if (!leader) return deny(`the leader pod of election ${election} of cache ${short} is not found`);
  const where = leader.spec?.nodeName;
  if (where !== node)
    return deny(
      `node ${node} may not speak for the capture of cache ${short}: its leader ${leader.metadata?.namespace}/${leader.metadata?.name} runs on ${where ?? "no node yet"}`,
    );
  return allow;
}

/** The pod the record names as its election's leader: by name, else by its recorded UID. */
async function leaderOf(cache: ModelCacheObject, look: RecordLookups): Promise<k8s.V1Pod | undefined> {
  const { namespace, name } = cache.spec.leader ?? {};
  if (!namespace) return undefined;
  const uid = cache.status?.leaderUid;
  const wearing = (await look.podsOfCache(namespace, shortHash(cache.spec.hash))).filter(
    (p) =>
      p.metadata?.annotations?.[ANN_ELECTION_ID] === cache.spec.electionId &&
      (!name || p.metadata?.name === name) &&
      (!uid || p.metadata?.uid === uid),
  );
  // A copy of the stamps elsewhere is not the leader: exactly one pod, or none.
  return wearing.length === 1 ? wearing[0] : undefined;
}

/** The review as an admission handler, reading the cluster through the webhook's clients. */
export function recordsHandler(
  clients: { core: k8s.CoreV1Api; coordination: k8s.CoordinationV1Api; systemNamespace: string },
  log: Logger,
): AdmissionHandler {
  const look: RecordLookups = {
    podsOfCache: async (namespace, short) =>
      (await clients.core.listNamespacedPod({ namespace, labelSelector: `${LABEL_HASH}=${short}` })).items,
    captureLease: (name) =>
      clients.coordination
        .readNamespacedLease({ name, namespace: clients.systemNamespace })
        .catch((err: unknown) => {
          if (isNotFound(err)) return undefined;
          throw apiError(`reading Lease ${name}`, err);
        }),
  };
  return async (review) => {
    const r = review.request;
    const verdict = await reviewRecordWrite(r, look);
    if (verdict.allowed) return { uid: r.uid, allowed: true };
    log.warn({ record: r.name, user: r.userInfo?.username, why: verdict.message }, "refused a record write");
    return { uid: r.uid, allowed: false, status: { code: 403, message: verdict.message } };
  };
}
