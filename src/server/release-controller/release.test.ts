import assert from "node:assert/strict";
import { test } from "node:test";
import type { V1Pod } from "@kubernetes/client-node";
import { evictedForCacheSize } from "./release.js";

const evicted = (message: string, reason = "Evicted"): V1Pod => ({
  metadata: { name: "leader", namespace: "ns" },
  status: { phase: "Failed", reason, message },
});

test("a leader evicted because its capture volume outgrew its limit is told apart from any other end", () => {
  // The kubelet's own wording (pkg/kubelet/eviction: emptyDirMessageFmt).
  assert.equal(
    evictedForCacheSize(evicted('Usage of EmptyDir volume "warmstart-cache" exceeds the limit "16Mi". ')),
    true,
  );
  assert.equal(
    evictedForCacheSize(evicted('Usage of EmptyDir volume "scratch" exceeds the limit "1Gi". ')),
    false,
    "another volume of the pod",
  );
  assert.equal(
    evictedForCacheSize(evicted("The node was low on resource: ephemeral-storage. ")),
    false,
    "node pressure is the node's, not the cache's",
  );
  assert.equal(
    evictedForCacheSize(evicted('Usage of EmptyDir volume "warmstart-cache" exceeds', "Error")),
    false,
  );
  assert.equal(evictedForCacheSize({ status: { phase: "Running" } }), false);
});
