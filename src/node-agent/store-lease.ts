/**
 * How the node's store shows outside the node: its use and budget on Lease `warmstart-store-<node>`
 * (read by `warmstart caches` and the dashboard), and what storage it lives on (which decides how
 * a committed tree is published).
 */
import * as k8s from "@kubernetes/client-node";
import { apiError, isAlreadyExists, isConflict, isNotFound } from "../common/kube.js";
import {
  ANN_STORE_BUDGET,
  ANN_STORE_CACHES,
  ANN_STORE_NODE,
  ANN_STORE_USED,
  LABEL_STORE,
} from "../core/contract.js";
import { withStoreDriver, type StorageProfile, type StorageProfiles } from "../promote/profiles.js";
import { describeStore, type StoreLocation, type StoreStorage } from "../promote/publish.js";
import type { NodeAgentConfig } from "./config.js";
import type { AgentParts } from "./parts.js";
import { bytesOf } from "./store.js";

/** The store's use and budget, on its Lease (created owned by the Node: it goes with the node). */
export async function publishStore(
  p: Pick<AgentParts, "cfg" | "store" | "core" | "coordination" | "clock">,
): Promise<void> {
  const { cfg, store, core, coordination } = p;
  const name = `warmstart-store-${cfg.node}`.slice(0, 253);
  const trees = await store.list();
  const annotations = {
    [ANN_STORE_BUDGET]: String(cfg.storeBudget),
    [ANN_STORE_USED]: String(bytesOf(trees)),
    [ANN_STORE_CACHES]: trees.map((t) => t.short).join(","),
    [ANN_STORE_NODE]: cfg.node,
  };
  const renewTime = new k8s.V1MicroTime(new Date(p.clock.now()).toISOString());
  const patch = (): Promise<k8s.V1Lease> =>
    coordination.patchNamespacedLease(
      { name, namespace: cfg.systemNamespace, body: { metadata: { annotations }, spec: { renewTime } } },
      k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
    );
  try {
    await patch();
    return;
  } catch (err) {
    if (!isNotFound(err)) throw apiError(`updating Lease ${name}`, err);
  }
  const node = (await core.listNode({ fieldSelector: `metadata.name=${cfg.node}` }).catch(() => undefined))
    ?.items[0];
  const body: k8s.V1Lease = {
    metadata: {
      name,
      namespace: cfg.systemNamespace,
      labels: { [LABEL_STORE]: "true" },
      annotations,
      ...(node?.metadata?.uid
        ? { ownerReferences: [{ apiVersion: "v1", kind: "Node", name: cfg.node, uid: node.metadata.uid }] }
        : {}),
    },
    spec: { holderIdentity: cfg.node, renewTime },
  };
  try {
    await coordination.createNamespacedLease({ namespace: cfg.systemNamespace, body });
  } catch (err) {
    if (!isAlreadyExists(err)) throw apiError(`creating Lease ${name}`, err);
    try {
      await patch();
    } catch (e) {
      if (!isConflict(e)) throw apiError(`updating Lease ${name}`, e);
    }
  }
}

/** The same, logging instead of failing: the next change or resync publishes again. */
export function publishStoreQuietly(
  p: Parameters<typeof publishStore>[0] & Pick<AgentParts, "log">,
): Promise<void> {
  return publishStore(p).catch((err: unknown) => p.log.warn({ err }, "could not publish the store's use"));
}

/** Where the store lives and the storage profile that decides how its trees are published. */
export class StoreStorageInfo {
  private described: StoreStorage | undefined;

  constructor(
    private readonly cfg: NodeAgentConfig,
    private readonly kc: k8s.KubeConfig,
    private readonly profiles: StorageProfiles,
  ) {}

  location(): StoreLocation {
    const { cfg } = this;
    const claim = cfg.storeClaim?.split("/");
    return {
      node: cfg.node,
      dir: cfg.store,
      ...(claim ? { claim: { namespace: claim[0]!, name: claim[1]! } } : {}),
      ...(cfg.storeProvisioner ? { provisioner: cfg.storeProvisioner } : {}),
      ...(cfg.storeVolumeType ? { volumeType: cfg.storeVolumeType } : {}),
      ...(cfg.treeVolumeClass ? { treeVolumeClass: cfg.treeVolumeClass } : {}),
    };
  }

  /** Looked up once: the store's volume does not change under a running agent. */
  async storage(): Promise<StoreStorage> {
    this.described ??= await describeStore(this.kc, this.location());
    return this.described;
  }

  /** The store claim's namespace, once known (claims are never made there for pods). */
  get claimNamespace(): string | undefined {
    return this.described?.claim?.namespace;
  }

  /**
   * A node-local store is node-store when this agent serves the CSI driver and can fetch trees
   * from its peers (their certificates given), else host-path: without peers a follower on a node
   * lacking the tree would wait for good, where host-path only pins it to the tree's node.
   */
  async profile(): Promise<StorageProfile> {
    const s = await this.storage();
    const { csiPluginDir, peerCert, peerKey, peerCa } = this.cfg;
    return withStoreDriver(
      await this.profiles.resolve(s.provisioner, s.volumeType),
      Boolean(csiPluginDir && peerCert && peerKey && peerCa),
    );
  }
}
