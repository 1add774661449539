/**
 * Storage profiles (docs/adr/0006-capture-and-promote.md): how a cache store's storage is promoted to read-only claims, and
 * how restores from it prewarm. Keyed by provisioner (the cache store's StorageClass provisioner,
 * or HOST_PATH_PROVISIONER for a node-local store), with per-volume-type overrides. Built-in
 * profiles cover common drivers; ConfigMap `warmstart-storage-profiles` in the system namespace
 * overrides them field by field: each data key is a provisioner, each value a YAML (or JSON)
 * object of settings.
 */
import * as k8s from "@kubernetes/client-node";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { HOST_PATH_PROVISIONER, STORAGE_PROFILES_CONFIGMAP } from "../core/contract.js";
import { apiError, isNotFound } from "../common/kube.js";
import type { Logger } from "../common/log.js";

export const BACKENDS = [
  "host-path",
  "node-store",
  "shared-volume",
  "snapshot-clone",
  "per-pod-clone",
] as const;
export type Backend = (typeof BACKENDS)[number];

export const DEFAULT_PREWARM_PARALLELISM = 6;
/** Shared-volume handle per consumer namespace; `{handle}` is the store volume's own handle. */
export const DEFAULT_HANDLE_TEMPLATE = "{handle}#{path}#{namespace}";

const Settings = z
  .object({
    backend: z.enum(BACKENDS),
    /** StorageClass of the promoted PVs and claims ("" or unset: none, so nothing provisions them). */
    storageClassName: z.string(),
    /** VolumeSnapshotClass for snapshot-clone. */
    snapshotClass: z.string(),
    /** Shared-volume handle per namespace: `{handle}`, `{namespace}`, `{short}`, `{path}` are replaced. */
    handleTemplate: z.string().min(1),
    /**
     * Extra CSI volume attributes of the per-namespace PVs (same placeholders, plus `{attr:NAME}`
     * and `{handle:N}` for the store volume's attribute and handle part; one rendered empty is
     * removed).
     */
    volumeAttributes: z.record(z.string(), z.string()),
    /**
     * shared-volume: the handle or attributes name the tree's folder (`{path}`) in a way the
     * driver mounts just that folder. Without it a restore would see the whole store, every tree
     * of every scope, so the backend is refused (SPEC 1.9).
     */
    mountsTree: z.boolean(),
    mountOptions: z.array(z.string().min(1)),
    /**
     * Host-path PVs: `local` (default, mounted `ro` on the node) or `hostPath` (takes no mount
     * options: a pod that mounts the claim without `readOnly`, as root, could write the tree).
     */
    hostPathType: z.enum(["local", "hostPath"]),
    prewarm: z.boolean(),
    prewarmParallelism: z.number().int().min(1).max(256),
    /** Why these settings suit the driver, shown with the profile in logs and records. */
    why: z.string(),
  })
  .partial()
  .strict();
type Settings = z.infer<typeof Settings>;

const Entry = Settings.extend({ volumeTypes: z.record(z.string().min(1), Settings).optional() }).strict();
export type ProfileEntry = z.infer<typeof Entry>;

export interface StorageProfile {
  provisioner: string;
  volumeType?: string;
  backend: Backend;
  storageClassName: string;
  snapshotClass?: string;
  handleTemplate: string;
  volumeAttributes: Record<string, string>;
  mountsTree: boolean;
  mountOptions: string[];
  hostPathType: "local" | "hostPath";
  prewarm: boolean;
  prewarmParallelism: number;
  /** Where the settings came from, for logs and the cache record. */
  origin: "built-in" | "configmap" | "none";
  /** Why the backend was chosen when no profile names the provisioner. */
  note?: string;
  /** Why the profile suits the driver (its documentation, in a line). */
  why?: string;
}

/**
 * Known drivers, each with why (from the drivers' own documentation). A provisioner nobody
 * describes is treated as per-pod clone: it cannot be shared.
 */
export const BUILT_IN_PROFILES: Readonly<Record<string, ProfileEntry>> = {
  [HOST_PATH_PROVISIONER]: {
    backend: "host-path",
    hostPathType: "local",
    why: "a node-local store: local PVs pinned to its node",
  },
  "kubernetes.io/no-provisioner": {
    backend: "host-path",
    hostPathType: "local",
    why: "static local volumes: a folder on one node",
  },
  "rancher.io/local-path": {
    backend: "host-path",
    // A local PV serves a host folder as well, and unlike hostPath it takes `ro` (SPEC 1.9).
    hostPathType: "local",
    why: "local-path-provisioner keeps volumes as host folders: local PVs pinned to their node, mounted read-only",
  },
  "nfs.csi.k8s.io": {
    backend: "shared-volume",
    // The driver mounts server:share/subdir: the tree's folder becomes the share, nothing above it.
    volumeAttributes: { share: "{attr:share}/{attr:subdir}/{path}", subdir: "" },
    mountsTree: true,
    why: "NFS shares mount read-only on any number of nodes, each PV at the tree's own folder",
  },
  "filestore.csi.storage.gke.io": {
    backend: "shared-volume",
    why: "Filestore is NFS, but its driver mounts a whole share: give this profile templates that name {path} to share it",
  },
  "efs.csi.aws.com": {
    backend: "shared-volume",
    // fs-id[:subpath[:access-point]]: the tree's folder becomes the subpath.
    handleTemplate: "{handle:0}:/{handle:1}/{path}:{handle:2}",
    mountsTree: true,
    // EFS throughput grows with parallel clients and requests.
    prewarmParallelism: 16,
    why: "EFS is NFS across zones; its handle fs-id[:/subpath][:access-point] mounts the tree's folder on many nodes",
  },
  "fsx.csi.aws.com": {
    backend: "shared-volume",
    // Lustre mounts a sub-folder as dnsname@tcp:/mountname/folder.
    volumeAttributes: { mountname: "{attr:mountname}/{path}" },
    mountsTree: true,
    prewarmParallelism: 16,
    why: "FSx for Lustre is a parallel file system every node mounts, here at the tree's folder",
  },
  "file.csi.azure.com": {
    backend: "shared-volume",
    why: "Azure Files shares are ReadWriteMany, but a PV mounts a whole share: give this profile templates that name {path} to share it",
  },
  "cephfs.csi.ceph.com": {
    backend: "shared-volume",
    why: "CephFS volumes are ReadWriteMany, but a dynamic volume mounts whole: give this profile static-volume templates (rootPath with {path}) to share it",
  },
  "rbd.csi.ceph.com": {
    backend: "snapshot-clone",
    why: "RBD clones a snapshot into a volume that maps read-only on many nodes",
  },
  "nvmesh-csi.excelero.com": {
    backend: "shared-volume",
    // XFS on a block device other nodes also mount: no log replay, no UUID clash.
    mountOptions: ["ro", "norecovery", "nouuid"],
    why: "NVMesh volumes attach to many nodes (ro, norecovery, nouuid), but a file system on a block volume mounts whole, every tree in it, so it is not shared",
  },
  "pd.csi.storage.gke.io": {
    backend: "snapshot-clone",
    why: "a PD clone of a snapshot attaches read-only to many nodes (Hyperdisk ML)",
    volumeTypes: {
      "hyperdisk-ml": { backend: "snapshot-clone", why: "Hyperdisk ML attaches read-only to many nodes" },
      "pd-balanced": { backend: "per-pod-clone", why: "pd-balanced is not shared read-only in this profile" },
      "pd-ssd": { backend: "per-pod-clone", why: "pd-ssd is not shared read-only in this profile" },
    },
  },
  "ebs.csi.aws.com": {
    backend: "per-pod-clone",
    why: "EBS volumes attach to one node at a time: each pod would need its own clone",
  },
  "disk.csi.azure.com": {
    backend: "per-pod-clone",
    why: "Azure Disks attach to one node at a time (shared disks need maxShares and a cluster file system)",
  },
};

/**
 * Why pods of this store cannot be restored through a shared read-only claim, or undefined when
 * they can: a per-pod clone cannot be named ahead, and a shared volume that would mount the
 * whole store shows every tree of every scope to whoever mounts the claim (SPEC 1.9).
 */
export function unshareable(p: StorageProfile): string | undefined {
  const why = p.why ?? p.note ?? p.backend;
  const storage = `${p.provisioner}${p.volumeType ? ` (${p.volumeType})` : ""}`;
  if (p.backend === "per-pod-clone")
    return `the cache stores' storage ${storage} clones a volume per pod (${why}): no shared read-only claim, pods start cold`;
  if (p.backend === "shared-volume" && !p.mountsTree)
    return `the cache stores' driver ${storage} would mount the whole store, every cache in it, not one tree (${why}); its storage profile needs mountsTree with a handle or attributes naming {path}: pods start cold`;
  return undefined;
}

/**
 * The backend of a node-local store (SPEC 1.5): `node-store` when this node's agent serves the
 * CSI driver `store.warmstart.dev` (`--csi-plugin-dir`), so a restore may run on any node and the
 * driver fills that node's store from its peers; `host-path` (local PVs pinned to the tree's node)
 * when it does not, as on a single node. A profile that names `node-store` while no driver is
 * served falls back to host-path too: nothing would mount its volumes.
 */
export function withStoreDriver(p: StorageProfile, driverServed: boolean): StorageProfile {
  if (driverServed && p.backend === "host-path")
    return {
      ...p,
      backend: "node-store",
      why: "a node-local store served by the node agent's CSI driver store.warmstart.dev: mounted read-only on any node, replicated from peers first where the node lacks the tree",
    };
  if (!driverServed && p.backend === "node-store")
    return {
      ...p,
      backend: "host-path",
      why: "node-store without the node agent's CSI driver (--csi-plugin-dir): local PVs pinned to the tree's node",
    };
  return p;
}

export interface ParsedProfiles {
  entries: Map<string, ProfileEntry>;
  /** One line per data key that was not a valid profile (those keys are ignored). */
  errors: string[];
}

/** Parses the ConfigMap's data; a bad key is reported and skipped, never fatal for the others. */
export function parseProfiles(data: Readonly<Record<string, string>> | undefined): ParsedProfiles {
  const entries = new Map<string, ProfileEntry>();
  const errors: string[] = [];
  for (const [key, raw] of Object.entries(data ?? {})) {
    let value: unknown;
    try {
      value = parseYaml(raw);
    } catch (err) {
      errors.push(`${key}: not YAML or JSON: ${(err as Error).message.split("\n")[0]}`);
      continue;
    }
    const parsed = Entry.safeParse(value ?? {});
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      errors.push(`${key}: ${issue?.path.join(".") || "value"}: ${issue?.message ?? "invalid"}`);
      continue;
    }
    entries.set(key, parsed.data);
  }
  return { entries, errors };
}

/**
 * The effective profile of a provisioner and volume type: defaults, then the built-in entry, then
 * the ConfigMap entry, then each one's per-type override, later layers winning field by field.
 */
export function resolveProfile(
  configured: ReadonlyMap<string, ProfileEntry>,
  provisioner: string,
  volumeType?: string,
): StorageProfile {
  const builtIn = BUILT_IN_PROFILES[provisioner];
  const fromMap = configured.get(provisioner);
  const layers: Settings[] = [];
  for (const e of [builtIn, fromMap]) {
    if (!e) continue;
    const { volumeTypes: _types, ...base } = e;
    layers.push(base);
  }
  for (const e of [builtIn, fromMap]) {
    const t = volumeType ? e?.volumeTypes?.[volumeType] : undefined;
    if (t) layers.push(t);
  }
  const merged: Settings = Object.assign({}, ...layers) as Settings;
  const known = builtIn !== undefined || fromMap !== undefined;
  return {
    provisioner,
    ...(volumeType ? { volumeType } : {}),
    backend: merged.backend ?? "per-pod-clone",
    storageClassName: merged.storageClassName ?? "",
    ...(merged.snapshotClass ? { snapshotClass: merged.snapshotClass } : {}),
    handleTemplate: merged.handleTemplate ?? DEFAULT_HANDLE_TEMPLATE,
    volumeAttributes: merged.volumeAttributes ?? {},
    mountsTree: merged.mountsTree ?? false,
    mountOptions: merged.mountOptions ?? [],
    hostPathType: merged.hostPathType ?? "local",
    prewarm: merged.prewarm ?? true,
    prewarmParallelism: merged.prewarmParallelism ?? DEFAULT_PREWARM_PARALLELISM,
    origin: fromMap ? "configmap" : builtIn ? "built-in" : "none",
    ...(known
      ? merged.why
        ? { why: merged.why }
        : {}
      : {
          note: `no storage profile names provisioner ${provisioner}; add one to ConfigMap ${STORAGE_PROFILES_CONFIGMAP} to share its volumes`,
        }),
  };
}

/**
 * Reads the profiles ConfigMap with a short cache, so the webhook's hot path costs no API call
 * per pod. An unreadable or missing ConfigMap means built-in profiles only (logged, never fatal).
 */
export class StorageProfiles {
  private cached: { at: number; entries: Map<string, ProfileEntry> } | undefined;
  private loading: Promise<Map<string, ProfileEntry>> | undefined;
  private lastErrors = "";

  constructor(
    private readonly core: k8s.CoreV1Api,
    private readonly namespace: string,
    private readonly log: Logger,
    private readonly ttlMs = 5_000,
  ) {}

  async resolve(provisioner: string, volumeType?: string): Promise<StorageProfile> {
    return resolveProfile(await this.entries(), provisioner, volumeType);
  }

  /** Drops the cached copy (tests and callers that just changed the ConfigMap). */
  invalidate(): void {
    this.cached = undefined;
  }

  private async entries(): Promise<Map<string, ProfileEntry>> {
    if (this.cached && Date.now() - this.cached.at < this.ttlMs) return this.cached.entries;
    this.loading ??= this.load().finally(() => (this.loading = undefined));
    return this.loading;
  }

  private async load(): Promise<Map<string, ProfileEntry>> {
    let data: Record<string, string> | undefined;
    try {
      const cm = await this.core.readNamespacedConfigMap({
        name: STORAGE_PROFILES_CONFIGMAP,
        namespace: this.namespace,
      });
      data = cm.data;
    } catch (err) {
      if (!isNotFound(err)) {
        const e = apiError(`reading ConfigMap ${this.namespace}/${STORAGE_PROFILES_CONFIGMAP}`, err);
        // Keep what we knew: a blip of the API server must not flip every profile to defaults.
        if (this.cached) {
          this.log.warn({ err: e }, "storage profiles unreadable; keeping the last ones read");
          return this.cached.entries;
        }
        // Nothing known yet: fail (and retry) rather than take a custom provisioner for unsupported.
        throw e;
      }
    }
    const { entries, errors } = parseProfiles(data);
    const summary = errors.join("; ");
    if (summary && summary !== this.lastErrors) {
      this.log.error({ configMap: STORAGE_PROFILES_CONFIGMAP, errors }, "invalid storage profiles ignored");
    }
    this.lastErrors = summary;
    this.cached = { at: Date.now(), entries };
    return entries;
  }
}
