import * as k8s from "@kubernetes/client-node";
import { isAlreadyExists } from "../../src/common/kube.js";
import { GPU_PRODUCT_LABEL, GPU_RESOURCE } from "../../src/core/gpu.js";

// Defined with the product code; re-exported for the tooling and tests that import them here.
export { GPU_PRODUCT_LABEL, GPU_RESOURCE };
/** Where the node agent of a simulated node finds that node's kubelet root. */
export const KUBELET_ROOT_ANNOTATION = "sim.warmstart.dev/kubelet-root";

export interface SimNodeSpec {
  name: string;
  gpus: number;
  product?: string;
  kubeletRoot?: string;
}

/** A Node object that KWOK manages: it marks it Ready, heartbeats it and runs the pods bound to it. */
export function simulatedNode(spec: SimNodeSpec): k8s.V1Node {
  const resources = {
    cpu: "64",
    memory: "512Gi",
    pods: "110",
    "ephemeral-storage": "1Ti",
    [GPU_RESOURCE]: String(spec.gpus),
  };
  return {
    apiVersion: "v1",
    kind: "Node",
    metadata: {
      name: spec.name,
      labels: {
        type: "kwok",
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        [GPU_PRODUCT_LABEL]: spec.product ?? "NVIDIA-H100-80GB-HBM3",
      },
      annotations: {
        "kwok.x-k8s.io/node": "fake",
        ...(spec.kubeletRoot ? { [KUBELET_ROOT_ANNOTATION]: spec.kubeletRoot } : {}),
      },
    },
    status: { capacity: resources, allocatable: resources },
  };
}

/** Create (or keep) a simulated GPU node and make sure its status carries the GPU capacity. */
export async function ensureSimulatedNode(core: k8s.CoreV1Api, spec: SimNodeSpec): Promise<void> {
  const node = simulatedNode(spec);
  try {
    await core.createNode({ body: node });
  } catch (err) {
    if (!isAlreadyExists(err)) throw err;
  }
  await setNodeGpus(core, spec.name, spec.gpus);
}

/** Patch a node's GPU capacity and allocatable (status subresource), as a device plugin would. */
export async function setNodeGpus(core: k8s.CoreV1Api, name: string, gpus: number): Promise<void> {
  const patch = [
    { op: "add", path: "/status/capacity/nvidia.com~1gpu", value: String(gpus) },
    { op: "add", path: "/status/allocatable/nvidia.com~1gpu", value: String(gpus) },
  ];
  await core.patchNodeStatus(
    { name, body: patch },
    k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch),
  );
}
