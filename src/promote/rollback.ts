/**
 * Rolling a cache back (docs/adr/0005-release-controller.md): everything its promotes created
 * in cluster scope and in every namespace (claims `rox-<short>`, their PVs, per-namespace
 * VolumeSnapshots and VolumeSnapshotContents, the store snapshot) is found by its
 * `warmstart.dev/hash` label and deleted. Each delete is retried with bounded backoff; what still exists afterwards is reported
 * with why (a claim a running pod still mounts stays until that pod goes), never hidden.
 *
 * The stored trees are the node agents' part: each agent that wrote one put its own finalizer on
 * the record and removes the tree, then its finalizer, once the record is being deleted. The
 * record itself goes when the last finalizer does.
 */
import * as k8s from "@kubernetes/client-node";
import { CacheRecords } from "../common/cache-record.js";
import { transition } from "../api/transitions.js";
import { PHASE } from "../api/names.js";
import { REASON } from "../api/reasons.js";
import { apiError, isConflict, isNotFound } from "../common/kube.js";
import type { Logger } from "../common/log.js";
import { getModelCache, storeFinalizer, type ModelCacheObject } from "../common/modelcache.js";
import {
  FINALIZER_CLEANUP,
  FINALIZER_STORE_PREFIX,
  LABEL_HASH,
  MODELCACHE,
  claimName,
  shortHash,
} from "../core/contract.js";
import type { CreatedObject, PromoteClients } from "./claims.js";
import { SNAPSHOT_GROUP, SNAPSHOT_VERSION } from "./objects.js";
import { retry, type RetryOptions } from "./promote.js";

const ref = { group: MODELCACHE.group, version: MODELCACHE.version, plural: MODELCACHE.plural };
const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);

export type CleanupKind =
  "PersistentVolumeClaim" | "PersistentVolume" | "VolumeSnapshot" | "VolumeSnapshotContent";

export interface CleanupItem {
  kind: CleanupKind | "ModelCache" | "StoredTree";
  name: string;
  namespace?: string;
  /** deleted: by this pass; left: still there (see `why`). */
  state: "deleted" | "left";
  why?: string;
}

export interface CleanupReport {
  items: CleanupItem[];
  left: CleanupItem[];
}

export interface CleanupOptions {
  retry?: Partial<Pick<RetryOptions, "attempts" | "initialMs" | "maxMs">>;
  log?: Logger;
}

const DEFAULT_RETRY = { attempts: 4, initialMs: 200, maxMs: 2_000 } as const;

/** Claims first: a PV or snapshot goes after whatever was made from it. */
const DELETE_ORDER: readonly CleanupKind[] = [
  "PersistentVolumeClaim",
  "PersistentVolume",
  "VolumeSnapshot",
  "VolumeSnapshotContent",
];

interface Found {
  kind: CleanupKind;
  name: string;
  namespace?: string;
  deleting: boolean;
  finalizers: string[];
}

const describe = (i: { kind: string; name: string; namespace?: string }): string =>
  `${i.kind} ${i.namespace ? `${i.namespace}/` : ""}${i.name}`;

/** Lists what the cache's promotes created; a snapshot kind the cluster does not serve holds nothing. */
async function listCreated(c: PromoteClients, short: string): Promise<Found[]> {
  const labelSelector = `${LABEL_HASH}=${short}`;
  const meta = (kind: CleanupKind, m: k8s.V1ObjectMeta | undefined): Found => ({
    kind,
    name: m?.name ?? "",
    ...(m?.namespace ? { namespace: m.namespace } : {}),
    deleting: Boolean(m?.deletionTimestamp),
    finalizers: m?.finalizers ?? [],
  });
  const out: Found[] = [];
  try {
    const claims = await c.core.listPersistentVolumeClaimForAllNamespaces({ labelSelector });
    out.push(...claims.items.map((x) => meta("PersistentVolumeClaim", x.metadata)));
    const pvs = await c.core.listPersistentVolume({ labelSelector });
    out.push(...pvs.items.map((x) => meta("PersistentVolume", x.metadata)));
  } catch (err) {
    throw apiError(`listing the volumes of cache ${short}`, err);
  }
  for (const [kind, plural] of [
    ["VolumeSnapshot", "volumesnapshots"],
    ["VolumeSnapshotContent", "volumesnapshotcontents"],
  ] as const) {
    try {
      const list = (await c.custom.listClusterCustomObject({
        group: SNAPSHOT_GROUP,
        version: SNAPSHOT_VERSION,
        plural,
        labelSelector,
      })) as { items: k8s.KubernetesObject[] };
      out.push(...list.items.map((x) => meta(kind, x.metadata)));
    } catch (err) {
      if (isNotFound(err)) continue;
      throw apiError(`listing the ${plural} of cache ${short}`, err);
    }
  }
  return out;
}

/** Deletes one object; with `uid`, only that very object (another one of its name is not ours). */
async function deleteOne(c: PromoteClients, f: Found, uid?: string): Promise<void> {
  const snap = { group: SNAPSHOT_GROUP, version: SNAPSHOT_VERSION };
  const only = uid ? { body: { preconditions: { uid } } } : {};
  try {
    switch (f.kind) {
      case "PersistentVolumeClaim":
        await c.core.deleteNamespacedPersistentVolumeClaim({
          name: f.name,
          namespace: f.namespace!,
          ...only,
        });
        return;
      case "PersistentVolume":
        await c.core.deletePersistentVolume({ name: f.name, ...only });
        return;
      case "VolumeSnapshot":
        await c.custom.deleteNamespacedCustomObject({
          ...snap,
          plural: "volumesnapshots",
          namespace: f.namespace!,
          name: f.name,
          ...only,
        });
        return;
      case "VolumeSnapshotContent":
        await c.custom.deleteClusterCustomObject({
          ...snap,
          plural: "volumesnapshotcontents",
          name: f.name,
          ...only,
        });
        return;
    }
  } catch (err) {
    if (isNotFound(err) || (uid && isConflict(err))) return;
    throw apiError(`deleting ${describe(f)}`, err);
  }
}

/** The pods on a node that mount a claim of this name (`namespace/name`): they hold its tree. */
async function podsMountingOn(c: PromoteClients, node: string, claim: string): Promise<string[]> {
  return c.core
    .listPodForAllNamespaces({ fieldSelector: `spec.nodeName=${node}` })
    .then((l) =>
      l.items
        .filter((p) => (p.spec?.volumes ?? []).some((v) => v.persistentVolumeClaim?.claimName === claim))
        .map((p) => `${p.metadata?.namespace ?? "?"}/${p.metadata?.name ?? "?"}`)
        .sort(),
    )
    .catch(() => [] as string[]);
}

/** Why an object that was deleted is still there: who holds it. */
async function holdReason(c: PromoteClients, f: Found): Promise<string> {
  if (f.kind === "PersistentVolumeClaim" && f.finalizers.includes("kubernetes.io/pvc-protection")) {
    const pods = await c.core
      .listNamespacedPod({ namespace: f.namespace! })
      .then((l) =>
        l.items
          .filter((p) => (p.spec?.volumes ?? []).some((v) => v.persistentVolumeClaim?.claimName === f.name))
          .map((p) => p.metadata?.name ?? "?"),
      )
      .catch(() => [] as string[]);
    return pods.length ? `in use by pod(s) ${pods.join(", ")}` : "held by kubernetes.io/pvc-protection";
  }
  return f.finalizers.length ? `being deleted, held by ${f.finalizers.join(", ")}` : "still present";
}

/**
 * Deletes everything the cache's promotes created, each delete retried, then looks again and
 * reports what is still there and why. Idempotent: anyone may run it again (the release
 * controller for `kubectl delete modelcache`, the operator's `warmstart cache delete`).
 */
async function removeCacheObjects(
  c: PromoteClients,
  short: string,
  o: CleanupOptions = {},
): Promise<CleanupReport> {
  const opts = { ...DEFAULT_RETRY, ...o.retry };
  const items: CleanupItem[] = [];
  const errors = new Map<string, string>();
  const found = await retry(() => listCreated(c, short), opts);
  for (const kind of DELETE_ORDER) {
    for (const f of found.filter((x) => x.kind === kind && !x.deleting)) {
      try {
        await retry(() => deleteOne(c, f), {
          ...opts,
          onRetry: (attempt, err, delayMs) =>
            o.log?.warn({ object: describe(f), attempt, retryInMs: delayMs, err }, "delete failed; retrying"),
        });
        items.push({
          kind: f.kind,
          name: f.name,
          ...(f.namespace ? { namespace: f.namespace } : {}),
          state: "deleted",
        });
      } catch (err) {
        errors.set(describe(f), (err as Error).message);
      }
    }
  }
  const still = await retry(() => listCreated(c, short), opts);
  const left: CleanupItem[] = [];
  for (const f of still) {
    const why =
      errors.get(describe(f)) ?? (f.deleting ? await holdReason(c, f) : "created after the first look");
    left.push({
      kind: f.kind,
      name: f.name,
      ...(f.namespace ? { namespace: f.namespace } : {}),
      state: "left",
      why,
    });
  }
  // Deleted here but gone from the second look: done. Deleted and still there: reported as left.
  const leftKeys = new Set(left.map(describe));
  return { items: items.filter((i) => !leftKeys.has(describe(i))).concat(left), left };
}

/** A record's store finalizers whose node no longer exists: no agent is left to honour them. */
async function orphanedStoreFinalizers(core: k8s.CoreV1Api, cache: ModelCacheObject): Promise<string[]> {
  const mine = (cache.metadata.finalizers ?? []).filter((f) => f.startsWith(FINALIZER_STORE_PREFIX));
  if (!mine.length) return [];
  const nodes = await core.listNode().catch((err: unknown) => {
    throw apiError("listing nodes", err);
  });
  const live = new Set(nodes.items.map((n) => storeFinalizer(n.metadata?.name ?? "")));
  return mine.filter((f) => !live.has(f));
}

async function setFinalizers(
  c: PromoteClients,
  name: string,
  edit: (f: string[]) => string[],
): Promise<ModelCacheObject | undefined> {
  for (let attempt = 0; attempt < 8; attempt++) {
    const cache = await getModelCache(c.custom, name);
    if (!cache) return undefined;
    const now = cache.metadata.finalizers ?? [];
    const next = edit(now);
    if (next.length === now.length && next.every((f, i) => f === now[i])) return cache;
    try {
      return (await c.custom.patchClusterCustomObject(
        {
          ...ref,
          name,
          body: { metadata: { resourceVersion: cache.metadata.resourceVersion, finalizers: next } },
        },
        merge,
      )) as ModelCacheObject;
    } catch (err) {
      if (isConflict(err)) continue;
      if (isNotFound(err)) return undefined;
      throw apiError(`updating the finalizers of ModelCache ${name}`, err);
    }
  }
  throw new Error(`ModelCache ${name}: finalizers kept changing under 8 attempts`);
}

export interface DeleteReport extends CleanupReport {
  /** The record is gone (every finalizer honoured). */
  gone: boolean;
  /** Nodes whose agents have not removed their stored tree yet. */
  nodesPending: string[];
}

/**
 * One pass of a cache's deletion, safe to repeat: the record stops being usable (Failed,
 * reason Deleting, so admission no longer restores from it) and is deleted, then the cluster
 * objects are removed; once none is left, the cleanup finalizer goes, as do store finalizers of
 * nodes that no longer exist. The stored trees are removed by their agents.
 */
export async function deleteCachePass(
  c: PromoteClients,
  hashOrShort: string,
  o: CleanupOptions & { startDeletion?: boolean } = {},
): Promise<DeleteReport> {
  const name = shortHash(hashOrShort);
  let cache = await getModelCache(c.custom, name);
  if (cache && !cache.metadata.deletionTimestamp && o.startDeletion !== false) {
    await markDeleting(c, name);
    try {
      await retry(() => c.custom.deleteClusterCustomObject({ ...ref, name }), {
        ...DEFAULT_RETRY,
        ...o.retry,
        retryable: (err) => !isNotFound(err),
      });
    } catch (err) {
      if (!isNotFound(err)) throw apiError(`deleting ModelCache ${name}`, err);
    }
    cache = await getModelCache(c.custom, name);
  }
  const report = await removeCacheObjects(c, name, o);
  if (cache?.metadata.deletionTimestamp) {
    const orphans = await orphanedStoreFinalizers(c.core, cache);
    if (orphans.length)
      o.log?.info({ hash: name, finalizers: orphans }, "dropping the finalizers of nodes that are gone");
    const clean = report.left.length === 0;
    cache = await setFinalizers(c, name, (f) =>
      f.filter((x) => !orphans.includes(x) && !(clean && x === FINALIZER_CLEANUP)),
    );
  }
  const nodesPending = (cache?.metadata.finalizers ?? [])
    .filter((f) => f.startsWith(FINALIZER_STORE_PREFIX))
    .map((f) => f.slice(FINALIZER_STORE_PREFIX.length));
  const left = [...report.left];
  if (cache) {
    for (const node of nodesPending) {
      const holders = await podsMountingOn(c, node, claimName(name));
      left.push({
        kind: "StoredTree",
        name,
        namespace: undefined,
        state: "left",
        why: holders.length
          ? `on node ${node}: in use by pod(s) ${holders.join(", ")}; removed once they go`
          : `on node ${node}: its agent has not removed it yet`,
      });
    }
    left.push({
      kind: "ModelCache",
      name,
      state: "left",
      why: `waiting for ${(cache.metadata.finalizers ?? []).join(", ") || "the API server"}`,
    });
  }
  return { items: report.items, left, gone: !cache, nodesPending };
}

/**
 * Failed, reason Deleting: admission stops restoring from the cache before its objects go. A
 * record that keeps changing fails the pass (the delete waits for the next one) rather than
 * being deleted while it may still be restored from.
 */
async function markDeleting(c: PromoteClients, name: string): Promise<void> {
  await new CacheRecords(c.custom).transition(name, (cache) => {
    const s = cache.status;
    // Deletion is not about an election: any phase moves, and once marked it is left alone.
    const phase = transition(s?.phase, "deleting", false);
    return s?.reason === REASON.Deleting || phase === "ignore"
      ? undefined
      : { phase, reason: REASON.Deleting, message: "the cache is being deleted" };
  });
}

/** One line per thing left, for operators. */
export function describeLeft(left: CleanupItem[]): string[] {
  return left.map((i) => `${describe(i)}: ${i.why ?? "still there"}`);
}

const leftItem = (f: Found, why: string): CleanupItem => ({
  kind: f.kind,
  name: f.name,
  ...(f.namespace ? { namespace: f.namespace } : {}),
  state: "left",
  why,
});

/**
 * Why a failed or superseded promote of `election` must leave its objects where they are, or
 * undefined when they are its own to take back. Objects are named per cache, so a promote of
 * another election (and admission, for a Ready cache) converges on them through AlreadyExists:
 * once the record says another election is promoting, or the cache is Ready, they may be in use.
 */
async function takenOver(c: PromoteClients, short: string, election: string): Promise<string | undefined> {
  const cache = await getModelCache(c.custom, short);
  const s = cache?.status;
  if (!cache || cache.metadata.deletionTimestamp) return undefined;
  if (s?.phase === PHASE.Ready) return "the cache is Ready";
  if (s?.phase === PHASE.Promoting && s.electionId !== election)
    return `election ${s.electionId ?? "?"} is promoting`;
  return undefined;
}

/**
 * Takes back what one election's promote created (never what it found) once that promote failed
 * or was superseded, so neither leaves claims, volumes or snapshots behind. The record is looked
 * at before each delete (see `takenOver`), and each delete is conditional on the UID created: an
 * object removed and made again since by someone else stays. Returns what was left, and why.
 */
export async function removeCreated(
  c: PromoteClients,
  short: string,
  election: string,
  made: readonly CreatedObject[],
  o: CleanupOptions = {},
): Promise<CleanupItem[]> {
  const opts = { ...DEFAULT_RETRY, ...o.retry };
  const left: CleanupItem[] = [];
  const todo = [...made].sort((a, b) => DELETE_ORDER.indexOf(a.kind) - DELETE_ORDER.indexOf(b.kind));
  const itemOf = (m: CreatedObject): Found => ({
    kind: m.kind,
    name: m.name,
    ...(m.namespace ? { namespace: m.namespace } : {}),
    deleting: false,
    finalizers: [],
  });
  for (const [i, m] of todo.entries()) {
    const why = await retry(() => takenOver(c, short, election), opts).catch(
      (err: unknown) => `the record could not be read: ${(err as Error).message}`,
    );
    if (why) {
      left.push(...todo.slice(i).map((x) => leftItem(itemOf(x), why)));
      break;
    }
    try {
      await retry(() => deleteOne(c, itemOf(m), m.uid), opts);
    } catch (err) {
      left.push(leftItem(itemOf(m), (err as Error).message));
    }
  }
  if (left.length)
    o.log?.warn({ hash: short, election, left: describeLeft(left) }, "promote objects left in place");
  return left;
}
