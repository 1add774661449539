/**
 * The CSI drivers the chart's volume-objects policy lets a cache's volume or snapshot content
 * name (test/integration/promote.test.ts holds the policy itself against the API server): none
 * without a store volume, else the store's provisioner, the list given, or the drivers a storage
 * profile can promote with for the store's backend, the built-in ones as src/promote/profiles.ts
 * has them.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type * as k8s from "@kubernetes/client-node";
import { renderChart } from "../chart.js";
import { BUILT_IN_PROFILES } from "../../src/promote/profiles.js";

async function drivers(values: Record<string, unknown>): Promise<string[]> {
  const objs = await renderChart(values);
  const policy = objs.find(
    (x) => x.kind === "ValidatingAdmissionPolicy" && x.metadata?.name?.endsWith("-volume-objects"),
  ) as k8s.V1ValidatingAdmissionPolicy;
  const v = policy.spec!.variables!.find((x) => x.name === "drivers");
  return JSON.parse(v!.expression) as string[];
}

const builtIn = (backend: string, mountsTree: boolean): string[] =>
  Object.entries(BUILT_IN_PROFILES)
    .filter(([, p]) => p.backend === backend && (!mountsTree || p.mountsTree))
    .map(([k]) => k);

void test("volume-objects policy: a cache's volumes and snapshot contents name the store's CSI drivers only", async () => {
  assert.deepEqual(await drivers({}), [], "a node-local store: no other driver's volume");
  assert.deepEqual(
    await drivers({ "nodeAgent.store.claim": "store", "nodeAgent.store.provisioner": "efs.csi.aws.com" }),
    ["efs.csi.aws.com"],
  );
  assert.deepEqual(
    await drivers({
      "nodeAgent.store.claim": "store",
      "nodeAgent.store.csiDrivers": ["a.example", "b.example"],
    }),
    ["a.example", "b.example"],
  );
  assert.deepEqual(
    await drivers({
      "nodeAgent.store.claim": "store",
      storageProfiles: { "cephfs.csi.ceph.com": { mountsTree: true }, "nfs.csi.k8s.io": { prewarm: false } },
    }),
    [...builtIn("shared-volume", true), "cephfs.csi.ceph.com"],
    "a store claim of an unnamed provisioner: the shared profiles that mount one tree, and the configured ones",
  );
  assert.deepEqual(
    await drivers({ "nodeAgent.store.treeVolumeClass": "trees" }),
    builtIn("snapshot-clone", false),
    "a volume per tree of an unnamed provisioner: the snapshot-clone profiles",
  );
});
