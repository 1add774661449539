/**
 * How Kubernetes names GPUs: the extended resource a device plugin advertises and the label GPU
 * feature discovery puts on a node. Product code takes these from here, never from the local
 * cluster tooling.
 */
export { GPU_RESOURCE } from "./classify.js";

export const GPU_PRODUCT_LABEL = "nvidia.com/gpu.product";
