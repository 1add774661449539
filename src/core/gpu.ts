/**
 * How Kubernetes names GPUs: the extended resource a device plugin advertises, the label GPU
 * feature discovery puts on a node, and the DeviceClasses of NVIDIA's DRA driver. Product code
 * takes these from here, never from the local cluster tooling.
 */
import type { V1Pod } from "@kubernetes/client-node";
import type { ClaimRef } from "./classify.js";
import { listOf } from "./env.js";
import { isRecord } from "./guards.js";

export { GPU_RESOURCE } from "./classify.js";

export const GPU_PRODUCT_LABEL = "nvidia.com/gpu.product";

/**
 * The GPU products a pod can land on by its own choice: its node selector's
 * `nvidia.com/gpu.product`, and the `In` values of that key in its required node affinity (any
 * term). Sorted, each once; empty when the pod does not choose.
 */
export function gpuProductsOf(pod: V1Pod): string[] {
  const spec = isRecord(pod.spec) ? pod.spec : undefined;
  const out = new Set<string>();
  const selected = isRecord(spec?.nodeSelector) ? spec.nodeSelector[GPU_PRODUCT_LABEL] : undefined;
  if (typeof selected === "string" && selected) out.add(selected);
  const required = spec?.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution;
  for (const term of listOf(isRecord(required) ? required.nodeSelectorTerms : undefined)) {
    if (!isRecord(term)) continue;
    for (const e of Array.isArray(term.matchExpressions) ? (term.matchExpressions as unknown[]) : []) {
      if (!isRecord(e) || e.key !== GPU_PRODUCT_LABEL || e.operator !== "In") continue;
      for (const v of Array.isArray(e.values) ? (e.values as unknown[]) : [])
        if (typeof v === "string" && v) out.add(v);
    }
  }
  return [...out].sort();
}

/**
 * The driver name of NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu): its DeviceClasses select
 * their devices by it (`device.driver == 'gpu.nvidia.com'`).
 */
export const NVIDIA_GPU_DRIVER = "gpu.nvidia.com";
/**
 * The classes that driver installs for devices a container computes on: whole GPUs and MIG
 * devices. Not `vfio.gpu.nvidia.com`: a GPU bound to vfio-pci is handed to a virtual machine.
 */
const NVIDIA_COMPUTE_CLASSES: ReadonlySet<string> = new Set([NVIDIA_GPU_DRIVER, "mig.nvidia.com"]);
/** The most DRA claims of one pod looked up at admission; any further claim counts as no GPU. */
export const MAX_POD_CLAIMS = 32;
/** The most device class names read from one claim (its requests and their alternatives). */
const MAX_CLAIM_CLASSES = 64;

const DRIVER_EQUALS = /device\.driver\s*==\s*(['"])([^'"]*)\1|(['"])([^'"]*)\3\s*==\s*device\.driver/g;
const VFIO_TYPE = /\.type\s*==\s*(['"])vfio\1/;

const recordsOf = (v: unknown): Record<string, unknown>[] =>
  Array.isArray(v) ? (v as unknown[]).filter(isRecord) : [];

/** The CEL expressions of a DeviceClass's selectors. */
function selectorExpressions(deviceClass: unknown): string[] {
  const spec = isRecord(deviceClass) && isRecord(deviceClass.spec) ? deviceClass.spec : {};
  return recordsOf(spec.selectors)
    .map((s) => (isRecord(s.cel) ? s.cel.expression : undefined))
    .filter((e): e is string => typeof e === "string");
}

/**
 * Whether a DeviceClass (resource.k8s.io, any version) hands out NVIDIA GPUs a container computes
 * on. Its selectors decide where they name a driver: a cluster's own `a100-80gb` that selects
 * `gpu.nvidia.com` is one, `gpu.example.com` is not, whatever the names say. A class whose
 * selectors name no driver counts by the driver's own class names. A device handed to a virtual
 * machine (`type == 'vfio'`) never counts.
 */
export function isGpuDeviceClass(deviceClass: unknown): boolean {
  const cel = selectorExpressions(deviceClass);
  if (cel.some((e) => VFIO_TYPE.test(e))) return false;
  const drivers = cel.flatMap((e) => [...e.matchAll(DRIVER_EQUALS)].map((m) => m[2] ?? m[4]));
  if (drivers.length) return drivers.includes(NVIDIA_GPU_DRIVER);
  const meta = isRecord(deviceClass) && isRecord(deviceClass.metadata) ? deviceClass.metadata : {};
  return typeof meta.name === "string" && NVIDIA_COMPUTE_CLASSES.has(meta.name);
}

/**
 * The device classes a claim's spec asks for (a ResourceClaim's `spec`, a template's
 * `spec.spec`): each request's (`exactly.deviceClassName` in v1, `deviceClassName` in v1beta1)
 * and its alternatives' (`firstAvailable`). Each once.
 */
export function claimDeviceClasses(claimSpec: unknown): string[] {
  const devices = isRecord(claimSpec) && isRecord(claimSpec.devices) ? claimSpec.devices : {};
  const out = new Set<string>();
  const add = (r: Record<string, unknown>): void => {
    if (typeof r.deviceClassName === "string" && r.deviceClassName && out.size < MAX_CLAIM_CLASSES)
      out.add(r.deviceClassName);
  };
  for (const request of recordsOf(devices.requests)) {
    add(request);
    if (isRecord(request.exactly)) add(request.exactly);
    for (const alternative of recordsOf(request.firstAvailable)) add(alternative);
  }
  return [...out];
}

/**
 * What classify is told of one claim: its NVIDIA GPU classes, each under a name of the driver's
 * own (classify reads class names, and a class that selects the driver need not be named for it).
 * Other classes are left out.
 */
export function gpuClassesOf(classNames: readonly string[], isGpu: (name: string) => boolean): string[] {
  const out = new Set<string>();
  for (const n of classNames) if (isGpu(n)) out.add(NVIDIA_COMPUTE_CLASSES.has(n) ? n : NVIDIA_GPU_DRIVER);
  return [...out];
}

/** A claim ref's key in lookups: the object it names (the pod's own name for it does not matter). */
export function claimKey(ref: ClaimRef): string | undefined {
  if (ref.template !== undefined) return `template/${ref.template}`;
  if (ref.claim !== undefined) return `claim/${ref.claim}`;
  return undefined;
}

/**
 * The DRA claims a pod's containers use, resolved as classify resolves them (the first
 * `spec.resourceClaims` entry of a name): each object once, at most MAX_POD_CLAIMS.
 */
export function podClaimRefs(pod: V1Pod): ClaimRef[] {
  const spec = isRecord(pod.spec) ? pod.spec : undefined;
  const declared = new Map<string, Record<string, unknown>>();
  for (const d of recordsOf(spec?.resourceClaims))
    if (typeof d.name === "string" && !declared.has(d.name)) declared.set(d.name, d);
  if (!declared.size) return [];
  const out = new Map<string, ClaimRef>();
  for (const c of recordsOf(spec?.containers)) {
    const resources = isRecord(c.resources) ? c.resources : {};
    for (const used of recordsOf(resources.claims)) {
      const d = typeof used.name === "string" ? declared.get(used.name) : undefined;
      if (!d) continue;
      const ref: ClaimRef = {
        name: d.name as string,
        ...(typeof d.resourceClaimTemplateName === "string" ? { template: d.resourceClaimTemplateName } : {}),
        ...(typeof d.resourceClaimName === "string" ? { claim: d.resourceClaimName } : {}),
      };
      const key = claimKey(ref);
      if (key === undefined || out.has(key)) continue;
      if (out.size >= MAX_POD_CLAIMS) return [...out.values()];
      out.set(key, ref);
    }
  }
  return [...out.values()];
}
