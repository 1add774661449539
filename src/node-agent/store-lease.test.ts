import assert from "node:assert/strict";
import { test } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { resolveProfile, type StorageProfiles } from "../promote/profiles.js";
import { loadNodeAgentConfig } from "./config.js";
import { StoreStorageInfo } from "./store-lease.js";

const base = { node: "gpu-0", kubeletRoot: "/var/lib/kubelet", store: "/var/lib/warmstart/store" };
const peers = { peerCert: "/tls/tls.crt", peerKey: "/tls/tls.key", peerCa: "/tls/ca.crt" };
const profiles = {
  resolve: (provisioner: string, volumeType?: string) =>
    Promise.resolve(resolveProfile(new Map(), provisioner, volumeType)),
} as unknown as StorageProfiles;
/** No API call is made for a store without a claim or tree volumes. */
const kc = {} as k8s.KubeConfig;

void test("the node-local store is published as node-store when this agent serves the CSI driver and its peers", async () => {
  const on = loadNodeAgentConfig(
    { ...base, ...peers, csiPluginDir: "/var/lib/kubelet/plugins/store.warmstart.dev" },
    {},
  );
  const p = await new StoreStorageInfo(on, kc, profiles).profile();
  assert.equal(p.backend, "node-store");
  assert.equal(p.provisioner, "warmstart.dev/host-path");
});

void test("without the driver, or without peers to fetch a missing tree from, the node-local store stays host-path", async () => {
  const off = loadNodeAgentConfig(base, {});
  assert.equal((await new StoreStorageInfo(off, kc, profiles).profile()).backend, "host-path");
  const alone = loadNodeAgentConfig(
    { ...base, csiPluginDir: "/var/lib/kubelet/plugins/store.warmstart.dev" },
    {},
  );
  assert.equal(
    (await new StoreStorageInfo(alone, kc, profiles).profile()).backend,
    "host-path",
    "a restore on a node without the tree would wait for good",
  );
});

void test("a store named by another provisioner keeps that provisioner's backend", async () => {
  const cfg = loadNodeAgentConfig(
    {
      ...base,
      ...peers,
      csiPluginDir: "/var/lib/kubelet/plugins/store.warmstart.dev",
      storeProvisioner: "ebs.csi.aws.com",
    },
    {},
  );
  assert.equal((await new StoreStorageInfo(cfg, kc, profiles).profile()).backend, "per-pod-clone");
});
