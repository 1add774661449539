import assert from "node:assert/strict";
import { test } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import type { DeploymentRequest } from "../control-plane/api.js";
import { GPU_PRODUCT_LABEL, GPU_RESOURCE } from "./inventory.js";
import { parseSelector } from "./selector.js";
import { stripStamps } from "../core/stamps.js";
import {
  ANN_POD_MODEL,
  buildDeployment,
  buildService,
  gpuAffinity,
  LABEL_REQUEST_ID,
  workerArgs,
  workloadStatus,
} from "./workloads.js";

const req: DeploymentRequest = {
  kind: "deploy",
  requestId: "4f6b1f8e-2c1a-4a59-9a53-0a3c1d9d8e11",
  name: "llama",
  namespace: "team-a",
  model: "meta-llama/Llama-3.1-8B",
  image: "vllm/vllm-openai:v0.6.3",
  args: [],
  gpus: 2,
  gpuType: "NVIDIA-H100-80GB-HBM3",
  replicas: 3,
  submittedAt: "2026-01-01T00:00:00.000Z",
};
const placement = { nodeSelector: parseSelector("pool=inference"), gpuTypeLabel: "warmstart.dev/gpu-type" };

void test("with no args the worker gets --model <model>; given args are kept as they are", () => {
  assert.deepEqual(workerArgs(req), ["--model", "meta-llama/Llama-3.1-8B"]);
  assert.deepEqual(workerArgs({ ...req, args: ["serve", "x", "--tp", "2"] }), ["serve", "x", "--tp", "2"]);
});

void test("the Deployment: named after the request, N replicas, G GPUs each, placed on the type and pool", () => {
  const d = buildDeployment(req, "team-a", "msg-1", placement);
  assert.equal(d.metadata?.name, "llama");
  assert.equal(d.metadata?.namespace, "team-a");
  assert.equal(d.spec?.replicas, 3);
  assert.equal(d.metadata?.annotations?.["warmstart.dev/message-id"], "msg-1");
  assert.equal(d.spec?.selector.matchLabels?.[LABEL_REQUEST_ID], req.requestId);
  const c = d.spec?.template.spec?.containers[0];
  assert.equal(c?.image, req.image);
  assert.deepEqual(c?.args, ["--model", req.model]);
  assert.equal(c?.resources?.limits?.[GPU_RESOURCE], "2");
  assert.equal(c?.resources?.requests?.[GPU_RESOURCE], "2");
  assert.deepEqual(d.spec?.template.spec?.affinity, gpuAffinity(req.gpuType, placement));
  const s = buildService(req, "team-a");
  assert.deepEqual(s.spec?.selector, { [LABEL_REQUEST_ID]: req.requestId });
});

void test("affinity: the override label when a node has it, else the product label, always within the pool", () => {
  const terms = gpuAffinity("h100", placement).nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution
    ?.nodeSelectorTerms;
  assert.deepEqual(terms, [
    {
      matchExpressions: [
        { key: "warmstart.dev/gpu-type", operator: "In", values: ["h100"] },
        { key: "pool", operator: "In", values: ["inference"] },
      ],
    },
    {
      matchExpressions: [
        { key: "warmstart.dev/gpu-type", operator: "DoesNotExist" },
        { key: GPU_PRODUCT_LABEL, operator: "In", values: ["h100"] },
        { key: "pool", operator: "In", values: ["inference"] },
      ],
    },
  ]);
  const productOnly = gpuAffinity("h100", { nodeSelector: [], gpuTypeLabel: GPU_PRODUCT_LABEL });
  assert.equal(
    productOnly.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms.length,
    1,
  );
});

function pod(name: string, ready: boolean, phase = "Running", deleting = false): k8s.V1Pod {
  return {
    metadata: { name, ...(deleting ? { deletionTimestamp: new Date() } : {}) },
    status: { phase, conditions: [{ type: "Ready", status: ready ? "True" : "False" }] },
  };
}

void test("status: Deploying until every replica is ready, then Running, with per-pod readiness", () => {
  const dep: k8s.V1Deployment = { spec: { replicas: 2, selector: {}, template: {} } };
  const s1 = workloadStatus(dep, [pod("b", false, "Pending"), pod("a", true)]);
  assert.equal(s1.phase, "Deploying");
  assert.deepEqual(s1.instances, [
    { name: "a", phase: "Running", ready: true },
    { name: "b", phase: "Pending", ready: false },
  ]);
  assert.equal(workloadStatus(dep, [pod("a", true), pod("b", true)]).phase, "Running");
  assert.equal(
    workloadStatus(dep, [pod("a", true), pod("b", true, "Running", true)]).phase,
    "Deploying",
    "a pod being deleted does not count",
  );
  assert.equal(workloadStatus(undefined, []).phase, "Failed");
  const stalled: k8s.V1Deployment = {
    ...dep,
    status: {
      conditions: [
        { type: "Progressing", status: "False", reason: "ProgressDeadlineExceeded", message: "too slow" },
      ],
    },
  };
  assert.deepEqual(workloadStatus(stalled, []), { phase: "Failed", message: "too slow", instances: [] });
});

void test("a model URL's credentials never reach an annotation; the container's args keep them as given", () => {
  const model = "https://user:hf_s3cret@hub.example.com/org/m";
  const d = buildDeployment({ ...req, model, args: ["--model", model] }, "team-a", "msg-1", placement);
  assert.equal(d.metadata?.annotations?.["warmstart.dev/model"], "https://<redacted>@hub.example.com/org/m");
  assert.equal(
    d.spec?.template.metadata?.annotations?.[ANN_POD_MODEL],
    "https://<redacted>@hub.example.com/org/m",
  );
  assert.deepEqual(d.spec?.template.spec?.containers[0]?.args, ["--model", model]);
  const annotations = JSON.stringify([d.metadata?.annotations, d.spec?.template.metadata]);
  assert.ok(!annotations.includes("hf_s3cret"));
});

void test("the webhook leaves the agent's pods as the Deployment made them: still matched by its selector and its Service", () => {
  const d = buildDeployment(req, "team-a", "msg-1", placement);
  const template = d.spec!.template;
  // What admission does to every pod it sees: removes the stamps a pod's author wrote.
  const { pod, removed } = stripStamps({ metadata: template.metadata, spec: template.spec });
  assert.deepEqual(removed, []);
  const selects = (selector: Record<string, string>): boolean =>
    Object.entries(selector).every(([k, v]) => pod.metadata?.labels?.[k] === v);
  assert.ok(selects(d.spec!.selector.matchLabels!), "the ReplicaSet keeps its pods");
  assert.ok(selects(buildService(req, "team-a").spec!.selector!), "the Service finds them");
});
