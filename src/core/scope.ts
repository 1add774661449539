/**
 * Sharing scopes: a cache is shared by the pods of one hash inside one scope and never
 * outside it. The scope key enters the hash, so two scopes never meet on one Lease, record or claim.
 */
import { LABEL_SHARE_GROUP, UNADMITTED_NAMESPACES, type SharingScope } from "./contract.js";

export const SHARING_SCOPES: readonly SharingScope[] = ["cluster", "namespace", "group"];

/** The whole cluster is one scope; its key is left out of the hash so cluster-scope hashes stay as they were. */
export const CLUSTER_SCOPE_KEY = "cluster";

/**
 * The scope a pod's caches live in: `cluster`, `namespace:<ns>`, or `group:<value>` for a
 * namespace labelled `warmstart.dev/share-group=<value>` (a namespace without the label, or with
 * an empty value, is its own group, the same key as under `namespace`).
 */
export function scopeKey(
  scope: SharingScope,
  namespace: string,
  namespaceLabels: Readonly<Record<string, string>> | undefined,
): string {
  if (scope === "cluster") return CLUSTER_SCOPE_KEY;
  const group = namespaceLabels?.[LABEL_SHARE_GROUP];
  if (scope === "group" && group) return `group:${group}`;
  return `namespace:${namespace}`;
}

/**
 * Whether a namespace lies inside a cache's scope key (a record's `scopeOfInputs`). A pod's stamp
 * says which hash it wants, not that it may have it: claims go only where this holds.
 */
export function namespaceInScope(
  scope: string,
  namespace: string,
  namespaceLabels: Readonly<Record<string, string>> | undefined,
): boolean {
  // No scope holds a namespace the webhook never sees: its pods' stamps are their authors' own.
  if (!namespace || UNADMITTED_NAMESPACES.includes(namespace)) return false;
  if (scope === CLUSTER_SCOPE_KEY) return true;
  if (scope.startsWith("namespace:")) return scope === `namespace:${namespace}`;
  if (scope.startsWith("group:"))
    return namespaceLabels?.[LABEL_SHARE_GROUP] === scope.slice("group:".length);
  return false;
}

/** Whether deciding `namespaceInScope` needs the namespace's labels. */
export const scopeNeedsLabels = (scope: string): boolean => scope.startsWith("group:");
