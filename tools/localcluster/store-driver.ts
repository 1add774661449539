/**
 * Warmstart's own CSI driver `store.warmstart.dev` (node-store) on the local cluster's real nodes,
 * as the chart runs it (`nodeAgent.storeDriver`): each real node's agent serves the driver under
 * its kubelet root and, with a peer certificate of one CA, serves and fetches trees from the other
 * nodes' agents at their own loopback addresses (links.ts). `cluster up --store-driver` and the
 * tests' `serveStoreDriver` (test/realnode.ts) both build it from here, so they cannot drift.
 */
import { mkdir, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import * as k8sApi from "@kubernetes/client-node";
import type * as k8s from "@kubernetes/client-node";
import { createCA, issueCert } from "../../src/common/certs.js";
import { isAlreadyExists, SYSTEM_NAMESPACE } from "../../src/common/kube.js";
import { PEER_AUDIENCE } from "../../src/node-agent/peer-access.js";
import { NODE_STORE_DRIVER } from "../../src/promote/objects.js";

export const STORE_DRIVER = NODE_STORE_DRIVER;

/** A real node as the driver needs it: its name (the certificate's CN), kubelet root and address. */
export interface StoreDriverNode {
  name: string;
  kubeletRoot: string;
  address: string;
}

/** What `cluster up --store-driver` records in the cluster state. */
export interface StoreDriverState {
  driver: string;
  /** The folder of `writePeerTls`, under the state folder. */
  peerTls: string;
  /** The nodes whose agents serve the driver (the real ones; simulated nodes have no kubelet). */
  nodes: string[];
}

/** One node's peer certificate, key, token and the CA in a folder `writePeerTls` wrote. */
export function peerTlsFiles(
  dir: string,
  node: string,
): { cert: string; key: string; ca: string; token: string } {
  return {
    cert: join(dir, `${node}.crt`),
    key: join(dir, `${node}.key`),
    ca: join(dir, "ca.crt"),
    token: join(dir, `${node}.token`),
  };
}

/** The node agents' ServiceAccount, as the chart names it for a release called warmstart. */
export const NODE_AGENT_ACCOUNT = { namespace: SYSTEM_NAMESPACE, name: "warmstart-node-agent" };
export const NODE_AGENT_USER = `system:serviceaccount:${NODE_AGENT_ACCOUNT.namespace}:${NODE_AGENT_ACCOUNT.name}`;

/**
 * The token a node agent proves its node with (peer-access.ts): the node agents' ServiceAccount,
 * bound to the Node object (the chart's agents hold one bound to their pod; either way the API
 * server names the node in it), written beside the node's certificate. The host-process agents
 * run with the admin's credentials, so this token is all they are as that account.
 */
export async function writePeerToken(kc: k8s.KubeConfig, dir: string, node: string): Promise<void> {
  const core = kc.makeApiClient(k8sApi.CoreV1Api);
  await core
    .createNamespacedServiceAccount({
      namespace: NODE_AGENT_ACCOUNT.namespace,
      body: { metadata: { name: NODE_AGENT_ACCOUNT.name } },
    })
    .catch((err: unknown) => {
      if (!isAlreadyExists(err)) throw err;
    });
  const uid = (await core.readNode({ name: node })).metadata?.uid;
  const request = await core.createNamespacedServiceAccountToken({
    ...NODE_AGENT_ACCOUNT,
    body: {
      spec: {
        audiences: [PEER_AUDIENCE],
        // A local cluster lives for a session; the chart's tokens are renewed by the kubelet.
        expirationSeconds: 30 * 24 * 3600,
        boundObjectRef: { kind: "Node", apiVersion: "v1", name: node, ...(uid ? { uid } : {}) },
      },
    },
  });
  const file = peerTlsFiles(dir, node).token;
  await rm(file, { force: true });
  await writeFile(file, request.status!.token, { mode: 0o600, flag: "wx" });
}

/**
 * A fresh CA and one certificate per node into `dir`: CN the node's name, its address as IP SAN,
 * server and client auth (an agent both serves trees and fetches them). Keys are owner-only; the
 * CA's key is never written, so nothing more can be issued by it (the chart drops its CA's too).
 */
export async function writePeerTls(
  dir: string,
  nodes: readonly Pick<StoreDriverNode, "name" | "address">[],
): Promise<void> {
  await mkdir(dir, { recursive: true, mode: 0o700 });
  const ca = await createCA("warmstart node agents");
  await writeFile(join(dir, "ca.crt"), ca.cert);
  for (const node of nodes) {
    const pem = await issueCert(ca, { commonName: node.name, ips: [node.address], usage: "both" });
    const f = peerTlsFiles(dir, node.name);
    await writeFile(f.cert, pem.cert);
    // Created afresh: a mode given to writeFile only applies to a file it creates.
    await rm(f.key, { force: true });
    await writeFile(f.key, pem.key, { mode: 0o600, flag: "wx" });
  }
}

/**
 * The node agent's flags that serve the driver on `node` (its socket under the kubelet root,
 * where the kubelet looks) and, given the folder of `writePeerTls`, its peer certificate: trees
 * on any free port on every address, announced at the node's own address (whose uplink may be
 * shaped). The agent's health and metrics then listen on every address too (one --host).
 */
export function storeDriverArgs(node: StoreDriverNode, peerTlsDir?: string): string[] {
  const args = [`--csi-plugin-dir=${join(node.kubeletRoot, "plugins", STORE_DRIVER)}`];
  if (peerTlsDir) {
    const f = peerTlsFiles(peerTlsDir, node.name);
    args.push(
      `--peer-cert=${f.cert}`,
      `--peer-key=${f.key}`,
      `--peer-ca=${f.ca}`,
      `--peer-token-file=${f.token}`,
      `--peer-service-account=${NODE_AGENT_USER}`,
      "--peer-port=0",
      "--host=0.0.0.0",
      `--peer-address=${node.address}`,
    );
  }
  return args;
}

/** The CSIDriver object, as the chart renders it (no attach, no pod info, no fsGroup change). */
export function storeDriverObject(): k8s.V1CSIDriver {
  return {
    metadata: { name: STORE_DRIVER },
    spec: {
      attachRequired: false,
      podInfoOnMount: false,
      fsGroupPolicy: "None",
      volumeLifecycleModes: ["Persistent"],
      requiresRepublish: false,
    },
  };
}

/** Creates the CSIDriver object; false when it was there already (then it is not ours to delete). */
export async function createStoreDriverObject(storage: k8s.StorageV1Api): Promise<boolean> {
  try {
    await storage.createCSIDriver({ body: storeDriverObject() });
    return true;
  } catch (err) {
    if (!isAlreadyExists(err)) throw err;
    return false;
  }
}

/** Whether the kubelet of `node` has registered the driver (its CSINode lists it). */
export async function storeDriverRegistered(storage: k8s.StorageV1Api, node: string): Promise<boolean> {
  const csiNode = await storage.readCSINode({ name: node }).catch(() => undefined);
  return csiNode?.spec?.drivers?.some((d) => d.name === STORE_DRIVER) ?? false;
}

/** `cluster up --store-driver` asks for real nodes and their agents; refused before anything starts. */
export function checkStoreDriverOptions(o: {
  storeDriver?: boolean;
  realNodes: number;
  bare: boolean;
}): void {
  if (!o.storeDriver) return;
  if (o.realNodes < 1)
    throw new Error("--store-driver needs real nodes (--real-nodes 1 or more): only a kubelet registers it");
  if (o.bare) throw new Error("--store-driver needs the node agents: not with --bare");
}

/** Whether `cluster up` runs the store driver: as asked, else wherever it can (real nodes, roles). */
export function storeDriverWanted(o: { storeDriver?: boolean; realNodes: number; bare: boolean }): boolean {
  return o.storeDriver ?? (o.realNodes >= 1 && !o.bare);
}

/** `cluster up --store-driver`: the real nodes' peer certificates under the state folder. */
export async function enableStoreDriver(
  stateDir: string,
  nodes: readonly { name: string; real?: boolean; address?: string }[],
  progress: (line: string) => void,
): Promise<StoreDriverState> {
  const real = nodes.flatMap((n) => (n.real && n.address ? [{ name: n.name, address: n.address }] : []));
  if (!real.length) throw new Error("--store-driver needs real nodes (--real-nodes 1 or more)");
  const peerTls = join(stateDir, "peer-tls");
  progress(`issuing the peer certificates of ${real.map((n) => n.name).join(", ")} into ${peerTls}`);
  await writePeerTls(peerTls, real);
  return { driver: STORE_DRIVER, peerTls, nodes: real.map((n) => n.name) };
}
