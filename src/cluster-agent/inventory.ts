/**
 * The cluster's GPU capacity as the agent counts it, computed from Node objects by pure functions.
 */
import type * as k8s from "@kubernetes/client-node";
import type { InventoryItem } from "../control-plane/api.js";
import { GPU_PRODUCT_LABEL, GPU_RESOURCE } from "../core/gpu.js";

export { GPU_PRODUCT_LABEL, GPU_RESOURCE };

/** The type given to GPUs on a node that carries neither the override label nor the product label. */
export const UNKNOWN_GPU_TYPE = "unknown";

export interface NodeGpus {
  node: string;
  gpuType: string;
  count: number;
}

export interface GpuInventory {
  total: number;
  /** Per GPU type, sorted by type: what the control plane is told. */
  byType: InventoryItem[];
  /** Per counted node, sorted by name: what decides whether a replica fits. */
  nodes: NodeGpus[];
}

export const EMPTY_INVENTORY: GpuInventory = Object.freeze({ total: 0, byType: [], nodes: [] });

/**
 * What one node contributes, or undefined when it does not count: it must be Ready, schedulable
 * and have allocatable GPUs. The type comes from `typeLabel` when set there, else the product label.
 */
export function nodeGpus(node: k8s.V1Node, typeLabel: string): NodeGpus | undefined {
  const name = node.metadata?.name;
  if (!name) return undefined;
  if (node.spec?.unschedulable === true) return undefined;
  const ready = node.status?.conditions?.find((c) => c.type === "Ready");
  if (ready?.status !== "True") return undefined;
  const count = parseCount(node.status?.allocatable?.[GPU_RESOURCE]);
  if (count <= 0) return undefined;
  const labels = node.metadata?.labels ?? {};
  const gpuType = labels[typeLabel] || labels[GPU_PRODUCT_LABEL] || UNKNOWN_GPU_TYPE;
  return { node: name, gpuType, count };
}

export function summarize(nodes: readonly NodeGpus[]): GpuInventory {
  const sorted = [...nodes].sort((a, b) => (a.node < b.node ? -1 : a.node > b.node ? 1 : 0));
  const byType = new Map<string, number>();
  for (const n of sorted) byType.set(n.gpuType, (byType.get(n.gpuType) ?? 0) + n.count);
  return {
    total: sorted.reduce((s, n) => s + n.count, 0),
    byType: [...byType.entries()]
      .sort(([a], [b]) => (a < b ? -1 : 1))
      .map(([gpuType, count]) => ({ gpuType, count })),
    nodes: sorted,
  };
}

export function inventoryFromNodes(nodes: readonly k8s.V1Node[], typeLabel: string): GpuInventory {
  return summarize(nodes.map((n) => nodeGpus(n, typeLabel)).filter((n): n is NodeGpus => n !== undefined));
}

/** Equal node by node: the debounce compares these, so a GPU moving between nodes is a change. */
export function sameNodes(a: GpuInventory, b: GpuInventory): boolean {
  return JSON.stringify(a.nodes) === JSON.stringify(b.nodes);
}

/** Equal as the control plane sees it (counts per type): only this needs a new registration. */
export function sameCapacity(a: readonly InventoryItem[], b: readonly InventoryItem[]): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

/**
 * Whether `replicas` replicas of `gpus` GPUs each of `gpuType` can fit: one node of that type must
 * hold a whole replica, and the type's total must hold them all. (Allocated GPUs are the
 * scheduler's business; this only keeps requests the cluster could never run off it.)
 */
export function fits(inv: GpuInventory, gpuType: string, gpus: number, replicas: number): boolean {
  const ofType = inv.nodes.filter((n) => n.gpuType === gpuType);
  return ofType.some((n) => n.count >= gpus) && ofType.reduce((s, n) => s + n.count, 0) >= gpus * replicas;
}

export function describe(inv: GpuInventory): string {
  if (inv.total === 0) return "no GPUs";
  return inv.byType.map((t) => `${t.count}x ${t.gpuType}`).join(", ");
}

function parseCount(q: string | undefined): number {
  if (q === undefined) return 0;
  // Extended resources are whole numbers; anything else (a typo, a suffix) counts as none.
  return /^\d+$/.test(q.trim()) ? Number(q.trim()) : 0;
}
