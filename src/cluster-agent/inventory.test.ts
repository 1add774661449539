import assert from "node:assert/strict";
import { test } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import {
  fits,
  GPU_PRODUCT_LABEL,
  GPU_RESOURCE,
  inventoryFromNodes,
  nodeGpus,
  sameNodes,
  UNKNOWN_GPU_TYPE,
} from "./inventory.js";
import { GPU_TYPE_OVERRIDE_LABEL } from "./config.js";

function node(
  name: string,
  o: { gpus?: string; ready?: string; unschedulable?: boolean; labels?: Record<string, string> } = {},
): k8s.V1Node {
  return {
    metadata: { name, labels: o.labels ?? { [GPU_PRODUCT_LABEL]: "NVIDIA-H100-80GB-HBM3" } },
    spec: { unschedulable: o.unschedulable },
    status: {
      allocatable: o.gpus === undefined ? { cpu: "8" } : { cpu: "8", [GPU_RESOURCE]: o.gpus },
      conditions: [{ type: "Ready", status: o.ready ?? "True" }],
    },
  };
}

void test("a node counts when Ready, schedulable and with allocatable GPUs", () => {
  const L = GPU_TYPE_OVERRIDE_LABEL;
  assert.deepEqual(nodeGpus(node("a", { gpus: "4" }), L), {
    node: "a",
    gpuType: "NVIDIA-H100-80GB-HBM3",
    count: 4,
  });
  assert.equal(nodeGpus(node("a", { gpus: "4", ready: "False" }), L), undefined);
  assert.equal(nodeGpus(node("a", { gpus: "4", ready: "Unknown" }), L), undefined);
  assert.equal(nodeGpus(node("a", { gpus: "4", unschedulable: true }), L), undefined);
  assert.equal(nodeGpus(node("a", { gpus: "0" }), L), undefined);
  assert.equal(nodeGpus(node("a"), L), undefined);
  assert.equal(nodeGpus(node("a", { gpus: "4x" }), L), undefined, "a malformed quantity counts as none");
  const noConditions = node("a", { gpus: "4" });
  delete noConditions.status!.conditions;
  assert.equal(nodeGpus(noConditions, L), undefined);
});

void test("the agent's label overrides the product label; no label at all is 'unknown'", () => {
  const L = GPU_TYPE_OVERRIDE_LABEL;
  const both = node("a", { gpus: "2", labels: { [GPU_PRODUCT_LABEL]: "NVIDIA-A100", [L]: "a100-pool" } });
  assert.equal(nodeGpus(both, L)?.gpuType, "a100-pool");
  assert.equal(nodeGpus(node("a", { gpus: "2", labels: {} }), L)?.gpuType, UNKNOWN_GPU_TYPE);
});

void test("inventory sums by type, sorted, and compares node by node", () => {
  const nodes = [
    node("b", { gpus: "4" }),
    node("a", { gpus: "8", labels: { [GPU_PRODUCT_LABEL]: "A100" } }),
    node("c", { gpus: "4", ready: "False" }),
    node("d", { gpus: "2" }),
  ];
  const inv = inventoryFromNodes(nodes, GPU_TYPE_OVERRIDE_LABEL);
  assert.equal(inv.total, 14);
  assert.deepEqual(inv.byType, [
    { gpuType: "A100", count: 8 },
    { gpuType: "NVIDIA-H100-80GB-HBM3", count: 6 },
  ]);
  assert.deepEqual(
    inv.nodes.map((n) => n.node),
    ["a", "b", "d"],
  );
  const reordered = inventoryFromNodes([...nodes].reverse(), GPU_TYPE_OVERRIDE_LABEL);
  assert.ok(sameNodes(inv, reordered), "list order does not matter");
  const moved = inventoryFromNodes(
    [node("a", { gpus: "8", labels: { [GPU_PRODUCT_LABEL]: "A100" } }), node("b", { gpus: "6" })],
    GPU_TYPE_OVERRIDE_LABEL,
  );
  assert.deepEqual(moved.byType, inv.byType);
  assert.equal(sameNodes(inv, moved), false, "same totals, different nodes: a change");
});

void test("fits: one node must hold a replica and the type's total all of them", () => {
  const inv = inventoryFromNodes(
    [node("a", { gpus: "4" }), node("b", { gpus: "4" })],
    GPU_TYPE_OVERRIDE_LABEL,
  );
  const t = "NVIDIA-H100-80GB-HBM3";
  assert.equal(fits(inv, t, 4, 2), true);
  assert.equal(fits(inv, t, 1, 8), true);
  assert.equal(fits(inv, t, 8, 1), false, "no single node has 8");
  assert.equal(fits(inv, t, 2, 5), false, "10 GPUs needed, 8 present");
  assert.equal(fits(inv, "A100", 1, 1), false, "a type the cluster lacks");
});
