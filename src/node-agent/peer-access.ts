/**
 * Who may have a tree this node serves (SPEC 1.5: a tree goes only to a node that restores it for
 * a pod in scope). The peer certificate says the caller is a node agent, not which node: one
 * certificate may serve every node. Which node it is comes from the ServiceAccount token it sends,
 * bound to its pod: the API server's TokenReview names the node that pod runs on (the user extra
 * authentication.kubernetes.io/node-name), so a node's token speaks for that node only. The tree
 * then goes to that node while a pod there, in the cache's scope, wears the cache's hash label or
 * mounts its read-only claim (a follower waiting for it, a restore mounting it).
 */
import { createHash } from "node:crypto";
import type * as k8s from "@kubernetes/client-node";
import { apiError } from "../common/kube.js";
import type { Logger } from "../common/log.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import { TtlCache } from "../common/ttl-cache.js";
import { claimName, LABEL_HASH } from "../core/contract.js";
import { scopeOfInputs } from "../core/hash.js";
import { namespaceInScope, scopeNeedsLabels } from "../core/scope.js";
import type { PeerIdentity } from "./replication/server.js";

/** The audience of the tokens node agents send each other: no other API accepts them. */
export const PEER_AUDIENCE = "warmstart.dev/peers";
const NODE_NAME = "authentication.kubernetes.io/node-name";
/** A decision holds this long: a pod that just went is refused soon after, not at once. */
const TTL_MS = 10_000;
/** Distinct tokens remembered at most (a peer sending made-up tokens must not grow the map). */
const MAX_TOKENS = 1024;

export interface PeerAccessDeps {
  core: k8s.CoreV1Api;
  auth: k8s.AuthenticationV1Api;
  /** The node agents' ServiceAccount (`system:serviceaccount:<ns>:<name>`): no other account's token is a node's. */
  serviceAccount: string;
  record: (short: string) => ModelCacheObject | undefined;
  log: Logger;
  now?: () => number;
}

export class PeerAccess {
  private readonly nodes: TtlCache<string | undefined>;
  private readonly grants: TtlCache<boolean>;
  private readonly labels: TtlCache<Record<string, string> | undefined>;
  private readonly pending = new Map<string, string>();
  private tokens = 0;

  constructor(private readonly d: PeerAccessDeps) {
    const now = d.now ?? Date.now;
    const stale = (what: string) => (key: string, err: unknown) =>
      d.log.warn({ err, key }, `${what} unreadable; the last answer stands`);
    this.nodes = new TtlCache(TTL_MS, (key) => this.review(key), stale("peer token"), now);
    this.grants = new TtlCache(TTL_MS, (key) => this.restoresThere(key), stale("peer grant"), now);
    this.labels = new TtlCache(TTL_MS, (ns) => this.namespaceLabels(ns), stale("namespace"), now);
  }

  /** Whether `peer` may have tree `short`: its token names a node where a pod in scope wears it. */
  async allows(short: string, peer: PeerIdentity): Promise<boolean> {
    const node = peer.token ? await this.nodeOf(peer.token) : undefined;
    if (!node) {
      this.d.log.warn(
        { short, peer: peer.commonName },
        "peer refused: no token of a node agent bound to a node",
      );
      return false;
    }
    return this.grants.get(`${short}/${node}`);
  }

  /** The node a token's pod runs on, by TokenReview; undefined when it is not a node agent's. */
  private async nodeOf(token: string): Promise<string | undefined> {
    const key = createHash("sha256").update(token).digest("hex");
    if (++this.tokens > MAX_TOKENS) {
      this.nodes.invalidate();
      this.tokens = 0;
    }
    // The cache's loader runs within get(), before any await: it finds the token here.
    this.pending.set(key, token);
    try {
      return await this.nodes.get(key);
    } finally {
      this.pending.delete(key);
    }
  }

  private async review(key: string): Promise<string | undefined> {
    const token = this.pending.get(key);
    if (!token) return undefined;
    let review: k8s.V1TokenReview;
    try {
      review = await this.d.auth.createTokenReview({ body: { spec: { token, audiences: [PEER_AUDIENCE] } } });
    } catch (err) {
      throw apiError("reviewing a peer's token", err);
    }
    const s = review.status;
    const node = s?.user?.extra?.[NODE_NAME]?.[0];
    return s?.authenticated === true && s.user?.username === this.d.serviceAccount && node ? node : undefined;
  }

  /**
   * Whether a pod on `node`, in a namespace of the cache's scope, restores the cache: it wears its
   * hash, or mounts its read-only claim (a restore-from another hash wears its own).
   */
  private async restoresThere(key: string): Promise<boolean> {
    const [short, node] = key.split("/") as [string, string];
    const cache = this.d.record(short);
    if (!cache) return false;
    const scope = scopeOfInputs(cache.spec.inputs);
    let pods: k8s.V1PodList;
    try {
      pods = await this.d.core.listPodForAllNamespaces({
        fieldSelector: `spec.nodeName=${node},status.phase!=Succeeded,status.phase!=Failed`,
      });
    } catch (err) {
      throw apiError(`listing the pods on node ${node}`, err);
    }
    const claim = claimName(short);
    const restoring = pods.items.filter(
      (p) =>
        p.metadata?.labels?.[LABEL_HASH] === short ||
        (p.spec?.volumes ?? []).some((v) => v.persistentVolumeClaim?.claimName === claim),
    );
    for (const ns of new Set(restoring.map((p) => p.metadata?.namespace ?? ""))) {
      const labels = scopeNeedsLabels(scope) ? await this.labels.get(ns) : undefined;
      if (namespaceInScope(scope, ns, labels)) return true;
    }
    return false;
  }

  private async namespaceLabels(name: string): Promise<Record<string, string> | undefined> {
    try {
      return (await this.d.core.readNamespace({ name })).metadata?.labels ?? {};
    } catch (err) {
      throw apiError(`reading namespace ${name}`, err);
    }
  }
}
