/**
 * This node's committed trees, served to the other nodes' agents (SPEC 1.5, ADR 0010), and where
 * the record says they are: `status.replicas[<node>]`, written for a tree whose manifest is the
 * one the record's digest names (what the elected leader's agent committed), removed with it.
 */
import { readFileSync } from "node:fs";
import type { CacheRecords } from "../common/cache-record.js";
import * as k8s from "@kubernetes/client-node";
import { makeApiClient } from "../common/kube.js";
import type { Logger } from "../common/log.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import type { NodeAgentConfig } from "./config.js";
import type { ReplicationMetrics } from "./metrics.js";
import { PeerAccess } from "./peer-access.js";
import type { AgentParts } from "./parts.js";
import {
  manifestDigestOf,
  PeerServer,
  type FillingTree,
  type PeerServerOptions,
} from "./replication/server.js";

export class PeerServing {
  private url = "";

  private constructor(
    private readonly cfg: NodeAgentConfig,
    private readonly server: PeerServer,
    private readonly log: Logger,
  ) {}

  /**
   * Serving, when the node agent has its peer certificate, key and CA; else undefined. With the
   * node agents' account, a tree goes only to a node that restores it (peer-access.ts).
   */
  static from(p: AgentParts, kc: k8s.KubeConfig, metrics: ReplicationMetrics): PeerServing | undefined {
    const { cfg } = p;
    if (!cfg.peerCert || !cfg.peerKey || !cfg.peerCa) return undefined;
    const tls = {
      cert: readFileSync(cfg.peerCert),
      key: readFileSync(cfg.peerKey),
      ca: readFileSync(cfg.peerCa),
    };
    const log = p.log.child({ component: "peers" });
    let authorize: PeerServerOptions["authorize"];
    if (cfg.peerServiceAccount) {
      const access = new PeerAccess({
        core: p.core,
        auth: makeApiClient(kc, k8s.AuthenticationV1Api),
        serviceAccount: cfg.peerServiceAccount,
        record: p.record,
        log,
      });
      authorize = (short, peer) => access.allows(short, peer);
    } else
      log.warn("no --peer-service-account: every peer with a certificate of the CA is served every tree");
    const server = new PeerServer({
      storeDir: cfg.store,
      tls,
      log,
      metrics,
      ...(authorize ? { authorize } : {}),
    });
    return new PeerServing(cfg, server, log);
  }

  async start(): Promise<string> {
    const port = await this.server.listen(this.cfg.peerPort, this.cfg.host);
    const host = this.cfg.peerAddress ?? this.cfg.host;
    this.url = `https://${host.includes(":") ? `[${host}]` : host}:${port}`;
    return this.url;
  }

  stop(): Promise<void> {
    return this.server.close();
  }

  /**
   * Records this node's copy on the cache when it is the committed tree the record's digest
   * names and the record does not say so already (level-based: every reconcile of the cache).
   */
  async advertise(records: CacheRecords, cache: ModelCacheObject, treeDir: string): Promise<void> {
    const digest = cache.status?.manifestDigest;
    const node = this.cfg.node;
    const recorded = cache.status?.replicas?.[node];
    if (!this.url || !digest || (recorded?.url === this.url && !recorded.filling)) return;
    if (manifestDigestOf(treeDir) !== digest) {
      this.log.debug({ hash: cache.metadata.name }, "not advertised: this copy is not the record's tree");
      return;
    }
    await records.setReplica(cache.metadata.name!, node, {
      url: this.url,
      at: new Date().toISOString(),
      filling: null,
    });
    this.log.info({ hash: cache.metadata.name, url: this.url }, "advertised: peers may fetch this copy");
  }

  /** A tree this node fills from its peers, served to the others as its chunks land (ADR 0010). */
  serveFilling(short: string, tree: FillingTree): () => void {
    return this.server.serveFilling(short, tree);
  }

  /** This node's filling copy of a tree and how far it is, on the record (where peers find it). */
  recordFilling(
    records: CacheRecords,
    short: string,
    filling: { doneBytes: number; totalBytes: number },
  ): Promise<void> {
    if (!this.url) return Promise.resolve();
    return records.setReplica(short, this.cfg.node, { url: this.url, at: new Date().toISOString(), filling });
  }

  /** The tree is gone from this node: so is its entry. */
  forget(records: CacheRecords, short: string): Promise<void> {
    return records.setReplica(short, this.cfg.node, null);
  }
}
