/**
 * `store.warmstart.dev`: the CSI driver of the `node-store` backend (SPEC 1.5, ADR 0011), served
 * by the node agent on every node. Identity and node services only: its PersistentVolumes are
 * static (promote creates them, handle = the full cache hash), so there is no controller service,
 * no attach and no staging. A publish is always a read-only, nosuid, nodev bind of exactly one
 * committed tree of the node's store at the kubelet's target path; when the node lacks the tree
 * it is first had from peers (`ensureTree`, the replication receiver), never mounted half-made.
 *
 * It registers with the kubelet's plugin watcher itself: a registration socket in the kubelet's
 * `plugins_registry` folder serving the kubelet's pluginregistration v1 API, so no
 * node-driver-registrar sidecar is needed.
 */
import { readFileSync } from "node:fs";
import { chmod, lstat, mkdir, rmdir, unlink } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import type { Logger } from "../../common/log.js";
import { shortHash } from "../../core/contract.js";
import { manifestDigestOf } from "../replication/server.js";
import type { CacheStore } from "../store.js";
import { bindReadOnly, mountAt, remountReadOnly, sameInode, unmountAll } from "./mounts.js";
import {
  CsiError,
  decidePublish,
  publishRequest,
  unpublishRequest,
  type PublishRequest,
  type TargetMount,
} from "./request.js";

export const STORE_DRIVER_NAME = "store.warmstart.dev";
/** The CSI versions the kubelet may speak to it. */
export const SUPPORTED_VERSIONS = ["1.0.0"];
/** The vendored csi.proto and pluginregistration.proto (README.md there says where they come from). */
export const PROTO_DIR = fileURLToPath(new URL("../../../../src/node-agent/csi/proto/", import.meta.url));
/** A unix socket path holds at most 107 bytes (sun_path). */
const MAX_SOCKET_PATH = 107;

export interface StoreDriverOptions {
  /** The CSI endpoint: a unix socket path (its folder is created). */
  socket: string;
  /** The endpoint as the kubelet sees it, for registration (default: `socket`). */
  endpoint?: string;
  /** The kubelet's plugin registration folder (`<kubelet root>/plugins_registry`); none: no registration. */
  registrationDir?: string;
  /** NodeGetInfo's node id: the node's name. */
  nodeId: string;
  /** The node's store: committed trees at `<store>/<short>`. */
  store: CacheStore;
  /**
   * Makes the node hold the committed tree of a full hash (replication from peers) and returns its
   * folder; `signal` aborts when the driver stops. Absent: a node without the tree answers
   * FAILED_PRECONDITION.
   */
  ensureTree?: (hash: string, signal: AbortSignal) => Promise<string>;
  /**
   * The manifest digest the cache's record names (undefined: none known yet): a tree the store
   * already holds is mounted only when its manifest hashes to it; another tree is tampering,
   * reported through `tampered` and never mounted.
   */
  expectedDigest?: (hash: string) => string | undefined;
  tampered?: (hash: string, message: string) => void;
  log: Logger;
  /** Where csi.proto and pluginregistration.proto are (default: the vendored ones). */
  protoDir?: string;
}

type Req = Record<string, unknown>;
type Handler = (req: Req) => Promise<unknown>;
type Services = Record<string, { service: grpc.ServiceDefinition }>;

export class StoreDriver {
  private readonly servers: grpc.Server[] = [];
  private readonly fetching = new Map<string, Promise<string>>();
  private readonly busy = new Map<string, Promise<unknown>>();
  private readonly version: string;
  private readonly stopping = new AbortController();

  constructor(private readonly o: StoreDriverOptions) {
    this.version = packageVersion();
  }

  /** Serves the CSI endpoint, then registers with the kubelet (when a registration folder is set). */
  async start(): Promise<{ socket: string; registration?: string }> {
    const protoDir = this.o.protoDir ?? PROTO_DIR;
    const csi = (load(join(protoDir, "csi.proto")) as { csi: { v1: Services } }).csi.v1;
    const server = new grpc.Server();
    server.addService(csi.Identity!.service, this.wrap(this.identity()));
    server.addService(csi.Node!.service, this.wrap(this.node()));
    await this.bind(server, this.o.socket);
    const served = { driver: STORE_DRIVER_NAME, socket: this.o.socket, node: this.o.nodeId };
    if (!this.o.registrationDir) {
      this.o.log.info(served, "serving the CSI driver (not registered with a kubelet)");
      return { socket: this.o.socket };
    }

    const reg = (load(join(protoDir, "pluginregistration.proto")) as { pluginregistration: Services })
      .pluginregistration;
    const registration = new grpc.Server();
    registration.addService(reg.Registration!.service, this.wrap(this.registration()));
    const regSocket = join(this.o.registrationDir, `${STORE_DRIVER_NAME}-reg.sock`);
    await this.bind(registration, regSocket);
    this.o.log.info(
      { ...served, registration: regSocket },
      "serving the CSI driver; the kubelet registers it",
    );
    return { socket: this.o.socket, registration: regSocket };
  }

  /**
   * Stops serving: calls in progress get `graceMs` to end, then every connection is cut (the
   * kubelet keeps its connection open, so a graceful shutdown alone would never end).
   */
  async stop(graceMs = 2000): Promise<void> {
    // A fetch in progress stops and removes what it staged.
    this.stopping.abort();
    const servers = this.servers.splice(0);
    await Promise.all(
      servers.map(
        (s) =>
          new Promise<void>((done) => {
            const force = setTimeout(() => {
              s.forceShutdown();
              done();
            }, graceMs);
            s.tryShutdown(() => {
              clearTimeout(force);
              done();
            });
          }),
      ),
    );
  }

  private async bind(server: grpc.Server, socket: string): Promise<void> {
    if (Buffer.byteLength(socket) > MAX_SOCKET_PATH)
      throw new Error(`socket path ${socket} is longer than ${MAX_SOCKET_PATH} bytes`);
    await mkdir(dirname(socket), { recursive: true, mode: 0o750 });
    await unlink(socket).catch(() => undefined);
    await new Promise<void>((res, rej) =>
      server.bindAsync(`unix://${socket}`, grpc.ServerCredentials.createInsecure(), (err) =>
        err ? rej(err) : res(),
      ),
    );
    // Only the kubelet (root) talks to it.
    await chmod(socket, 0o600);
    this.servers.push(server);
  }

  /** Handlers as promises; a CsiError keeps its code, anything else is INTERNAL. */
  private wrap(handlers: Record<string, Handler>): grpc.UntypedServiceImplementation {
    const impl: grpc.UntypedServiceImplementation = {};
    for (const [method, fn] of Object.entries(handlers)) {
      impl[method] = (call: grpc.ServerUnaryCall<Req, unknown>, cb: grpc.sendUnaryData<unknown>) => {
        // A check that throws before the handler's first await is a refusal too, not UNKNOWN.
        Promise.resolve(call.request)
          .then(fn)
          .then(
            (res) => cb(null, res),
            (err: unknown) => {
              const e =
                err instanceof CsiError ? err : new CsiError(grpc.status.INTERNAL, (err as Error).message);
              this.o.log.warn({ method, code: grpc.status[e.code], reason: e.message }, "CSI call refused");
              cb({ code: e.code, details: e.message });
            },
          );
      };
    }
    return impl;
  }

  private identity(): Record<string, Handler> {
    return {
      GetPluginInfo: () => Promise.resolve({ name: STORE_DRIVER_NAME, vendor_version: this.version }),
      // No CONTROLLER_SERVICE (static volumes) and no VOLUME_ACCESSIBILITY_CONSTRAINTS (no topology).
      GetPluginCapabilities: () => Promise.resolve({ capabilities: [] }),
      Probe: () => Promise.resolve({ ready: { value: true } }),
    };
  }

  private node(): Record<string, Handler> {
    return {
      // No staging, no stats, no expansion: publish and unpublish are all there is.
      NodeGetCapabilities: () => Promise.resolve({ capabilities: [] }),
      // No accessible_topology: a volume of this driver may be published on any node.
      NodeGetInfo: () => Promise.resolve({ node_id: this.o.nodeId, max_volumes_per_node: 0 }),
      NodePublishVolume: (r) => this.publish(publishRequest(r)),
      NodeUnpublishVolume: (r) => this.unpublish(unpublishRequest(r).target),
    };
  }

  private registration(): Record<string, Handler> {
    return {
      GetInfo: () =>
        Promise.resolve({
          type: "CSIPlugin",
          name: STORE_DRIVER_NAME,
          endpoint: this.o.endpoint ?? this.o.socket,
          supported_versions: SUPPORTED_VERSIONS,
        }),
      NotifyRegistrationStatus: (r) => {
        if (r.plugin_registered)
          this.o.log.info({ driver: STORE_DRIVER_NAME }, "registered with the kubelet");
        else this.o.log.error({ error: r.error }, "the kubelet refused the driver's registration");
        return Promise.resolve({});
      },
    };
  }

  /** One call at a time per target path (the kubelet retries; two publishes never race). */
  private async serial<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const before = this.busy.get(key) ?? Promise.resolve();
    const run = before.catch(() => undefined).then(fn);
    this.busy.set(key, run);
    try {
      return await run;
    } finally {
      if (this.busy.get(key) === run) this.busy.delete(key);
    }
  }

  private publish(req: PublishRequest): Promise<unknown> {
    return this.serial(req.target, async () => {
      const tree = this.o.store.treeDir(req.hash);
      const short = shortHash(req.hash);
      await mkdir(req.target, { recursive: true, mode: 0o750 });
      const mount = await this.targetMount(req.target, tree);
      const action = decidePublish({ committed: await this.committed(req.hash), mount });
      switch (action) {
        case "done":
          return {};
        case "remount-read-only":
          await remountReadOnly(req.target);
          this.o.log.warn(
            { hash: short, target: req.target },
            "a writable bind of the tree was made read-only",
          );
          return {};
        case "conflict":
          throw new CsiError(
            grpc.status.ALREADY_EXISTS,
            `${req.target} has another mount (${mount.kind === "other" ? mount.source : "?"}), not cache ${short}`,
          );
        case "fetch-then-mount":
          await this.fetch(req.hash, tree);
          break;
        case "mount":
          this.checkDigest(req.hash, tree);
          break;
      }
      await bindReadOnly(tree, req.target);
      this.o.log.info(
        { hash: short, target: req.target, asked: req.asked, fetched: action === "fetch-then-mount" },
        "published the cache's tree read-only",
      );
      return {};
    });
  }

  private unpublish(target: string): Promise<unknown> {
    return this.serial(target, async () => {
      const unmounted = await unmountAll(target);
      // rmdir, never a recursive removal: what is not a mount point any more must be empty.
      await rmdir(target).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== "ENOENT") throw err;
      });
      if (unmounted) this.o.log.info({ target }, "unpublished");
      return {};
    });
  }

  private async targetMount(target: string, tree: string): Promise<TargetMount> {
    const m = await mountAt(target);
    if (!m) return { kind: "none" };
    if (await sameInode(target, tree)) return { kind: "tree", readOnly: m.options.includes("ro") };
    return { kind: "other", source: `${m.source}:${m.root}` };
  }

  /** Whether the store holds the committed tree of this hash: a real folder, ready, its manifest naming it. */
  private async committed(hash: string): Promise<boolean> {
    const st = await lstat(this.o.store.treeDir(hash)).catch(() => undefined);
    if (!st?.isDirectory()) return false;
    try {
      return (await this.o.store.committed(hash)) !== undefined;
    } catch (err) {
      throw new CsiError(grpc.status.FAILED_PRECONDITION, (err as Error).message);
    }
  }

  /** Refuses a stored tree whose manifest is not the one the record names (a replica checks it as it fills). */
  private checkDigest(hash: string, tree: string): void {
    const expected = this.o.expectedDigest?.(hash);
    if (!expected || manifestDigestOf(tree) === expected) return;
    const message = `the stored tree of cache ${shortHash(hash)} is not the record's (its manifest does not hash to the record's digest): not mounted`;
    this.o.tampered?.(hash, message);
    throw new CsiError(grpc.status.FAILED_PRECONDITION, message);
  }

  /** The tree from peers; one fetch per hash however many publishes wait for it. */
  private async fetch(hash: string, tree: string): Promise<void> {
    const short = shortHash(hash);
    const ensure = this.o.ensureTree;
    if (!ensure)
      throw new CsiError(
        grpc.status.FAILED_PRECONDITION,
        `this node does not hold the committed tree of cache ${short}, and this driver cannot fetch it from peers`,
      );
    let pending = this.fetching.get(hash);
    if (!pending) {
      this.o.log.info({ hash: short }, "this node lacks the tree: fetching it from peers");
      pending = ensure(hash, this.stopping.signal).finally(() => this.fetching.delete(hash));
      this.fetching.set(hash, pending);
    }
    const dir = await pending.catch((err: unknown) => {
      if (err instanceof CsiError) throw err;
      throw new CsiError(grpc.status.UNAVAILABLE, `cache ${short}: ${(err as Error).message}`);
    });
    if (resolve(dir) !== resolve(tree) || !(await this.committed(hash)))
      throw new CsiError(
        grpc.status.UNAVAILABLE,
        `cache ${short}: no committed tree at ${tree} after fetching it`,
      );
  }
}

function load(file: string): unknown {
  return grpc.loadPackageDefinition(
    protoLoader.loadSync(file, {
      keepCase: true,
      longs: Number,
      enums: String,
      defaults: true,
      oneofs: true,
    }),
  );
}

function packageVersion(): string {
  try {
    const pkg = JSON.parse(readFileSync(new URL("../../../../package.json", import.meta.url), "utf8")) as {
      version?: string;
    };
    return pkg.version ?? "unknown";
  } catch {
    return "unknown";
  }
}
