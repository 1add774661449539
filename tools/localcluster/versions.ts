import { homedir } from "node:os";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { localStateDir } from "../../src/common/local-defaults.js";

/** Pinned versions of the local control plane; see docs/local-cluster.md for why these. */
export const VERSIONS = {
  kubernetes: "v1.35.4",
  etcd: "v3.6.16",
  kwok: "v0.8.0",
  helm: "v3.22.0",
} as const;

/**
 * Kubernetes' own gang scheduling in 1.35 (k8s.io/kubernetes v1.35.4, pkg/features/kube_features.go):
 * GenericWorkload serves the `scheduling.k8s.io/v1alpha1` Workload API and the pod's
 * `spec.workloadRef`; GangScheduling (which needs it) is the scheduler's gang plugin.
 */
export const GANG_FEATURE_GATES = "GenericWorkload=true,GangScheduling=true";

/** The package root (this file runs from dist/tools/localcluster/). */
export const PACKAGE_ROOT = resolve(fileURLToPath(new URL(".", import.meta.url)), "../../..");

/** What the local cluster builds is cached outside the work tree, so every checkout and CI run reuses it. */
export function cacheDir(): string {
  return (
    process.env.WARMSTART_CACHE_DIR ??
    join(process.env.XDG_CACHE_HOME ?? join(homedir(), ".cache"), "warmstart")
  );
}

/** Binaries are cached by version. */
export function binDir(): string {
  return join(cacheDir(), `k8s-${VERSIONS.kubernetes}-etcd-${VERSIONS.etcd}-kwok-${VERSIONS.kwok}`);
}

/** Where a running local cluster keeps its state (certs, etcd data, pid file, logs). */
export const stateDir = localStateDir;

export const BINARIES = [
  "etcd",
  "kwok",
  "kube-apiserver",
  "kube-controller-manager",
  "kube-scheduler",
  "kubelet",
  "helm",
] as const;
export type Binary = (typeof BINARIES)[number];
