import { test } from "node:test";
import assert from "node:assert/strict";
import type { V1Pod } from "@kubernetes/client-node";
import { followerWait, gangOf, groupOf, membershipOf } from "./gangs.js";

const pod = (
  meta: V1Pod["metadata"] = {},
  spec: Partial<NonNullable<V1Pod["spec"]>> = {},
  args = ["--model", "m"],
): V1Pod => ({
  metadata: meta,
  spec: {
    containers: [{ name: "e", image: "i", args, resources: { limits: { "nvidia.com/gpu": "1" } } }],
    ...spec,
  },
});
const withSpec = (extra: Record<string, unknown>): V1Pod => pod({}, extra);

test("each gang scheduler is recognised by the keys its own code puts on a pod at creation", () => {
  const cases: Array<[string, V1Pod, string]> = [
    [
      "workload (1.35)",
      withSpec({ workloadRef: { name: "w", podGroup: "g", podGroupReplicaKey: "r0" } }),
      "workload",
    ],
    ["workload (1.36+)", withSpec({ schedulingGroup: { podGroupName: "pg" } }), "workload"],
    ["kueue group label", pod({ labels: { "kueue.x-k8s.io/pod-group-name": "g" } }), "kueue"],
    ["kueue group annotation", pod({ annotations: { "kueue.x-k8s.io/pod-group-name": "g" } }), "kueue"],
    ["kueue queue", pod({ labels: { "kueue.x-k8s.io/queue-name": "q" } }), "kueue"],
    ["kueue gate", withSpec({ schedulingGates: [{ name: "kueue.x-k8s.io/admission" }] }), "kueue"],
    ["volcano annotation", pod({ annotations: { "scheduling.k8s.io/group-name": "pg" } }), "volcano"],
    ["volcano scheduler", withSpec({ schedulerName: "volcano" }), "volcano"],
    ["kai annotation", pod({ annotations: { "pod-group-name": "pg" } }), "kai"],
    ["kai scheduler", withSpec({ schedulerName: "kai-scheduler" }), "kai"],
    ["coscheduling", pod({ labels: { "scheduling.x-k8s.io/pod-group": "pg" } }), "coscheduling"],
    ["coscheduling (old)", pod({ labels: { "pod-group.scheduling.sigs.k8s.io": "pg" } }), "coscheduling"],
    [
      "coscheduling (rbg)",
      pod({ labels: { "pod-group.scheduling.sigs.k8s.io/name": "rbg" } }),
      "coscheduling",
    ],
    ["grove", pod({ labels: { "grove.io/podgang": "pg" } }), "grove"],
    ["grove gate", withSpec({ schedulingGates: [{ name: "grove.io/podgang-pending-creation" }] }), "grove"],
    ["yunikorn", pod({ annotations: { "yunikorn.apache.org/task-groups": "[]" } }), "yunikorn"],
  ];
  for (const [what, p, kind] of cases) assert.equal(gangOf(p)?.kind, kind, what);
  assert.equal(gangOf(pod()), undefined, "a plain pod is no gang member");
  assert.equal(gangOf(withSpec({ schedulerName: "default-scheduler" })), undefined);
  assert.equal(gangOf(withSpec({ schedulingGates: [{ name: "other.io/gate" }] })), undefined);
  assert.equal(
    gangOf(withSpec({ workloadRef: { name: "w", podGroup: "g", podGroupReplicaKey: "r0" } }))?.name,
    "w/g/r0",
  );
});

test("ranks: LWS leader and workers, RBG, KubeRay, KAITO, Grove and the engines' own flags", () => {
  const lws = (worker: boolean, podIndex: string): V1Pod =>
    pod({
      labels: {
        "leaderworkerset.sigs.k8s.io/name": "x",
        "apps.kubernetes.io/pod-index": podIndex,
        ...(worker ? { "leaderworkerset.sigs.k8s.io/group-index": "3" } : {}),
      },
      annotations: {
        "leaderworkerset.sigs.k8s.io/size": "4",
        ...(worker ? { "leaderworkerset.sigs.k8s.io/leader-name": "x-3" } : {}),
      },
    });
  assert.deepEqual(
    [groupOf(lws(false, "3"))?.name, groupOf(lws(false, "3"))?.rank],
    ["x/3", "0"],
    "a leader is rank 0 of the group its pod index names",
  );
  assert.deepEqual([groupOf(lws(true, "2"))?.name, groupOf(lws(true, "2"))?.rank], ["x/3", "2"]);
  const single = lws(false, "0");
  single.metadata!.annotations!["leaderworkerset.sigs.k8s.io/size"] = "1";
  assert.equal(groupOf(single), undefined, "an LWS of size 1 is no multi-node group");

  const rbg = pod({
    labels: {
      "rbg.workloads.x-k8s.io/role-instance-name": "inst-0",
      "rbg.workloads.x-k8s.io/component-size": "2",
      "rbg.workloads.x-k8s.io/component-index": "1",
    },
  });
  assert.deepEqual([groupOf(rbg)?.kind, groupOf(rbg)?.name, groupOf(rbg)?.rank], ["rbg", "inst-0", "1"]);

  const ray = (type: string): V1Pod =>
    pod({ labels: { "ray.io/cluster": "c", "ray.io/node-type": type, "ray.io/group": "gpu" } });
  assert.equal(groupOf(ray("head"))?.rank, "head");
  assert.equal(groupOf(ray("worker"))?.rank, "worker/gpu");

  const kaito = pod({ labels: { "kaito.sh/workspace": "ws", "apps.kubernetes.io/pod-index": "1" } });
  kaito.spec!.containers[0]!.env = [
    {
      name: "POD_INDEX",
      valueFrom: { fieldRef: { fieldPath: "metadata.labels['apps.kubernetes.io/pod-index']" } },
    },
  ];
  assert.deepEqual([groupOf(kaito)?.kind, groupOf(kaito)?.rank], ["kaito", "1"]);
  assert.equal(
    groupOf(pod({ labels: { "kaito.sh/workspace": "ws" } })),
    undefined,
    "a single-node workspace",
  );

  // SGLang on a StatefulSet: --nnodes 2, the rank from the pod index through $(POD_INDEX).
  const sts = pod(
    {
      labels: { "apps.kubernetes.io/pod-index": "1" },
      ownerReferences: [
        { apiVersion: "apps/v1", kind: "StatefulSet", name: "s", uid: "u", controller: true },
      ],
    },
    {},
    ["--model", "m", "--nnodes", "2", "--node-rank", "$(POD_INDEX)", "--dist-init-addr", "s-0.s:5000"],
  );
  sts.spec!.containers[0]!.env = [
    {
      name: "POD_INDEX",
      valueFrom: { fieldRef: { fieldPath: "metadata.labels['apps.kubernetes.io/pod-index']" } },
    },
  ];
  assert.deepEqual(
    [groupOf(sts)?.kind, groupOf(sts)?.name, groupOf(sts)?.rank],
    ["engine", "StatefulSet/s", "1"],
  );

  // Dynamo on Grove: the worker clique's rank is its pod index plus one.
  const grove = pod(
    {
      labels: {
        "grove.io/podcliquescalinggroup": "d-0-prefill",
        "grove.io/podcliquescalinggroup-replica-index": "0",
        "grove.io/podclique-pod-index": "0",
      },
    },
    {},
    [
      "sh",
      "-c",
      "exec python3 -m dynamo.sglang --model-path m --nnodes 2 --node-rank $((GROVE_PCLQ_POD_INDEX + 1))",
    ],
  );
  assert.deepEqual([groupOf(grove)?.kind, groupOf(grove)?.rank], ["grove", "1"]);

  assert.equal(
    groupOf(pod({}, {}, ["--model", "m", "--nnodes", "1", "--master-addr", "x"])),
    undefined,
    "--nnodes 1",
  );
  assert.equal(
    groupOf(pod({}, {}, ["sh", "-c", "ray start --head && vllm serve m"]))?.by,
    "launcher ray start",
  );
  assert.equal(groupOf(pod({}, {}, ["vllm", "serve", "m", "--headless"]))?.by, "flag --headless");
  assert.equal(groupOf(pod()), undefined);
});

test("follower modes: gated only where nothing waits for the pod", () => {
  const plain = membershipOf(pod());
  assert.equal(followerWait(plain, "auto").mode, "gate");
  assert.equal(followerWait(plain, "wait").mode, "wait");
  assert.equal(followerWait(plain, "gate").mode, "gate");
  const gang = membershipOf(pod({ labels: { "grove.io/podgang": "g" } }));
  for (const mode of ["auto", "gate", "wait"] as const)
    assert.equal(followerWait(gang, mode).mode, "wait", mode);
  const rank = membershipOf(pod({}, {}, ["--model", "m", "--nnodes", "2", "--node-rank", "1"]));
  assert.equal(followerWait(rank, "auto").mode, "wait");
  assert.equal(
    followerWait(rank, "gate").mode,
    "gate",
    "ranks hash apart: gate mode may gate a later group's rank",
  );
  const other = membershipOf(withSpec({ schedulerName: "my-scheduler" }));
  assert.equal(followerWait(other, "auto").mode, "wait");
  assert.match(followerWait(other, "auto").why, /my-scheduler/);
});

test("attacker: a huge group name in an annotation is cut, so the stamps never make the pod too large to store", () => {
  const m = membershipOf(pod({ annotations: { "pod-group-name": "x".repeat(200_000) } }));
  assert.equal(m.gang?.name.length, 128);
  assert.ok(followerWait(m, "auto").why.length < 400);
});
