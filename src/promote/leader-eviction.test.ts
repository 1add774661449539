import assert from "node:assert/strict";
import { test } from "node:test";
import type { V1Pod, V1PodCondition } from "@kubernetes/client-node";
import { evictionMessage, leaderEviction } from "./leader-eviction.js";

const pod = (status: V1Pod["status"]): V1Pod => ({ metadata: { name: "leader", namespace: "ns" }, status });
const evicted = (message: string, reason = "Evicted"): V1Pod => pod({ phase: "Failed", reason, message });
const byKubelet = (message: string): V1PodCondition => ({
  type: "DisruptionTarget",
  status: "True",
  reason: "TerminationByKubelet",
  message,
});

// The kubelet's own wording (pkg/kubelet/eviction/helpers.go).
const DISK =
  "The node was low on resource: ephemeral-storage. Threshold quantity: 1Gi, available: 512Mi. Container vllm was using 30Gi, request is 0, has larger consumption of ephemeral-storage. ";

test("a leader evicted because its capture volume outgrew its limit is the cache being too large", () => {
  const e = leaderEviction(evicted('Usage of EmptyDir volume "warmstart-cache" exceeds the limit "16Mi". '));
  assert.equal(e?.reason, "CacheTooLarge");
  assert.equal(e.cause, "cache larger than its size limit");
  assert.deepEqual(
    leaderEviction(evicted('Usage of EmptyDir volume "scratch" exceeds the limit "1Gi". ')),
    {
      reason: "LeaderEvicted",
      cause: "over its ephemeral-storage limit",
      detail: 'Usage of EmptyDir volume "scratch" exceeds the limit "1Gi".',
    },
    "another volume of the pod: its own limit, not the cache's",
  );
});

test("an eviction for node pressure names the pressure", () => {
  assert.equal(leaderEviction(evicted(DISK))?.cause, "node disk pressure");
  assert.equal(
    leaderEviction(evicted("The node was low on resource: inodes. Threshold quantity: 5%"))?.cause,
    "node disk pressure",
  );
  assert.equal(
    leaderEviction(evicted("The node had condition: [DiskPressure]. "))?.cause,
    "node disk pressure",
  );
  assert.equal(
    leaderEviction(evicted("The node was low on resource: memory. Threshold quantity: 100Mi"))?.cause,
    "node memory pressure",
  );
  assert.equal(leaderEviction(evicted("The node was low on resource: pids. "))?.cause, "node PID pressure");
  assert.equal(
    leaderEviction(evicted('Container vllm exceeded its local ephemeral storage limit "10Gi". '))?.cause,
    "over its ephemeral-storage limit",
  );
  assert.equal(leaderEviction(evicted(""))?.cause, "evicted by the kubelet");
});

test("the kubelet's DisruptionTarget condition alone tells of the eviction (it may come before the phase)", () => {
  const e = leaderEviction(pod({ phase: "Running", conditions: [byKubelet(DISK)] }));
  assert.equal(e?.reason, "LeaderEvicted");
  assert.equal(e.cause, "node disk pressure");
  assert.equal(e.detail, DISK.trim());
});

test("anything else is no eviction: a node shutting down, another disruption, a failure, a live pod", () => {
  const shutdown = "Pod was terminated in response to imminent node shutdown.";
  assert.equal(
    leaderEviction(
      pod({ phase: "Failed", reason: "Terminated", message: shutdown, conditions: [byKubelet(shutdown)] }),
    ),
    undefined,
  );
  const api = { ...byKubelet("Eviction API: evicting"), reason: "EvictionByEvictionAPI" };
  assert.equal(leaderEviction(pod({ phase: "Running", conditions: [api] })), undefined);
  assert.equal(
    leaderEviction(pod({ phase: "Running", conditions: [{ ...byKubelet(DISK), status: "False" }] })),
    undefined,
  );
  assert.equal(
    leaderEviction(evicted('Usage of EmptyDir volume "warmstart-cache" exceeds', "Error")),
    undefined,
  );
  assert.equal(leaderEviction(pod({ phase: "Failed" })), undefined);
  assert.equal(leaderEviction(pod({ phase: "Running" })), undefined);
  assert.equal(leaderEviction({}), undefined);
});

test("the record's message leads with the cause, then the pod and the kubelet's words", () => {
  const p = evicted(DISK);
  assert.equal(
    evictionMessage(leaderEviction(p)!, p),
    `LeaderEvicted: node disk pressure: leader pod ns/leader evicted by the kubelet (${DISK.trim()})`,
  );
  const big = evicted('Usage of EmptyDir volume "warmstart-cache" exceeds the limit "16Mi". ');
  assert.match(
    evictionMessage(leaderEviction(big)!, big),
    /^CacheTooLarge: cache larger than its size limit: /,
  );
});
