import { test } from "node:test";
import assert from "node:assert/strict";
import type { V1Pod } from "@kubernetes/client-node";
import { parseAllDocuments } from "yaml";
import { classifyPod } from "./classify.js";
import {
  MAX_POD_CLAIMS,
  claimDeviceClasses,
  claimKey,
  gpuClassesOf,
  isGpuDeviceClass,
  podClaimRefs,
} from "./gpu.js";

type Obj = { kind?: string; metadata?: { name?: string }; spec?: Record<string, unknown> };
const docs = (text: string): Obj[] => parseAllDocuments(text).map((d) => d.toJS() as Obj);
const named = (objs: Obj[], kind: string, name: string): Obj =>
  objs.find((o) => o.kind === kind && o.metadata?.name === name)!;

/*
 * NVIDIA's DRA driver for GPUs, NVIDIA/k8s-dra-driver-gpu @ 22407113785e78c7763b4637689a201eb39c6199:
 * deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-{gpu,mig,vfio-gpu,
 * compute-domain-daemon}.yaml rendered with resourceApiVersion resource.k8s.io/v1, and the
 * per-profile class of demo/specs/extended-resources/mig-1g-12gb.yaml.
 */
const NVIDIA_CLASSES = docs(`
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
  extendedResourceName: nvidia.com/gpu
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: mig.nvidia.com
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: vfio.gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'"
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: compute-domain-daemon.nvidia.com
spec:
  selectors:
  - cel:
      expression: "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'daemon'"
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: mig-1g-12gb.gpu.nvidia.com
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig' && device.attributes['gpu.nvidia.com'].profile == '1g.12gb'"
  extendedResourceName: nvidia.com/mig-1g.12gb
`);

/*
 * The DRA example driver, kubernetes-sigs/dra-example-driver @ 31914ceacda29bbc55208ef75e68c0991e1c9568:
 * deployments/helm/dra-example-driver/templates/deviceclass.yaml rendered with its default
 * deviceProfile "gpu", and demo/examples/basic-resourceclaimtemplate/basic-resourceclaimtemplate.yaml
 * (its pod0): simulated devices, in a claim that says "gpu".
 */
const EXAMPLE = docs(`
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: gpu.example.com
spec:
  selectors:
  - cel:
      expression: "device.driver == 'gpu.example.com'"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  namespace: basic-resourceclaimtemplate
  name: single-gpu
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.example.com
---
apiVersion: v1
kind: Pod
metadata:
  namespace: basic-resourceclaimtemplate
  name: pod0
  labels:
    app: pod
spec:
  containers:
  - name: ctr0
    image: ubuntu:22.04
    command: ["bash", "-c"]
    args: ["export; trap 'exit 0' TERM; sleep 9999 & wait"]
    resources:
      claims:
      - name: gpu
  resourceClaims:
  - name: gpu
    resourceClaimTemplateName: single-gpu
`);

/*
 * NVIDIA/k8s-dra-driver-gpu @ 22407113785e78c7763b4637689a201eb39c6199: the claims of
 * demo/specs/quickstart/v1/gpu-test1.yaml (a template), gpu-test3.yaml (a shared ResourceClaim),
 * gpu-test4.yaml (MIG devices), gpu-test-vfiopci.yaml, and v1beta1/gpu-test1.yaml (the class
 * straight on the request).
 */
const NVIDIA_CLAIMS = docs(`
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: { namespace: gpu-test1, name: single-gpu }
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: gpu.nvidia.com
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: { namespace: gpu-test3, name: single-gpu }
spec:
  devices:
    requests:
    - name: gpu
      exactly:
        deviceClassName: gpu.nvidia.com
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: { namespace: gpu-test4, name: mig-devices }
spec:
  spec:
    devices:
      requests:
      - name: mig-1g-5gb-0
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: "device.attributes['gpu.nvidia.com'].profile == '1g.5gb'"
      - name: mig-2g-10gb
        exactly:
          deviceClassName: mig.nvidia.com
          selectors:
          - cel:
              expression: "device.attributes['gpu.nvidia.com'].profile == '2g.10gb'"
      constraints:
      - requests: []
        matchAttribute: "gpu.nvidia.com/parentUUID"
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: { namespace: gpu-test-vfio, name: single-gpu }
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly:
          deviceClassName: vfio.gpu.nvidia.com
---
apiVersion: resource.k8s.io/v1beta1
kind: ResourceClaimTemplate
metadata: { namespace: gpu-test1-beta, name: single-gpu }
spec:
  spec:
    devices:
      requests:
      - name: gpu
        deviceClassName: gpu.nvidia.com
`);

const CLASSES = [...NVIDIA_CLASSES, named(EXAMPLE, "DeviceClass", "gpu.example.com")];
const isGpu = (name: string): boolean => {
  const c = CLASSES.find((x) => x.metadata?.name === name);
  return c !== undefined && isGpuDeviceClass(c);
};
const templateClasses = (o: Obj): string[] => claimDeviceClasses(o.spec?.spec);

test("NVIDIA's GPU and MIG classes are GPUs; its VFIO and compute-domain classes and the example driver's are not", () => {
  const verdicts: Record<string, boolean> = {};
  for (const c of CLASSES) verdicts[c.metadata!.name!] = isGpuDeviceClass(c);
  assert.deepEqual(verdicts, {
    "gpu.nvidia.com": true,
    "mig.nvidia.com": true,
    "mig-1g-12gb.gpu.nvidia.com": true,
    "vfio.gpu.nvidia.com": false,
    "compute-domain-daemon.nvidia.com": false,
    "gpu.example.com": false,
  });
});

test("a DeviceClass is judged by the driver its selectors name, whatever its own name says", () => {
  const cls = (name: string, expression?: string): Obj => ({
    metadata: { name },
    spec: expression ? { selectors: [{ cel: { expression } }] } : {},
  });
  assert.equal(isGpuDeviceClass(cls("a100-80gb", `device.driver == "gpu.nvidia.com"`)), true);
  assert.equal(isGpuDeviceClass(cls("fast", `"gpu.nvidia.com" == device.driver`)), true);
  assert.equal(isGpuDeviceClass(cls("gpu.nvidia.com", `device.driver == 'fpga.example.com'`)), false);
  assert.equal(isGpuDeviceClass(cls("nvidia-gpu", `device.driver == 'gpu.example.com'`)), false);
  // Selectors that name no driver: the driver's own class names only.
  assert.equal(isGpuDeviceClass(cls("gpu.nvidia.com")), true);
  assert.equal(isGpuDeviceClass(cls("mig.nvidia.com", "device.capacity['x'].memory > 1")), true);
  assert.equal(isGpuDeviceClass(cls("gpu")), false);
  assert.equal(isGpuDeviceClass(undefined), false);
  assert.equal(isGpuDeviceClass({ spec: { selectors: "nonsense" } }), false);
});

test("a claim's device classes: v1 requests and their alternatives, v1beta1 requests, each once", () => {
  assert.deepEqual(templateClasses(named(NVIDIA_CLAIMS, "ResourceClaimTemplate", "single-gpu")), [
    "gpu.nvidia.com",
  ]);
  assert.deepEqual(
    claimDeviceClasses(named(NVIDIA_CLAIMS, "ResourceClaim", "single-gpu").spec),
    ["gpu.nvidia.com"],
    "a ResourceClaim's spec",
  );
  assert.deepEqual(templateClasses(named(NVIDIA_CLAIMS, "ResourceClaimTemplate", "mig-devices")), [
    "mig.nvidia.com",
  ]);
  const beta = NVIDIA_CLAIMS.find(
    (o) => o.metadata?.name === "single-gpu" && JSON.stringify(o).includes("beta"),
  );
  assert.deepEqual(templateClasses(beta!), ["gpu.nvidia.com"]);
  const alternatives = {
    devices: {
      requests: [
        { name: "a", firstAvailable: [{ name: "big", deviceClassName: "a100" }, { deviceClassName: "cpu" }] },
      ],
    },
  };
  assert.deepEqual(claimDeviceClasses(alternatives), ["a100", "cpu"]);
  assert.deepEqual(claimDeviceClasses(undefined), []);
  assert.deepEqual(claimDeviceClasses({ devices: { requests: [null, 7, { exactly: "x" }] } }), []);
});

test("what classify is told of a claim: its GPU classes under the driver's names, others left out", () => {
  assert.deepEqual(gpuClassesOf(["gpu.nvidia.com"], isGpu), ["gpu.nvidia.com"]);
  assert.deepEqual(gpuClassesOf(["mig-1g-12gb.gpu.nvidia.com", "mig.nvidia.com"], isGpu), [
    "gpu.nvidia.com",
    "mig.nvidia.com",
  ]);
  assert.deepEqual(gpuClassesOf(["vfio.gpu.nvidia.com", "gpu.example.com", "no-such-class"], isGpu), []);
  assert.deepEqual(
    gpuClassesOf(["a100-80gb"], (n) => n === "a100-80gb"),
    ["gpu.nvidia.com"],
  );
});

test("the example driver's pod, whose claim says gpu, is no GPU pod once its class is known; NVIDIA's under a neutral name is", () => {
  const pod = structuredClone(named(EXAMPLE, "Pod", "pod0")) as V1Pod;
  pod.spec!.containers[0]!.args = ["vllm serve Qwen/Qwen3-0.6B"];
  pod.spec!.containers[0]!.command = ["sh", "-c"];
  const template = named(EXAMPLE, "ResourceClaimTemplate", "single-gpu");
  const lookup = (ref: { template?: string }): string[] =>
    ref.template === "single-gpu" ? gpuClassesOf(templateClasses(template), isGpu) : [];
  assert.equal(classifyPod(pod).downloader, true, "offline, the claim's name decides");
  assert.equal(classifyPod(pod, { deviceClasses: lookup }).downloader, false);
  assert.equal(classifyPod(pod, { deviceClasses: lookup }).reason, "no GPU requested");

  // NVIDIA's gpu-test1 template behind names that say nothing of a GPU.
  const neutral = structuredClone(pod);
  neutral.spec!.resourceClaims = [{ name: "accel", resourceClaimTemplateName: "compute" }];
  neutral.spec!.containers[0]!.resources = { claims: [{ name: "accel" }] };
  const nvidia = named(NVIDIA_CLAIMS, "ResourceClaimTemplate", "single-gpu");
  const c = classifyPod(neutral, {
    deviceClasses: (ref) => (ref.template === "compute" ? gpuClassesOf(templateClasses(nvidia), isGpu) : []),
  });
  assert.equal(c.downloader, true);
  assert.equal(c.model, "Qwen/Qwen3-0.6B");
  assert.deepEqual(c.gpus, { "claim:template/compute": "1" });
});

test("a pod's claim refs: those its containers use, resolved to the first entry of a name, each object once, bounded", () => {
  const pod: V1Pod = {
    spec: {
      containers: [
        { name: "a", resources: { claims: [{ name: "g" }, { name: "shared" }, { name: "undeclared" }] } },
        { name: "b", resources: { claims: [{ name: "g2" }, { name: "shared" }] } },
        { name: "c" },
      ],
      resourceClaims: [
        { name: "g", resourceClaimTemplateName: "t" },
        { name: "g", resourceClaimTemplateName: "second-of-a-name" },
        { name: "g2", resourceClaimTemplateName: "t" },
        { name: "shared", resourceClaimName: "c" },
        { name: "unused", resourceClaimTemplateName: "u" },
      ],
    },
  };
  assert.deepEqual(podClaimRefs(pod).map(claimKey), ["template/t", "claim/c"]);
  assert.equal(claimKey({ name: "x" }), undefined);
  assert.deepEqual(podClaimRefs({ spec: { containers: "nonsense" } } as unknown as V1Pod), []);

  const many: V1Pod = {
    spec: {
      containers: [
        { name: "a", resources: { claims: Array.from({ length: 100 }, (_, i) => ({ name: `c${i}` })) } },
      ],
      resourceClaims: Array.from({ length: 100 }, (_, i) => ({
        name: `c${i}`,
        resourceClaimTemplateName: `t${i}`,
      })),
    },
  };
  assert.equal(podClaimRefs(many).length, MAX_POD_CLAIMS);
});
