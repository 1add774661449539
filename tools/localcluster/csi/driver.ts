/**
 * A CSI driver stand-in for the local cluster, as KWOK stands in for nodes: it plays a storage
 * vendor's driver so that promote's CSI backends (shared-volume, snapshot-clone) run end to end
 * with the real Kubernetes sidecars (external-provisioner, csi-snapshotter, snapshot-controller)
 * and a real kubelet. Volumes are folders under its data folder, snapshots and clones are copies
 * (times kept), and NodePublish is a bind mount, read-only when asked. Block volumes are refused.
 * It speaks CSI v1 over gRPC from the spec's own csi.proto, and registers with the kubelet's
 * plugin watcher through the kubelet's registration API.
 */
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import {
  mkdir,
  readFile,
  readdir,
  realpath,
  rename,
  rm,
  rmdir,
  stat,
  unlink,
  writeFile,
} from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";

const run = promisify(execFile);

export const CSI_DRIVER_NAME = "folders.csi.warmstart.dev";
const GiB = 2 ** 30;

export interface DriverOptions {
  name?: string;
  /** Where volumes and snapshots live. */
  dataDir: string;
  /** unix socket path of the CSI endpoint. */
  socket: string;
  /** The node this driver's node service runs on. */
  nodeId: string;
  /** Folder holding csi.proto and pluginregistration.proto. */
  protoDir: string;
  /** The kubelet's plugin registration folder (`<kubelet root>/plugins_registry`), to register there. */
  registrationDir?: string;
  log?: (line: string) => void;
}

/** gRPC error with a status code, as CSI wants them. */
class CsiError extends Error {
  constructor(
    readonly code: grpc.status,
    message: string,
  ) {
    super(message);
  }
}
const invalid = (m: string): CsiError => new CsiError(grpc.status.INVALID_ARGUMENT, m);
const notFound = (m: string): CsiError => new CsiError(grpc.status.NOT_FOUND, m);

interface VolumeMeta {
  name: string;
  id: string;
  capacity: number;
  parameters: Record<string, string>;
  source?: { snapshot?: string; volume?: string };
}

interface SnapshotMeta {
  name: string;
  id: string;
  source: string;
  size: number;
  createdMs: number;
  /** False for a class with `readyToUse: "false"`: a snapshot that never becomes usable (fault tests). */
  ready: boolean;
}

type Req = Record<string, unknown>;
type Handler = (req: Req) => Promise<unknown>;

/** A stable id for a name (CreateVolume and CreateSnapshot are idempotent by name). */
const idFor = (prefix: string, name: string): string =>
  `${prefix}-${createHash("sha256").update(name).digest("hex").slice(0, 20)}`;

export class FolderDriver {
  private readonly name: string;
  private readonly servers: grpc.Server[] = [];
  private readonly volumes: string;
  private readonly snapshots: string;
  private readonly log: (line: string) => void;

  constructor(private readonly o: DriverOptions) {
    this.name = o.name ?? CSI_DRIVER_NAME;
    this.volumes = join(o.dataDir, "volumes");
    this.snapshots = join(o.dataDir, "snapshots");
    this.log = o.log ?? (() => undefined);
  }

  /** Where a volume's data is (the shared-volume backend's per-namespace handles carry a `#` suffix). */
  volumeDir(volumeId: string): string {
    return join(this.volumes, volumeId.split("#")[0]!);
  }

  /**
   * What a publish mounts: the volume's folder, or its `subDir` folder when the volume's
   * attributes name one (as NFS's driver does), which must be a folder inside the volume.
   */
  private async publishedDir(volumeId: string, context: Record<string, string> | undefined): Promise<string> {
    const root = this.volumeDir(volumeId);
    if (!existsSync(root)) throw notFound(`volume ${volumeId} does not exist`);
    const sub = context?.subDir ?? "";
    if (!sub) return root;
    const realRoot = await realpath(root);
    const dir = await realpath(join(root, sub)).catch(() => undefined);
    const inside = dir !== undefined && (dir === realRoot || dir.startsWith(`${realRoot}/`));
    if (!inside || !(await stat(dir).then((s) => s.isDirectory())))
      throw notFound(`subDir ${sub} is not a folder inside volume ${volumeId}`);
    return dir;
  }

  async start(): Promise<void> {
    await mkdir(this.volumes, { recursive: true });
    await mkdir(this.snapshots, { recursive: true });
    const load = (file: string): grpc.GrpcObject =>
      grpc.loadPackageDefinition(
        protoLoader.loadSync(join(this.o.protoDir, file), {
          keepCase: true,
          longs: Number,
          enums: String,
          defaults: true,
          oneofs: true,
        }),
      );
    const csi = (
      load("csi.proto") as unknown as { csi: { v1: Record<string, { service: grpc.ServiceDefinition }> } }
    ).csi.v1;
    const server = new grpc.Server();
    server.addService(csi.Identity!.service, this.wrap(this.identity()));
    server.addService(csi.Controller!.service, this.wrap(this.controller()));
    server.addService(csi.Node!.service, this.wrap(this.node()));
    await this.bind(server, this.o.socket);

    if (this.o.registrationDir) {
      const reg = (
        load("pluginregistration.proto") as unknown as {
          pluginregistration: { Registration: { service: grpc.ServiceDefinition } };
        }
      ).pluginregistration;
      const registration = new grpc.Server();
      registration.addService(
        reg.Registration.service,
        this.wrap({
          GetInfo: () =>
            Promise.resolve({
              type: "CSIPlugin",
              name: this.name,
              endpoint: this.o.socket,
              supported_versions: ["1.0.0"],
            }),
          NotifyRegistrationStatus: (r) => {
            this.log(
              `kubelet registration: ${r.plugin_registered ? "registered" : `failed: ${String(r.error)}`}`,
            );
            return Promise.resolve({});
          },
        }),
      );
      await mkdir(this.o.registrationDir, { recursive: true });
      // A short name: a unix socket path is at most 107 bytes, and kubelet roots can be deep.
      await this.bind(registration, join(this.o.registrationDir, "wsfolders-reg.sock"));
    }
  }

  async stop(): Promise<void> {
    await Promise.all(this.servers.map((s) => new Promise<void>((r) => s.tryShutdown(() => r()))));
  }

  private async bind(server: grpc.Server, socket: string): Promise<void> {
    await unlink(socket).catch(() => undefined);
    await mkdir(join(socket, ".."), { recursive: true });
    await new Promise<void>((resolve, reject) =>
      server.bindAsync(`unix://${socket}`, grpc.ServerCredentials.createInsecure(), (err) =>
        err ? reject(err) : resolve(),
      ),
    );
    this.servers.push(server);
  }

  /** Handlers as promises; a CsiError becomes its status code, anything else INTERNAL. */
  private wrap(handlers: Record<string, Handler>): grpc.UntypedServiceImplementation {
    const impl: grpc.UntypedServiceImplementation = {};
    for (const [method, fn] of Object.entries(handlers)) {
      impl[method] = (call: grpc.ServerUnaryCall<Req, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        fn(call.request).then(
          (res) => cb(null, res),
          (err: unknown) => {
            const e =
              err instanceof CsiError ? err : new CsiError(grpc.status.INTERNAL, (err as Error).message);
            this.log(`${method}: ${grpc.status[e.code]}: ${e.message}`);
            cb({ code: e.code, details: e.message });
          },
        );
      };
    }
    return impl;
  }

  private identity(): Record<string, Handler> {
    return {
      GetPluginInfo: () => Promise.resolve({ name: this.name, vendor_version: "0.1.0" }),
      GetPluginCapabilities: () =>
        Promise.resolve({ capabilities: [{ service: { type: "CONTROLLER_SERVICE" } }] }),
      Probe: () => Promise.resolve({ ready: { value: true } }),
    };
  }

  private controller(): Record<string, Handler> {
    const rpc = (type: string): { rpc: { type: string } } => ({ rpc: { type } });
    return {
      ControllerGetCapabilities: () =>
        Promise.resolve({
          capabilities: [
            "CREATE_DELETE_VOLUME",
            "CREATE_DELETE_SNAPSHOT",
            "CLONE_VOLUME",
            "LIST_SNAPSHOTS",
          ].map(rpc),
        }),
      CreateVolume: (r) => this.createVolume(r),
      DeleteVolume: async (r) => {
        const id = required(r.volume_id, "volume_id");
        await rm(this.volumeDir(id), { recursive: true, force: true });
        await rm(`${this.volumeDir(id)}.json`, { force: true });
        return {};
      },
      ValidateVolumeCapabilities: async (r) => {
        const id = required(r.volume_id, "volume_id");
        const caps = capabilities(r.volume_capabilities);
        if (!(await this.readVolume(id))) throw notFound(`volume ${id} does not exist`);
        const unsupported = caps.find((c) => !c.mount);
        return unsupported
          ? { message: "only filesystem (mount) volumes are supported" }
          : {
              confirmed: {
                volume_context: r.volume_context,
                volume_capabilities: caps,
                parameters: r.parameters,
              },
            };
      },
      CreateSnapshot: (r) => this.createSnapshot(r),
      DeleteSnapshot: async (r) => {
        const id = required(r.snapshot_id, "snapshot_id");
        await rm(join(this.snapshots, id), { recursive: true, force: true });
        await rm(join(this.snapshots, `${id}.json`), { force: true });
        return {};
      },
      ListSnapshots: (r) => this.listSnapshots(r),
    };
  }

  private node(): Record<string, Handler> {
    return {
      NodeGetInfo: () => Promise.resolve({ node_id: this.o.nodeId, max_volumes_per_node: 0 }),
      NodeGetCapabilities: () => Promise.resolve({ capabilities: [] }),
      NodePublishVolume: async (r) => {
        const id = required(r.volume_id, "volume_id");
        const target = required(r.target_path, "target_path");
        const cap = r.volume_capability as
          | { mount?: { mount_flags?: string[] }; block?: unknown; access_mode?: { mode?: string } }
          | undefined;
        if (!cap) throw invalid("volume_capability is required");
        if (!cap.mount) throw invalid("only filesystem (mount) volumes are supported");
        const src = await this.publishedDir(id, r.volume_context as Record<string, string> | undefined);
        // As drivers do, a volume is published read-only when the pod asks, when the PV's mount
        // options say `ro`, and when it is published for many readers (ReadOnlyMany).
        const readOnly =
          Boolean(r.readonly) ||
          (cap.mount.mount_flags ?? []).includes("ro") ||
          cap.access_mode?.mode === "MULTI_NODE_READER_ONLY";
        await mkdir(target, { recursive: true });
        if (!(await isMountPoint(target))) {
          await run("mount", ["--bind", src, target]);
          // A retried publish takes an existing mount point as done: never leave a writable
          // bind where read-only was asked.
          if (readOnly)
            await run("mount", ["-o", "remount,bind,ro", target]).catch(async (err: unknown) => {
              await run("umount", [target]).catch(() => undefined);
              throw err;
            });
          const flags = cap.mount.mount_flags?.length ? ` -o ${cap.mount.mount_flags.join(",")}` : "";
          this.log(`published ${id} at ${target}${readOnly ? " (read-only)" : ""}${flags}`);
        }
        return {};
      },
      NodeUnpublishVolume: async (r) => {
        required(r.volume_id, "volume_id");
        const target = required(r.target_path, "target_path");
        while (await isMountPoint(target)) await run("umount", [target]);
        // rmdir, not rm -r: should anything still be mounted below, its data stays.
        await rmdir(target).catch(() => undefined);
        return {};
      },
    };
  }

  private async createVolume(r: Req): Promise<unknown> {
    const name = required(r.name, "name");
    const caps = capabilities(r.volume_capabilities);
    if (caps.some((c) => c.block))
      throw invalid("block volumes are not supported: this driver serves folders");
    const range = r.capacity_range as { required_bytes?: number; limit_bytes?: number } | undefined;
    const wanted = Number(range?.required_bytes ?? 0) || GiB;
    const limit = Number(range?.limit_bytes ?? 0);
    if (limit && limit < wanted) throw invalid("limit_bytes is below required_bytes");
    const source = r.volume_content_source as
      { snapshot?: { snapshot_id?: string }; volume?: { volume_id?: string } } | undefined;
    const id = idFor("vol", name);
    const existing = await this.readVolume(id);
    if (existing) {
      if (existing.capacity < wanted || (limit && existing.capacity > limit))
        throw new CsiError(grpc.status.ALREADY_EXISTS, `volume ${name} exists with another size`);
      return { volume: this.volumeOut(existing) };
    }
    const dir = this.volumeDir(id);
    const staging = `${dir}.creating`;
    await rm(staging, { recursive: true, force: true });
    const meta: VolumeMeta = {
      name,
      id,
      capacity: wanted,
      parameters: (r.parameters ?? {}) as Record<string, string>,
    };
    if (source?.snapshot) {
      const sid = required(source.snapshot.snapshot_id, "snapshot_id");
      const snap = await this.readSnapshot(sid);
      if (!snap) throw notFound(`snapshot ${sid} does not exist`);
      await copyTree(join(this.snapshots, sid), staging);
      meta.source = { snapshot: sid };
      meta.capacity = Math.max(wanted, snap.size);
    } else if (source?.volume) {
      const vid = required(source.volume.volume_id, "volume_id");
      if (!(await this.readVolume(vid))) throw notFound(`volume ${vid} does not exist`);
      await copyTree(this.volumeDir(vid), staging);
      meta.source = { volume: vid };
    } else {
      await mkdir(staging, { mode: 0o777 });
    }
    await rename(staging, dir);
    await writeFile(`${dir}.json`, JSON.stringify(meta));
    this.log(`created volume ${id} (${name})${meta.source ? ` from ${JSON.stringify(meta.source)}` : ""}`);
    return { volume: this.volumeOut(meta) };
  }

  private volumeOut(m: VolumeMeta): unknown {
    return {
      volume_id: m.id,
      capacity_bytes: m.capacity,
      volume_context: m.parameters,
      ...(m.source?.snapshot ? { content_source: { snapshot: { snapshot_id: m.source.snapshot } } } : {}),
      ...(m.source?.volume ? { content_source: { volume: { volume_id: m.source.volume } } } : {}),
    };
  }

  private async createSnapshot(r: Req): Promise<unknown> {
    const name = required(r.name, "name");
    const source = required(r.source_volume_id, "source_volume_id");
    const id = idFor("snap", name);
    const existing = await this.readSnapshot(id);
    if (existing) {
      if (existing.source !== source)
        throw new CsiError(grpc.status.ALREADY_EXISTS, `snapshot ${name} exists for another volume`);
      return { snapshot: snapshotOut(existing) };
    }
    if (!(await this.readVolume(source))) throw notFound(`volume ${source} does not exist`);
    const dir = join(this.snapshots, id);
    await rm(`${dir}.creating`, { recursive: true, force: true });
    await copyTree(this.volumeDir(source), `${dir}.creating`);
    await rename(`${dir}.creating`, dir);
    const params = (r.parameters ?? {}) as Record<string, string>;
    const meta: SnapshotMeta = {
      name,
      id,
      source,
      size: await treeBytes(dir),
      createdMs: Date.now(),
      ready: params.readyToUse !== "false",
    };
    await writeFile(`${dir}.json`, JSON.stringify(meta));
    this.log(`snapshot ${id} of ${source} (${meta.size} B)`);
    return { snapshot: snapshotOut(meta) };
  }

  private async listSnapshots(r: Req): Promise<unknown> {
    let all: SnapshotMeta[] = [];
    for (const f of (await readdir(this.snapshots)).filter((x) => x.endsWith(".json")).sort()) {
      const m = await this.readSnapshot(f.slice(0, -".json".length));
      if (m) all.push(m);
    }
    if (r.snapshot_id) all = all.filter((s) => s.id === r.snapshot_id);
    if (r.source_volume_id) all = all.filter((s) => s.source === r.source_volume_id);
    const start = r.starting_token ? Number(r.starting_token) : 0;
    if (!Number.isInteger(start) || start < 0 || start > all.length)
      throw new CsiError(grpc.status.ABORTED, `bad starting_token ${String(r.starting_token)}`);
    const max = Number(r.max_entries ?? 0);
    if (max < 0) throw invalid("max_entries must not be negative");
    const page = max > 0 ? all.slice(start, start + max) : all.slice(start);
    const next = start + page.length < all.length ? String(start + page.length) : "";
    return { entries: page.map((s) => ({ snapshot: snapshotOut(s) })), next_token: next };
  }

  private async readVolume(id: string): Promise<VolumeMeta | undefined> {
    return readJson<VolumeMeta>(`${this.volumeDir(id)}.json`);
  }

  private async readSnapshot(id: string): Promise<SnapshotMeta | undefined> {
    if (!/^[\w.-]+$/.test(id)) return undefined;
    return readJson<SnapshotMeta>(join(this.snapshots, `${id}.json`));
  }
}

function snapshotOut(s: SnapshotMeta): unknown {
  return {
    snapshot_id: s.id,
    source_volume_id: s.source,
    size_bytes: s.size,
    creation_time: { seconds: Math.floor(s.createdMs / 1000), nanos: (s.createdMs % 1000) * 1e6 },
    ready_to_use: s.ready !== false,
  };
}

function required(v: unknown, field: string): string {
  if (typeof v !== "string" || v === "") throw invalid(`${field} is required`);
  return v;
}

function capabilities(v: unknown): { mount?: unknown; block?: unknown; access_mode?: unknown }[] {
  if (!Array.isArray(v) || v.length === 0) throw invalid("volume_capabilities is required");
  for (const c of v as { mount?: unknown; block?: unknown }[])
    if (!c?.mount && !c?.block) throw invalid("a volume capability needs an access type");
  return v as { mount?: unknown; block?: unknown }[];
}

async function readJson<T>(path: string): Promise<T | undefined> {
  try {
    return JSON.parse(await readFile(path, "utf8")) as T;
  } catch {
    return undefined;
  }
}

/** A copy with times, modes and links kept, as a storage snapshot would be. */
async function copyTree(from: string, to: string): Promise<void> {
  await run("cp", ["-a", "--reflink=auto", `${from}/.`, to]).catch(async (err: unknown) => {
    if (!existsSync(to)) await mkdir(to);
    await run("cp", ["-a", `${from}/.`, to]).catch(() => {
      throw err;
    });
  });
}

async function treeBytes(dir: string): Promise<number> {
  let n = 0;
  for (const e of await readdir(dir, { withFileTypes: true, recursive: true })) {
    if (e.isFile()) n += (await stat(join(e.parentPath, e.name))).size;
  }
  return n;
}

async function isMountPoint(path: string): Promise<boolean> {
  const info = await readFile("/proc/self/mountinfo", "utf8");
  return info.split("\n").some((l) => l.split(" ")[4] === path);
}
