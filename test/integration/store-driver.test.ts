/**
 * `store.warmstart.dev`, the node-store CSI driver (ADR 0011), started in this process on a temp
 * socket over a temp store holding one committed tree: csi-sanity passes against its identity and
 * node services, a publish asked read-write is still read-only (a write as root fails with
 * EROFS), a handle whose tree is only being made (staging) is refused, a node without the tree
 * fills its store from a peer (the replication receiver) before it mounts, and the kubelet's
 * registration API answers. Needs root (mounts) and csi-sanity from the local cluster's CSI build
 * (`tools/localcluster/build-csi.sh`, run by `cluster up`), not a running cluster.
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { mkdir, mkdtemp, readFile, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import { createCA, issueCert } from "../../src/common/certs.js";
import { createLogger } from "../../src/common/log.js";
import { READY_MARKER, shortHash } from "../../src/core/contract.js";
import { capture } from "../../src/datapath/capture.js";
import { PROTO_DIR, STORE_DRIVER_NAME, StoreDriver } from "../../src/node-agent/csi/driver.js";
import { mountAt, parseMountInfo, unmountAll } from "../../src/node-agent/csi/mounts.js";
import { replicateTree } from "../../src/node-agent/replication/receiver.js";
import { manifestDigestOf, PeerServer } from "../../src/node-agent/replication/server.js";
import { CacheStore } from "../../src/node-agent/store.js";
import { csiDir } from "../../tools/localcluster/csi/stack.js";
import { runCsiSanity } from "../csi-sanity.js";

const HASH = "5e".repeat(32);
/** Only a staging folder (and an unfinished tree without its ready marker) of this one. */
const STAGED = "7a".repeat(32);
/** Held by a peer only. */
const REMOTE = "c4".repeat(32);
const log = createLogger("store-driver-test", { level: "warn" });

type Unary = (req: object, cb: (err: grpc.ServiceError | null, res: unknown) => void) => void;
type Client = grpc.Client & Record<string, Unary>;

const protos = (file: string): grpc.GrpcObject =>
  grpc.loadPackageDefinition(
    protoLoader.loadSync(join(PROTO_DIR, file), {
      keepCase: true,
      longs: Number,
      enums: String,
      defaults: true,
      oneofs: true,
    }),
  );
const csiProto = (): Record<string, grpc.ServiceClientConstructor & { service: grpc.ServiceDefinition }> =>
  (protos("csi.proto") as unknown as { csi: { v1: never } }).csi.v1;

function client(service: string, socket: string, file = "csi.proto"): Client {
  const pkg =
    file === "csi.proto"
      ? csiProto()
      : (protos(file) as unknown as { pluginregistration: never }).pluginregistration;
  const Ctor = (pkg as Record<string, grpc.ServiceClientConstructor>)[service]!;
  return new Ctor(`unix://${socket}`, grpc.credentials.createInsecure()) as unknown as Client;
}

const call = <T = Record<string, unknown>>(c: Client, method: string, req: object): Promise<T> =>
  new Promise((resolve, reject) =>
    c[method]!.call(c, req, (err, res) => (err ? reject(err) : resolve(res as T))),
  );

async function treeSource(dir: string, text: string): Promise<string> {
  const src = join(dir, `src-${text}`);
  await mkdir(join(src, "model"), { recursive: true });
  await mkdir(join(src, "cache"), { recursive: true });
  await writeFile(join(src, "model", "weights.bin"), `weights of ${text}\n`);
  await writeFile(join(src, "cache", "kernel.so"), "compiled\n");
  return src;
}

/** A store with the committed tree of HASH (captured and sealed as the agent does). */
async function storeWithTree(dir: string, hash = HASH): Promise<CacheStore> {
  const store = new CacheStore(join(dir, "store"));
  await store.init();
  await capture({
    src: await treeSource(dir, hash),
    dest: store.treeDir(hash),
    hash,
    progress: false,
    durable: false,
  });
  await store.seal(hash);
  return store;
}

function canRun(t: TestContext): string | undefined {
  if (process.getuid?.() !== 0) {
    t.skip("publishing mounts: needs root");
    return undefined;
  }
  const sanity = join(csiDir(), "csi-sanity");
  if (!existsSync(sanity)) {
    t.skip(`no ${sanity}: built by tools/localcluster/build-csi.sh (cluster up)`);
    return undefined;
  }
  return sanity;
}

const stacks = new WeakMap<TestContext, (() => unknown)[]>();

/** Runs `fn` when the test ends, the last deferred first (mounts, then the driver, then its folder). */
function defer(t: TestContext, fn: () => unknown): void {
  let stack = stacks.get(t);
  if (!stack) {
    const fns: (() => unknown)[] = (stack = []);
    stacks.set(t, fns);
    t.after(async () => {
      for (const f of fns.reverse())
        await Promise.resolve()
          .then(f)
          .catch(() => undefined);
    });
  }
  stack.push(fn);
}

/** A temp folder, removed at the end, anything still mounted below it unmounted first. */
async function tempDir(t: TestContext, prefix: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  defer(t, async () => {
    const below = parseMountInfo(await readFile("/proc/self/mountinfo", "utf8"))
      .map((m) => m.point)
      .filter((p) => p.startsWith(`${dir}/`))
      .reverse();
    for (const p of below) await unmountAll(p);
    await rm(dir, { recursive: true, force: true });
  });
  return dir;
}

async function started(t: TestContext, o: Partial<ConstructorParameters<typeof StoreDriver>[0]> = {}) {
  const dir = await tempDir(t, "store-driver-");
  const store = o.store ?? (await storeWithTree(dir));
  const socket = join(dir, "plugins", STORE_DRIVER_NAME, "csi.sock");
  const driver = new StoreDriver({ socket, nodeId: "node-under-test", store, log, ...o });
  const served = await driver.start();
  defer(t, () => driver.stop(200));
  const node = client("Node", socket);
  defer(t, () => node.close());
  return { dir, store, socket, driver, served, node };
}

const mountCap = (mode: string, flags: string[] = []): object => ({
  mount: { fs_type: "", mount_flags: flags },
  access_mode: { mode },
});

test("csi-sanity passes against the driver's identity and node services", async (t) => {
  const sanity = canRun(t);
  if (!sanity) return;
  const { dir, socket } = await started(t);
  // Promote's part, played here: a static volume whose handle is the committed tree's hash. The
  // driver itself has no controller service; csi-sanity needs one to name a volume to publish.
  const controller = new grpc.Server();
  controller.addService(csiProto().Controller!.service, {
    ControllerGetCapabilities: (_c: unknown, cb: grpc.sendUnaryData<unknown>) =>
      cb(null, { capabilities: [{ rpc: { type: "CREATE_DELETE_VOLUME" } }] }),
    CreateVolume: (_c: unknown, cb: grpc.sendUnaryData<unknown>) =>
      cb(null, { volume: { volume_id: HASH, capacity_bytes: 0 } }),
    DeleteVolume: (_c: unknown, cb: grpc.sendUnaryData<unknown>) => cb(null, {}),
  });
  // csi-sanity asks every endpoint it is given who it is.
  controller.addService(csiProto().Identity!.service, {
    GetPluginInfo: (_c: unknown, cb: grpc.sendUnaryData<unknown>) =>
      cb(null, { name: "static-volumes.test.warmstart.dev", vendor_version: "0" }),
    GetPluginCapabilities: (_c: unknown, cb: grpc.sendUnaryData<unknown>) =>
      cb(null, { capabilities: [{ service: { type: "CONTROLLER_SERVICE" } }] }),
    Probe: (_c: unknown, cb: grpc.sendUnaryData<unknown>) => cb(null, { ready: { value: true } }),
  });
  const controllerSocket = join(dir, "controller.sock");
  await new Promise<void>((res, rej) =>
    controller.bindAsync(`unix://${controllerSocket}`, grpc.ServerCredentials.createInsecure(), (e) =>
      e ? rej(e) : res(),
    ),
  );
  defer(t, () => controller.forceShutdown());

  await runCsiSanity(t, {
    sanity,
    endpoint: socket,
    controllerEndpoint: controllerSocket,
    dir,
    // The controller suites test a controller service, which this driver does not have.
    skip: "Controller Server|GroupController",
    // Identity (3) and node (NodeGetCapabilities, NodeGetInfo, 3 NodePublishVolume, 3
    // NodeUnpublishVolume, the last one a publish of the tree and its removal): the rest needs a
    // controller service, staging, stats or expansion, which this driver does not have.
    minPassed: 11,
  });
  assert.ok(!(await mountAt(join(dir, "mnt", "target"))), "nothing left mounted");
});

test("a publish asked read-write is read-only, nosuid and nodev; publish and unpublish are idempotent", async (t) => {
  if (!canRun(t)) return;
  const { dir, store, node } = await started(t);
  const target = join(dir, "pods", "uid-1", "volumes", "kubernetes.io~csi", "pv", "mount");
  const req = {
    volume_id: HASH,
    target_path: target,
    readonly: false,
    volume_capability: mountCap("SINGLE_NODE_WRITER", ["rw"]),
  };
  await call(node, "NodePublishVolume", req);
  defer(t, () => call(node, "NodeUnpublishVolume", { volume_id: HASH, target_path: target }));
  const m = await mountAt(target);
  assert.ok(m, "mounted");
  for (const flag of ["ro", "nosuid", "nodev"])
    assert.ok(m.options.includes(flag), `${flag} in ${m.options.join(",")}`);
  // Exactly the tree: its ready marker at the root, not the store's folders.
  assert.ok(existsSync(join(target, READY_MARKER)));
  assert.deepEqual((await readdir(target)).sort(), (await readdir(store.treeDir(HASH))).sort());
  assert.equal(await readFile(join(target, "model", "weights.bin"), "utf8"), `weights of ${HASH}\n`);
  // Root bypasses the tree's missing write bits; only the read-only mount stops it.
  await assert.rejects(writeFile(join(target, "model", "weights.bin"), "changed"), { code: "EROFS" });
  await assert.rejects(writeFile(join(target, "new-file"), "x"), { code: "EROFS" });
  await assert.rejects(mkdir(join(target, "new-dir")), { code: "EROFS" });

  await call(node, "NodePublishVolume", req); // a retry
  assert.equal(
    (await readFile("/proc/self/mountinfo", "utf8")).split(`${target} `).length - 1,
    1,
    "mounted once",
  );

  await call(node, "NodeUnpublishVolume", { volume_id: HASH, target_path: target });
  assert.ok(!existsSync(target), "the target is removed");
  await call(node, "NodeUnpublishVolume", { volume_id: HASH, target_path: target }); // a retry
  assert.equal(
    await readFile(join(store.treeDir(HASH), "model", "weights.bin"), "utf8"),
    `weights of ${HASH}\n`,
  );
});

test("a tree that is not committed (only staging, or no ready marker) is refused, and nothing is mounted", async (t) => {
  if (!canRun(t)) return;
  const { dir, store, node } = await started(t);
  const staging = `${store.treeDir(STAGED)}.tmp-${process.pid}-0123456789ab`;
  await capture({
    src: await treeSource(dir, "staged"),
    dest: staging,
    hash: STAGED,
    progress: false,
    durable: false,
  });
  const target = join(dir, "pods", "uid-2", "mount");
  const publish = (volume_id: string): Promise<unknown> =>
    call(node, "NodePublishVolume", {
      volume_id,
      target_path: target,
      volume_capability: mountCap("MULTI_NODE_READER_ONLY"),
    });
  await assert.rejects(publish(STAGED), { code: grpc.status.FAILED_PRECONDITION });
  assert.ok(!(await mountAt(target)));
  // Its folder in place, but without the ready marker (a commit cut short): still refused.
  await mkdir(store.treeDir(STAGED));
  await writeFile(join(store.treeDir(STAGED), "half"), "x");
  await assert.rejects(publish(STAGED), { code: grpc.status.FAILED_PRECONDITION });
  assert.ok(!(await mountAt(target)));
  // Handles that are not a full hash never name a folder: the short hash, the staging folder's name.
  for (const h of [shortHash(HASH), `${shortHash(STAGED)}.tmp-${process.pid}-0123456789ab`, "..", ""])
    await assert.rejects(publish(h), { code: grpc.status.INVALID_ARGUMENT }, h);
  assert.ok(!(await mountAt(target)));
  await call(node, "NodeUnpublishVolume", { volume_id: HASH, target_path: target });
});

test("a stored tree whose manifest is not the record's is tampering: refused, reported, nothing mounted; the record's own tree mounts", async (t) => {
  if (!canRun(t)) return;
  const reported: string[] = [];
  const forged = await started(t, {
    expectedDigest: () => "0".repeat(64),
    tampered: (hash, message) => reported.push(`${shortHash(hash)}: ${message}`),
  });
  const publish = (node: Client, dir: string): Promise<unknown> =>
    call(node, "NodePublishVolume", {
      volume_id: HASH,
      target_path: join(dir, "pods", "uid-t", "mount"),
      volume_capability: mountCap("MULTI_NODE_READER_ONLY"),
    });
  await assert.rejects(publish(forged.node, forged.dir), { code: grpc.status.FAILED_PRECONDITION });
  assert.ok(!(await mountAt(join(forged.dir, "pods", "uid-t", "mount"))), "nothing mounted");
  assert.equal(reported.length, 1);
  assert.match(reported[0]!, /not the record's/);
  // The digest the record names is the stored tree's own: published.
  const honest = await started(t, {
    expectedDigest: (hash) => manifestDigestOf(honestStore.treeDir(hash)),
  });
  const honestStore = honest.store;
  await publish(honest.node, honest.dir);
  assert.ok(await mountAt(join(honest.dir, "pods", "uid-t", "mount")), "the record's tree is mounted");
  await call(honest.node, "NodeUnpublishVolume", {
    volume_id: HASH,
    target_path: join(honest.dir, "pods", "uid-t", "mount"),
  });
});

test("a node without the tree fills its store from a peer, once for concurrent publishes, then mounts it", async (t) => {
  if (!canRun(t)) return;
  const dir = await tempDir(t, "store-driver-peer-");
  const peerStore = await storeWithTree(join(dir, "peer"), REMOTE);
  const ca = await createCA("warmstart node agents");
  const pem = await issueCert(ca, { commonName: "node-0", usage: "both", ips: ["127.0.0.1"] });
  const tls = { ca: ca.cert, ...pem };
  const server = new PeerServer({ storeDir: peerStore.dir, tls });
  const port = await server.listen(0, "127.0.0.1");
  defer(t, () => server.close());

  const local = new CacheStore(join(dir, "local"));
  await local.init();
  let fetches = 0;
  const { node } = await started(t, {
    store: local,
    ensureTree: async (hash) => {
      fetches++;
      const r = await replicateTree({
        hash,
        expectedManifestDigest: manifestDigestOf(peerStore.treeDir(hash)),
        sources: [{ node: "node-0", url: `https://127.0.0.1:${port}` }],
        storeDir: local.dir,
        tls,
        durable: false,
      });
      return r.dest;
    },
  });
  const targets = [1, 2].map((i) => join(dir, "pods", `uid-${i}`, "mount"));
  await Promise.all(
    targets.map((target_path) =>
      call(node, "NodePublishVolume", {
        volume_id: REMOTE,
        target_path,
        volume_capability: mountCap("MULTI_NODE_READER_ONLY"),
      }),
    ),
  );
  defer(t, () =>
    Promise.all(targets.map((p) => call(node, "NodeUnpublishVolume", { volume_id: REMOTE, target_path: p }))),
  );
  assert.equal(fetches, 1, "one replication for both publishes");
  for (const target of targets) {
    assert.ok((await mountAt(target))?.options.includes("ro"));
    assert.equal(await readFile(join(target, "model", "weights.bin"), "utf8"), `weights of ${REMOTE}\n`);
  }
  assert.ok(
    (await stat(join(local.treeDir(REMOTE), READY_MARKER))).isFile(),
    "committed in this node's store",
  );

  // Without a way to fetch, a node lacking the tree says so.
  const bare = new CacheStore(join(dir, "bare"));
  const { node: plain } = await started(t, { store: bare });
  await assert.rejects(
    call(plain, "NodePublishVolume", {
      volume_id: REMOTE,
      target_path: join(dir, "pods", "uid-3", "mount"),
      volume_capability: mountCap("MULTI_NODE_READER_ONLY"),
    }),
    { code: grpc.status.FAILED_PRECONDITION },
  );
});

test("the driver registers with the kubelet's plugin watcher and reports itself", async (t) => {
  if (!canRun(t)) return;
  const reg = await tempDir(t, "plugins_registry-");
  const { socket, served } = await started(t, { registrationDir: reg });
  assert.equal(served.registration, join(reg, `${STORE_DRIVER_NAME}-reg.sock`));
  const registration = client("Registration", served.registration, "pluginregistration.proto");
  defer(t, () => registration.close());
  assert.deepEqual(await call(registration, "GetInfo", {}), {
    type: "CSIPlugin",
    name: STORE_DRIVER_NAME,
    endpoint: socket,
    supported_versions: ["1.0.0"],
  });
  await call(registration, "NotifyRegistrationStatus", { plugin_registered: true, error: "" });

  const identity = client("Identity", socket);
  defer(t, () => identity.close());
  const pkg = JSON.parse(await readFile(new URL("../../../package.json", import.meta.url), "utf8")) as {
    version: string;
  };
  assert.deepEqual(await call(identity, "GetPluginInfo", {}), {
    name: STORE_DRIVER_NAME,
    vendor_version: pkg.version,
    manifest: {},
  });
  assert.deepEqual(await call(identity, "GetPluginCapabilities", {}), { capabilities: [] });
  const node = client("Node", socket);
  defer(t, () => node.close());
  const info = await call<{ node_id: string; accessible_topology: unknown }>(node, "NodeGetInfo", {});
  assert.equal(info.node_id, "node-under-test");
  assert.equal(info.accessible_topology, null, "no topology: the PVs have no node affinity");
  assert.deepEqual(await call(node, "NodeGetCapabilities", {}), { capabilities: [] });
  // Only the kubelet (root) may talk to it.
  assert.equal((await stat(socket)).mode & 0o777, 0o600);
});
