import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import {
  chmodSync,
  closeSync,
  existsSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  statSync,
  writeFileSync,
  writeSync,
} from "node:fs";
import { readdir, readFile, readlink, rename, rm, symlink } from "node:fs/promises";
import { once } from "node:events";
import https from "node:https";
import tls from "node:tls";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { Registry } from "prom-client";
import { createCA, issueCert, type Issuer, type Pem } from "../../common/certs.js";
import { MANIFEST_FILE, READY_MARKER, shortHash } from "../../core/contract.js";
import { capture } from "../../datapath/capture.js";
import { setTimesNs } from "../../datapath/native.js";
import {
  BLOB_BIG,
  KERNEL,
  LINK_A,
  LINK_B,
  makeCacheTree,
  SNAP_CONFIG,
  SNAP_WEIGHTS,
  stampTimes,
  statOnly,
  tempDir,
  TOP,
  type Snap,
} from "../../../test/support/datapath.js";
import { createReplicationMetrics, type ReplicationMetrics } from "../metrics.js";
import { CacheStore } from "../store.js";
import { parseManifest } from "../../datapath/manifest.js";
import { HaveBits, parseHave } from "./have.js";
import { ACTIVE_STREAMS_HEADER, metaLimit, paths, planTree, TreeMetaSchema } from "./plan.js";
import { replicateTree, ReplicationError, type ReplicateOptions } from "./receiver.js";
import { manifestDigestOf, PeerServer, type FillingTree, type PeerServerOptions } from "./server.js";

const HASH = "5e".repeat(32);
const SHORT = shortHash(HASH);
const CHUNK = 64 * 1024;

interface Node {
  name: string;
  storeDir: string;
  tree: string;
  server: PeerServer;
  url: string;
}

interface Fixture {
  dir: string;
  ca: Issuer;
  client: Pem;
  nodes: Node[];
  files: Map<string, Buffer>;
  expected: Map<string, Snap>;
  digest: string;
  receiverStore: string;
  opts: (over?: Partial<ReplicateOptions>) => ReplicateOptions;
}

/**
 * A tree captured with the real capture into the stores of `n` nodes (one manifest, byte for
 * byte the same on each, as replicas hold it), sealed as the agent seals it, each store served
 * by a PeerServer on loopback with a certificate of one CA.
 */
async function fixture(t: TestContext, n = 3, server: Partial<PeerServerOptions> = {}): Promise<Fixture> {
  const dir = tempDir(t, "ws-replication-");
  const src = join(dir, "src");
  const { files, expected } = await makeCacheTree(src);
  const ca = await createCA("warmstart node agents");
  const client = await issueCert(ca, { commonName: "receiver", usage: "both", ips: ["127.0.0.1"] });
  const nodes: Node[] = [];
  let manifest: Buffer | undefined;
  for (let k = 0; k < n; k++) {
    const storeDir = join(dir, `node-${k}`);
    const tree = join(storeDir, SHORT);
    // Listing a folder moves its atime: the source gets its stamped times back for each capture.
    if (k > 0) await stampTimes(src);
    await capture({ src, dest: tree, hash: HASH, model: "org/m", progress: false, durable: false });
    if (manifest) {
      // A replica holds the leader's manifest, not one of its own.
      chmodSync(tree, 0o755);
      chmodSync(join(tree, MANIFEST_FILE), 0o644);
      writeFileSync(join(tree, MANIFEST_FILE), manifest);
      chmodSync(join(tree, MANIFEST_FILE), 0o444);
    } else {
      manifest = readFileSync(join(tree, MANIFEST_FILE));
    }
    await new CacheStore(storeDir).seal(HASH);
    // Sealing lists every folder, which moves its atime: the captured times go back.
    for (const [rel, st] of expected)
      await setTimesNs(rel === "" ? tree : join(tree, rel), st.atimeNs, st.mtimeNs, st.kind === "symlink");
    const pem = await issueCert(ca, { commonName: `node-${k}`, usage: "both", ips: ["127.0.0.1"] });
    const s = new PeerServer({ storeDir, tls: { ca: ca.cert, ...pem }, ...server });
    const port = await s.listen(0, "127.0.0.1");
    t.after(() => s.close());
    nodes.push({ name: `node-${k}`, storeDir, tree, server: s, url: `https://127.0.0.1:${port}` });
  }
  const digest = manifestDigestOf((nodes[0] as Node).tree);
  const receiverStore = join(dir, "receiver");
  const opts = (over: Partial<ReplicateOptions> = {}): ReplicateOptions => ({
    hash: HASH,
    expectedManifestDigest: digest,
    sources: nodes.map((x) => ({ node: x.name, url: x.url })),
    storeDir: receiverStore,
    tls: { ca: ca.cert, ...client },
    streams: 6,
    chunkBytes: CHUNK,
    stallMs: 5_000,
    durable: false,
    ...over,
  });
  return { dir, ca, client, nodes, files, expected, digest, receiverStore, opts };
}

/** The replicated tree is the captured one: content, kinds, modes (read-only), nanosecond
 * times, hard links, symlinks, and the leader's manifest bytes. */
async function assertSameTree(f: Fixture, dest: string): Promise<void> {
  const rels = [...f.expected.keys()];
  const got = await statOnly(dest, rels);
  for (const rel of rels) {
    const want = f.expected.get(rel) as Snap;
    const have = got.get(rel) as Snap;
    assert.equal(have.kind, want.kind, `${rel} kind`);
    assert.equal(have.mtimeNs, want.mtimeNs, `${rel} mtime`);
    assert.equal(have.atimeNs, want.atimeNs, `${rel} atime`);
    if (have.kind !== "symlink") assert.equal(have.mode, want.mode & ~0o222, `${rel} mode, read-only`);
  }
  assert.notEqual((got.get(BLOB_BIG) as Snap).mtimeNs % 1000n, 0n, "nanosecond digits kept");
  assert.equal(got.get(LINK_A)?.ino, got.get(LINK_B)?.ino, "a hard link stays a hard link");
  assert.equal(await readlink(join(dest, SNAP_WEIGHTS)), "../../blobs/aaaa");
  assert.equal(await readlink(join(dest, SNAP_CONFIG)), "../../blobs/bbbb");
  for (const [rel, body] of f.files)
    assert.ok((await readFile(join(dest, rel))).equals(body), `${rel} content`);
  assert.ok(existsSync(join(dest, READY_MARKER)), "ready marker");
  assert.equal(manifestDigestOf(dest), f.digest, "the leader's manifest, byte for byte");
  const names = (await readdir(dest)).sort();
  const want = [...new Set(rels.filter((r) => r !== "").map((r) => r.split("/")[0] as string))];
  assert.deepEqual(names, [...want, MANIFEST_FILE, READY_MARKER].sort(), "nothing more at the root");
}

/** Nothing of the tree in the store: no committed tree, no staging folder. */
async function assertNothingLeft(storeDir: string): Promise<void> {
  const names = await readdir(storeDir).catch(() => [] as string[]);
  assert.deepEqual(names, [], "the store holds nothing of the failed replication");
}

/** A GET to a peer server with the given client certificate (or none). */
function get(
  url: string,
  path: string,
  tls: { ca: string; cert?: string; key?: string },
  headers: Record<string, string> = {},
): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = https.request(new URL(path, url), {
      ...tls,
      headers,
      agent: false,
      checkServerIdentity: () => undefined,
    });
    req.on("error", reject);
    req.on("response", (res) => {
      const parts: Buffer[] = [];
      res.on("data", (b: Buffer) => parts.push(b));
      res.on("error", reject);
      res.on("end", () =>
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(parts) }),
      );
    });
    req.end();
  });
}

const tlsOf = (f: Fixture): { ca: string; cert: string; key: string } => ({ ca: f.ca.cert, ...f.client });

void test("a tree replicated from three sources is the captured tree, and every source served part of it", async (t) => {
  const f = await fixture(t);
  const registry = new Registry();
  const metrics = createReplicationMetrics(registry);
  const progress: number[] = [];
  const r = await replicateTree(f.opts({ metrics, onProgress: (p) => progress.push(p.doneBytes) }));

  assert.equal(r.present, false);
  assert.equal(r.dest, join(f.receiverStore, SHORT));
  await assertSameTree(f, r.dest);
  for (const n of f.nodes) assert.ok((r.bySource[n.name] ?? 0) > 0, `${n.name} served bytes`);
  assert.equal(r.receivedBytes, r.totalBytes, "every byte fetched once");
  assert.equal(r.dropped.length, 0);
  assert.ok(r.bytesPerSecond > 0 && r.durationMs > 0);
  assert.equal(progress.at(-1), r.totalBytes, "progress ends at the total");
  const text = await registry.metrics();
  assert.match(text, /warmstart_node_agent_replications_total\{result="replicated"\} 1/);
  assert.match(text, /warmstart_node_agent_replication_received_bytes_total\{source="node-2"\} [1-9]/);

  const again = await replicateTree(f.opts());
  assert.equal(again.present, true, "a committed tree is not fetched again");
  assert.equal(again.receivedBytes, 0);
  assert.equal(again.totalBytes, r.totalBytes);
});

void test("a source closed mid-transfer is dropped and the tree completes from the others", async (t) => {
  const f = await fixture(t);
  const first = f.nodes[0] as Node;
  let closed: Promise<void> | undefined;
  const r = await replicateTree(
    f.opts({
      streams: 3,
      onProgress: () => {
        closed ??= first.server.close();
      },
    }),
  );
  await closed;
  assert.deepEqual(
    r.dropped.map((d) => d.node),
    [first.name],
  );
  assert.ok(["error", "timeout"].includes(r.dropped[0]?.reason ?? ""), `reason ${r.dropped[0]?.reason}`);
  await assertSameTree(f, r.dest);
});

void test("a source that flips a byte is caught by the digest and dropped, and the tree is still right", async (t) => {
  const f = await fixture(t);
  const liar = f.nodes[1] as Node;
  // One wrong byte in every chunk of every file the liar holds: whatever it serves is wrong.
  for (const [rel, body] of f.files) {
    if (body.length === 0 || rel === LINK_B) continue;
    const path = join(liar.tree, rel);
    const bad = Buffer.from(body);
    for (let off = 0; off < bad.length; off += CHUNK) bad[off] = (bad[off] as number) ^ 0x40;
    chmodSync(path, 0o644);
    writeFileSync(path, bad);
  }
  const registry = new Registry();
  const metrics = createReplicationMetrics(registry);
  const reported: string[] = [];
  const r = await replicateTree(f.opts({ metrics, onTampered: ({ source }) => reported.push(source) }));
  assert.deepEqual(r.dropped, [{ node: liar.name, reason: "corrupt" }]);
  await assertSameTree(f, r.dest);
  assert.match(await registry.metrics(), /sources_dropped_total\{reason="corrupt"\} 1/);
  assert.deepEqual(reported, [liar.name], "wrong bytes are tampering too");
});

void test("a source serving another tree than the record's is tampering: dropped, counted and reported, and the record's tree is committed", async (t) => {
  const f = await fixture(t);
  const forger = f.nodes[0] as Node;
  // The forger's copy: another tree (here a manifest with one more byte), asked first (ties go to it).
  const forged = join(forger.tree, MANIFEST_FILE);
  chmodSync(forger.tree, 0o755);
  chmodSync(forged, 0o644);
  writeFileSync(forged, Buffer.concat([readFileSync(forged), Buffer.from(" ")]));
  const registry = new Registry();
  const metrics = createReplicationMetrics(registry);
  const reported: Array<{ source: string; reason: string }> = [];
  const r = await replicateTree(
    f.opts({ metrics, onTampered: ({ source, reason }) => reported.push({ source, reason }) }),
  );
  await assertSameTree(f, r.dest);
  assert.deepEqual(reported, [{ source: forger.name, reason: "manifest" }]);
  assert.deepEqual(r.dropped, [{ node: forger.name, reason: "manifest" }]);
  assert.match(await registry.metrics(), /replication_tampered_total\{reason="manifest"\} 1/);
});

void test("a tree's metadata is read up to a limit its manifest sets, not half a gigabyte", async (t) => {
  const f = await fixture(t, 1);
  const node = f.nodes[0] as Node;
  const manifest = parseManifest(readFileSync(join(node.tree, MANIFEST_FILE), "utf8"), "manifest");
  const meta = await get(node.url, paths.meta(SHORT), tlsOf(f));
  assert.equal(meta.status, 200);
  const limit = metaLimit(manifest);
  assert.ok(meta.body.length <= limit, `the honest metadata (${meta.body.length} B) fits in ${limit} B`);
  assert.ok(limit < 4 * 1024 * 1024, `a small tree's limit is small: ${limit} B`);
});

void test("a manifest that does not hash to the record's digest fails the replication and commits nothing", async (t) => {
  const f = await fixture(t);
  const registry = new Registry();
  const metrics = createReplicationMetrics(registry);
  await assert.rejects(
    replicateTree(f.opts({ expectedManifestDigest: "0".repeat(64), metrics })),
    (err: unknown) => {
      assert.ok(err instanceof ReplicationError);
      assert.match(err.message, /no source left/);
      assert.deepEqual(
        err.dropped.map((d) => d.reason),
        ["manifest", "manifest", "manifest"],
      );
      return true;
    },
  );
  await assertNothingLeft(f.receiverStore);
  assert.match(await registry.metrics(), /replications_total\{result="failed"\} 1/);
});

void test("a peer without a client certificate of the node agents' CA is refused", async (t) => {
  const f = await fixture(t, 1);
  const url = (f.nodes[0] as Node).url;
  const ok = await get(url, paths.manifest(SHORT), tlsOf(f));
  assert.equal(ok.status, 200, "the CA's client is served");
  assert.equal(manifestDigestOf((f.nodes[0] as Node).tree), createHashHex(ok.body));

  await assert.rejects(get(url, paths.manifest(SHORT), { ca: f.ca.cert }), "no client certificate");
  const other = await createCA("someone else");
  const foreign = await issueCert(other, { commonName: "node-x", usage: "both" });
  await assert.rejects(get(url, paths.manifest(SHORT), { ca: f.ca.cert, ...foreign }), "foreign certificate");
  await assert.rejects(replicateTree(f.opts({ tls: { ca: f.ca.cert, ...foreign } })), ReplicationError);
  await assertNothingLeft(f.receiverStore);
});

void test("the authorize hook refuses a tree outside the peer's scope", async (t) => {
  const seen: string[] = [];
  const f = await fixture(t, 1, {
    authorize: (short, peer) => {
      seen.push(`${short}:${peer.commonName}`);
      return peer.commonName !== "receiver";
    },
  });
  const res = await get((f.nodes[0] as Node).url, paths.manifest(SHORT), tlsOf(f));
  assert.equal(res.status, 403);
  assert.deepEqual(seen, [`${SHORT}:receiver`]);
  await assert.rejects(replicateTree(f.opts()), ReplicationError);
});

void test("the server serves only the manifest's regular files, below the tree, with correct ranges", async (t) => {
  const f = await fixture(t, 1);
  const node = f.nodes[0] as Node;
  const tls = tlsOf(f);
  const file = (rel: string): string => paths.file(SHORT, rel);
  const big = f.files.get(BLOB_BIG) as Buffer;

  const full = await get(node.url, file(KERNEL), tls);
  assert.equal(full.status, 200);
  assert.ok(full.body.equals(f.files.get(KERNEL) as Buffer));
  assert.equal(full.headers[ACTIVE_STREAMS_HEADER], "0");
  const part = await get(node.url, file(BLOB_BIG), tls, { range: "bytes=100-199" });
  assert.equal(part.status, 206);
  assert.equal(part.headers["content-range"], `bytes 100-199/${big.length}`);
  assert.ok(part.body.equals(big.subarray(100, 200)));
  const tail = await get(node.url, file(BLOB_BIG), tls, { range: "bytes=-10" });
  assert.equal(tail.status, 206);
  assert.ok(tail.body.equals(big.subarray(big.length - 10)));
  const past = await get(node.url, file(BLOB_BIG), tls, { range: `bytes=${big.length}-` });
  assert.equal(past.status, 416);
  assert.equal(past.headers["content-range"], `bytes */${big.length}`);

  const refused = async (path: string, status: number): Promise<void> => {
    const res = await get(node.url, path, tls);
    assert.equal(res.status, status, path);
    assert.ok(!res.body.includes(Buffer.from("root:")), path);
  };
  await refused(`/v1/trees/${SHORT}/files/../../../../etc/passwd`, 404);
  await refused(`/v1/trees/${SHORT}/files/..%2F..%2F..%2F..%2Fetc%2Fpasswd`, 404);
  await refused(`/v1/trees/${SHORT}/files/%2Fetc%2Fpasswd`, 404);
  await refused(`/v1/trees/${SHORT}/files/model%zz`, 400);
  await refused(`/v1/trees/../${SHORT}/manifest`, 404);
  await refused(`/v1/trees/not-a-hash/manifest`, 400);
  await refused(file("no/such/file"), 404);
  await refused(file(READY_MARKER), 404);
  await refused(file(SNAP_WEIGHTS), 404); // a symlink of the tree, not a regular file
  await refused("/etc/passwd", 404);

  // A listed file swapped for a symlink to something outside is not followed.
  chmodSync(node.tree, 0o755);
  await rename(join(node.tree, TOP), join(node.tree, "top.moved"));
  await symlink("/etc/passwd", join(node.tree, TOP));
  await refused(file(TOP), 404);
  // A listed file below a directory swapped for a symlink is not reached either.
  chmodSync(join(node.tree, "cache/triton"), 0o755);
  await rename(join(node.tree, "cache/triton/abc"), join(node.tree, "cache/triton/abc.moved"));
  await symlink("abc.moved", join(node.tree, "cache/triton/abc"));
  await refused(file(KERNEL), 404);
});

void test("a tree that is not committed is not served", async (t) => {
  const f = await fixture(t, 1);
  const node = f.nodes[0] as Node;
  const tls = tlsOf(f);
  chmodSync(node.tree, 0o755);
  await rm(join(node.tree, READY_MARKER));
  assert.equal((await get(node.url, paths.manifest(SHORT), tls)).status, 404);
  assert.equal((await get(node.url, paths.meta(SHORT), tls)).status, 404);
  assert.equal((await get(node.url, paths.file(SHORT, KERNEL), tls)).status, 404);
  assert.equal((await get(node.url, paths.manifest("0123456789abcdef"), tls)).status, 404);
  await assert.rejects(replicateTree(f.opts()), ReplicationError);
  await assertNothingLeft(f.receiverStore);
});

void test("with every source dead mid-transfer the replication fails cleanly and leaves nothing", async (t) => {
  const f = await fixture(t);
  let closing: Promise<unknown> | undefined;
  await assert.rejects(
    replicateTree(
      f.opts({
        streams: 2,
        onProgress: () => {
          closing ??= Promise.all(f.nodes.map((n) => n.server.close()));
        },
      }),
    ),
    (err: unknown) => err instanceof ReplicationError && /no source left/.test(err.message),
  );
  assert.ok(closing, "the sources died while data was moving");
  await assertNothingLeft(f.receiverStore);
});

void test("an abort stops the replication and leaves nothing", async (t) => {
  const f = await fixture(t);
  const ac = new AbortController();
  await assert.rejects(
    replicateTree(f.opts({ streams: 2, signal: ac.signal, onProgress: () => ac.abort() })),
    /cancelled/,
  );
  await assertNothingLeft(f.receiverStore);
});

void test("a source that stalls is dropped after stallMs and another serves", async (t) => {
  const f = await fixture(t, 1);
  const pem = await issueCert(f.ca, { commonName: "staller", usage: "both", ips: ["127.0.0.1"] });
  // Accepts, answers headers, then never sends a byte of the body.
  const staller = https.createServer({ ca: f.ca.cert, ...pem, requestCert: true }, (_req, res) => {
    res.writeHead(200, { "content-length": "1000" });
    res.flushHeaders();
  });
  await new Promise<void>((resolve) => staller.listen(0, "127.0.0.1", resolve));
  t.after(() => {
    staller.closeAllConnections();
    staller.close();
  });
  const port = (staller.address() as { port: number }).port;
  const r = await replicateTree(
    f.opts({
      stallMs: 1500,
      sources: [
        { node: "staller", url: `https://127.0.0.1:${port}` },
        { node: "node-0", url: (f.nodes[0] as Node).url },
      ],
    }),
  );
  assert.deepEqual(r.dropped, [{ node: "staller", reason: "timeout" }]);
  await assertSameTree(f, r.dest);
});

void test("one stalled stream of a source that keeps sending elsewhere is asked again, not the source dropped", async (t) => {
  // The only source holds back its third request, the first range (the manifest and the metadata
  // come first), past the stall limit, as a crowded link's TCP backs off one flow, and answers
  // every other request at once.
  let calls = 0;
  const f = await fixture(t, 1, {
    authorize: async () => {
      if (++calls !== 3) return true;
      return new Promise((resolve) => setTimeout(() => resolve(true), 4000));
    },
  });
  const origin = f.nodes[0] as Node;
  const t0 = performance.now();
  const r = await replicateTree(f.opts({ stallMs: 1500, sources: [{ node: origin.name, url: origin.url }] }));
  const ms = performance.now() - t0;
  // Done after the stall limit (the held range stalled) and before the held answer would have
  // come: the range was asked again, of the same source.
  assert.ok(ms >= 1500 && ms < 4000, `took ${ms.toFixed(0)} ms`);
  assert.deepEqual(r.dropped, []);
  await assertSameTree(f, r.dest);
});

const createHashHex = (b: Buffer): string => createHash("sha256").update(b).digest("hex");

void test("a name that is not UTF-8 travels byte for byte, and a sparse file stays sparse", async (t) => {
  const dir = tempDir(t, "ws-replication-");
  const src = join(dir, "src");
  const odd = Buffer.concat([
    Buffer.from(`${src}/model/`),
    Buffer.from([0x77, 0xff, 0xfe, 0x25, 0x20, 0x3f]),
  ]);
  mkdirSync(join(src, "model"), { recursive: true });
  writeFileSync(odd, "odd name\n");
  const sparse = join(src, "model", "sparse.bin");
  const tail = Buffer.from("end of a file with a hole\n");
  const fd = openSync(sparse, "w");
  writeSync(fd, tail, 0, tail.length, 64 * 1024 * 1024);
  closeSync(fd);
  const storeDir = join(dir, "node-0");
  await capture({ src, dest: join(storeDir, SHORT), hash: HASH, progress: false, durable: false });
  const ca = await createCA("warmstart node agents");
  const pem = await issueCert(ca, { commonName: "node-0", usage: "both", ips: ["127.0.0.1"] });
  const server = new PeerServer({ storeDir, tls: { ca: ca.cert, ...pem } });
  const port = await server.listen(0, "127.0.0.1");
  t.after(() => server.close());

  const r = await replicateTree({
    hash: HASH,
    expectedManifestDigest: manifestDigestOf(join(storeDir, SHORT)),
    sources: [{ node: "node-0", url: `https://127.0.0.1:${port}` }],
    storeDir: join(dir, "receiver"),
    tls: { ca: ca.cert, ...pem },
    durable: false,
  });
  const names = readdirSync(Buffer.from(join(r.dest, "model")), { encoding: "buffer" });
  assert.ok(
    names.some((n) => n.equals(Buffer.from([0x77, 0xff, 0xfe, 0x25, 0x20, 0x3f]))),
    "the odd name",
  );
  const oddCopy = Buffer.concat([
    Buffer.from(`${r.dest}/model/`),
    Buffer.from([0x77, 0xff, 0xfe, 0x25, 0x20, 0x3f]),
  ]);
  assert.equal(readFileSync(oddCopy, "utf8"), "odd name\n");
  const st = statSync(join(r.dest, "model", "sparse.bin"));
  assert.equal(st.size, 64 * 1024 * 1024 + tail.length);
  assert.ok(st.blocks * 512 < 1024 * 1024, `the hole stays a hole (${st.blocks} blocks)`);
  const fh = readFileSync(join(r.dest, "model", "sparse.bin"));
  assert.ok(fh.subarray(64 * 1024 * 1024).equals(tail));
  assert.equal(
    r.receivedBytes,
    r.totalBytes,
    "the zeros of a hole still travel: only their writes are saved",
  );
});

void test("two nodes filling at once serve each other the chunks they hold, and both commit the captured tree", async (t) => {
  const f = await fixture(t, 1);
  const origin = f.nodes[0] as Node;
  const peers = await Promise.all(
    ["a", "b"].map(async (name) => {
      const storeDir = join(f.dir, `filling-${name}`);
      const pem = await issueCert(f.ca, { commonName: name, usage: "both", ips: ["127.0.0.1"] });
      const tls = { ca: f.ca.cert, ...pem };
      const server = new PeerServer({ storeDir, tls });
      const port = await server.listen(0, "127.0.0.1");
      t.after(() => server.close());
      return { name, storeDir, tls, server, url: `https://127.0.0.1:${port}` };
    }),
  );
  const [a, b] = peers as [(typeof peers)[0], (typeof peers)[0]];
  // What `a` serves while it fills, as it starts (before any chunk is in).
  let filling: FillingTree | undefined;
  let atStart: { have: string; holds: boolean } | undefined;
  const run = (me: typeof a, other: typeof a, startAt: number): ReturnType<typeof replicateTree> =>
    replicateTree(
      f.opts({
        storeDir: me.storeDir,
        tls: me.tls,
        sources: [
          { node: "origin", url: origin.url },
          { node: other.name, url: other.url, filling: true },
        ],
        startAt,
        havePollMs: 20,
        streams: 2,
        serveFilling: (tree) => {
          if (me === a) {
            filling = tree;
            atStart = { have: tree.have(), holds: tree.holds(BLOB_BIG, 0, 9) };
          }
          return me.server.serveFilling(SHORT, tree);
        },
      }),
    );
  const [ra, rb] = await Promise.all([run(a, b, 0), run(b, a, 0.5)]);
  await assertSameTree(f, ra.dest);
  await assertSameTree(f, rb.dest);
  const relayed = (ra.bySource.b ?? 0) + (rb.bySource.a ?? 0);
  assert.ok(relayed > 0, `the filling nodes fed each other (${JSON.stringify([ra.bySource, rb.bySource])})`);
  assert.ok(
    (ra.bySource.origin ?? 0) + (rb.bySource.origin ?? 0) < 2 * ra.totalBytes,
    "the origin sent less than two trees",
  );
  const tree = filling as FillingTree;
  const meta = TreeMetaSchema.parse(JSON.parse(tree.meta.toString("utf8")));
  const start = parseHave(atStart?.have ?? "", CHUNK, planTree(tree.manifest, meta, CHUNK).chunks.length);
  assert.ok(start && [...start.have, ...start.fetching].every((b) => b === 0), "nothing held or fetched yet");
  assert.equal(atStart?.holds, false);
  // A range a filling copy does not hold is 425, with what it holds in the header; one it holds
  // is served (the same tree under another short, from the committed files of `a`).
  const other = "0123456789abcdef";
  a.server.serveFilling(other, { ...tree, staging: ra.dest, holds: (_rel, start) => start === 0 });
  const no = await get(a.url, paths.file(other, BLOB_BIG), tlsOf(f), { range: "bytes=70000-70009" });
  assert.equal(no.status, 425);
  assert.match(String(no.headers["x-warmstart-have"]), /^65536:/);
  const yes = await get(a.url, paths.file(other, BLOB_BIG), tlsOf(f), { range: "bytes=0-9" });
  assert.equal(yes.status, 206);
  assert.ok(yes.body.equals((f.files.get(BLOB_BIG) as Buffer).subarray(0, 10)));
  assert.ok((await get(a.url, paths.manifest(other), tlsOf(f))).body.equals(tree.raw));
  // Committed, `a` serves the tree as any committed copy: no have header.
  const after = await get(a.url, paths.file(SHORT, BLOB_BIG), tlsOf(f), { range: "bytes=0-9" });
  assert.equal(after.status, 206);
  assert.equal(after.headers["x-warmstart-have"], undefined);
});

void test("a slow manifest and metadata are not a stall: the stall clock starts with the chunks", async (t) => {
  const f = await fixture(t, 1);
  const origin = f.nodes[0] as Node;
  const raw = readFileSync(join(origin.tree, MANIFEST_FILE));
  const manifest = parseManifest(raw.toString("utf8"), "test");
  const meta = (await get(origin.url, paths.meta(SHORT), tlsOf(f))).body;
  const chunks = planTree(manifest, TreeMetaSchema.parse(JSON.parse(meta.toString("utf8"))), CHUNK).chunks;
  const all = new HaveBits(chunks.length);
  for (let i = 0; i < chunks.length; i++) all.set(i, true);
  // A filling copy that answers its manifest and metadata slowly (each within the request
  // timeout, together past stallMs), then holds nothing for a moment, then every chunk.
  let calls = 0;
  let held = false;
  const pem = await issueCert(f.ca, { commonName: "slow", usage: "both", ips: ["127.0.0.1"] });
  const server = new PeerServer({
    storeDir: join(f.dir, "slow"),
    tls: { ca: f.ca.cert, ...pem },
    authorize: async () => {
      if (++calls > 2) return true;
      await new Promise((resolve) => setTimeout(resolve, 700));
      if (calls === 2) setTimeout(() => (held = true), 300);
      return true;
    },
  });
  const port = await server.listen(0, "127.0.0.1");
  t.after(() => server.close());
  server.serveFilling(SHORT, {
    raw,
    manifest,
    meta,
    staging: origin.tree,
    holds: () => held,
    have: () => (held ? all : new HaveBits(chunks.length)).header(CHUNK),
  });
  const r = await replicateTree(
    f.opts({
      stallMs: 1000,
      havePollMs: 50,
      sources: [{ node: "slow", url: `https://127.0.0.1:${port}`, filling: true }],
    }),
  );
  assert.deepEqual(r.dropped, []);
  await assertSameTree(f, r.dest);
});

void test("workers that pick in the same tick keep to the per-source limit: a swarm's first requests do not all go to the origin", async (t) => {
  // The origin counts the range streams it sends at once.
  let now = 0;
  let peak = 0;
  const metrics: ReplicationMetrics = {
    ...createReplicationMetrics(new Registry()),
    servingStreams: {
      inc: () => void (peak = Math.max(peak, ++now)),
      dec: () => void now--,
    } as unknown as ReplicationMetrics["servingStreams"],
  };
  const f = await fixture(t, 1, { metrics });
  // Three peers that fill too and hold nothing yet: alive, so 8 streams over 4 sources allow
  // 2 requests per source, and every chunk can only come from the origin.
  const peers = await Promise.all(
    ["p0", "p1", "p2"].map(async (name) => {
      const pem = await issueCert(f.ca, { commonName: name, usage: "both", ips: ["127.0.0.1"] });
      const server = new PeerServer({ storeDir: join(f.dir, name), tls: { ca: f.ca.cert, ...pem } });
      const port = await server.listen(0, "127.0.0.1");
      t.after(() => server.close());
      return { node: name, url: `https://127.0.0.1:${port}`, filling: true };
    }),
  );
  const origin = f.nodes[0] as Node;
  const r = await replicateTree(
    f.opts({
      streams: 8,
      chunkBytes: 16 * 1024,
      sources: [{ node: origin.name, url: origin.url }, ...peers],
    }),
  );
  await assertSameTree(f, r.dest);
  assert.ok(peak > 0, "the origin sent ranges");
  assert.ok(peak <= 2, `at most 2 ranges at once from the origin, saw ${peak}`);
});

void test("a connection keeps the peer it was opened by: the server refuses to renegotiate it", async (t) => {
  const seen: string[] = [];
  const f = await fixture(t, 1, {
    authorize: (_short, peer) => {
      seen.push(peer.commonName);
      return true;
    },
  });
  const url = new URL((f.nodes[0] as Node).url);
  // TLS 1.2, the only version with renegotiation, which could present another certificate.
  const socket = tls.connect({
    host: url.hostname,
    port: Number(url.port),
    ...tlsOf(f),
    maxVersion: "TLSv1.2",
    checkServerIdentity: () => undefined,
  });
  t.after(() => socket.destroy());
  socket.on("error", () => undefined);
  await once(socket, "secureConnect");
  socket.write(`GET ${paths.manifest(SHORT)} HTTP/1.1\r\nhost: x\r\n\r\n`);
  await once(socket, "data");
  assert.deepEqual(seen, ["receiver"]);
  const renegotiated = await new Promise<Error | null>((resolve) => {
    socket.once("close", () => resolve(new Error("closed")));
    socket.renegotiate({ rejectUnauthorized: false }, (err) => resolve(err));
  });
  assert.ok(renegotiated instanceof Error, "the server did not renegotiate");
});
