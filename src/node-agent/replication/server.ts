/**
 * The peer server: serves this node's committed trees to other node agents, over HTTPS that
 * requires a client certificate signed by the node agents' CA.
 *
 *   GET /v1/trees/<short>/manifest          the stored manifest, byte for byte
 *   GET /v1/trees/<short>/meta              kind, mode, owner and nanosecond times of each entry
 *   GET /v1/trees/<short>/files/<path>      a file the manifest lists, with byte ranges
 *   GET /v1/trees/<short>/have              nothing but the headers (HAVE_HEADER while filling)
 *   GET /v1/load                            how many file streams this server is sending
 *
 * A tree this node is still replicating is served too (serveFilling, have.ts): its manifest and
 * metadata as fetched, and the byte ranges whose chunks are in, with HAVE_HEADER saying which;
 * a range not held yet is NOT_HELD_STATUS. Committed trees send no HAVE_HEADER: they hold all.
 *
 * Every answer carries ACTIVE_STREAMS_HEADER, so a receiver learns how busy a source is from
 * the responses it gets anyway. Only committed trees are served (ready marker, manifest naming a
 * hash of that short); only regular files the manifest lists, opened below the tree's root with
 * no symlink at any component (datapath/beneath.ts), and streamed with backpressure.
 */
import { createHash } from "node:crypto";
import { closeSync, constants as fsc, fstatSync, readFileSync } from "node:fs";
import { open } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import https from "node:https";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import type { TLSSocket } from "node:tls";
import type { Logger } from "../../common/log.js";
import { MANIFEST_FILE, READY_MARKER, shortHash } from "../../core/contract.js";
import { at, closeFd, lstatAt, O_PATH, openBeneath, openDirNoFollow } from "../../datapath/beneath.js";
import { nameFields, nameOf, parseManifest, type Manifest } from "../../datapath/manifest.js";
import { scanTree } from "../../datapath/tree.js";
import type { ReplicationMetrics } from "../metrics.js";
import { HAVE_HEADER, NOT_HELD_STATUS } from "./have.js";
import { ACTIVE_STREAMS_HEADER, decodeRel, parseRange, type TreeMeta } from "./plan.js";
import { sendRange } from "./send-range.js";

export interface PeerIdentity {
  /** The client certificate's subject CN (one certificate may be shared by every node agent). */
  commonName: string;
  organization?: string;
  fingerprint256: string;
  /** The bearer token the peer sent: its node agent's ServiceAccount token, bound to its pod, which
   * names its node (what the certificate cannot: see authorize). */
  token?: string;
}

export interface TlsMaterial {
  ca: string | Buffer;
  cert: string | Buffer;
  key: string | Buffer;
  /** This node agent's bound ServiceAccount token, sent with every request to prove its node;
   * read at each request (the kubelet renews the file). */
  token?: () => string | undefined;
}

export interface PeerServerOptions {
  /** The node's cache store: committed trees at `<storeDir>/<short>`. */
  storeDir: string;
  tls: TlsMaterial;
  /** Whether `peer` may have the tree `short` (the node agent checks which node the peer is and
   * that a pod there in the cache's scope mounts it: peers.ts); default allows every
   * authenticated peer. */
  authorize?: (short: string, peer: PeerIdentity) => boolean | Promise<boolean>;
  log?: Logger;
  metrics?: ReplicationMetrics;
  /** A connection with no traffic for this long is closed (a peer that stopped reading). */
  idleTimeoutMs?: number;
}

/** A tree this node is still replicating (receiver.ts), served as its chunks land. */
export interface FillingTree {
  /** The manifest's bytes as fetched (they hash to the record's digest). */
  raw: Buffer;
  manifest: Manifest;
  /** The metadata's bytes as fetched (the same a committed copy would answer). */
  meta: Buffer;
  /** The staging folder the files are written into (sparse, at their final sizes). */
  staging: string;
  /** Whether bytes `start` to `end` (inclusive) of the file `rel` are in. */
  holds(rel: string, start: number, end: number): boolean;
  /** The HAVE_HEADER value: what is in now. */
  have(): string;
}

/** One committed tree as served: its manifest bytes, and its files by byte-string name. */
interface Served {
  key: string;
  raw: Buffer;
  manifest: Manifest;
  sizes: Map<string, number>;
  meta?: Buffer;
}

class HttpError extends Error {
  constructor(
    readonly status: number,
    message: string,
  ) {
    super(message);
  }
}

const MAX_MANIFEST_BYTES = 512 * 1024 * 1024;

/**
 * Opens the committed tree `<storeDir>/<short>` (no symlink anywhere below the store) and calls
 * `use` with its root descriptor and its manifest's descriptor and stat; undefined when the tree
 * is not committed.
 */
function withTree<T>(
  storeDir: string,
  short: string,
  use: (rootFd: number, manifestFd: number, key: string) => T,
): T | undefined {
  let rootFd: number;
  try {
    rootFd = openDirNoFollow(join(storeDir, short));
  } catch {
    return undefined;
  }
  try {
    try {
      if (!lstatAt(rootFd, READY_MARKER).isFile()) return undefined;
    } catch {
      return undefined;
    }
    let mfd: number;
    try {
      mfd = openBeneath(rootFd, MANIFEST_FILE, fsc.O_RDONLY | fsc.O_NONBLOCK | fsc.O_NOCTTY);
    } catch {
      return undefined;
    }
    try {
      const st = fstatSync(mfd, { bigint: true });
      if (!st.isFile() || st.size > BigInt(MAX_MANIFEST_BYTES)) return undefined;
      return use(rootFd, mfd, `${st.dev}:${st.ino}:${st.mtimeNs}:${st.size}`);
    } finally {
      closeFd(mfd);
    }
  } finally {
    closeSync(rootFd);
  }
}

/** The stored manifest of a committed tree, raw and parsed; undefined when there is none. */
export function readStoredManifest(treeDir: string): { raw: Buffer; manifest: Manifest } | undefined {
  const parts = treeDir.replace(/\/+$/, "").split("/");
  const short = parts.pop() as string;
  return withTree(parts.join("/") || "/", short, (_root, mfd) => {
    const raw = readFileSync(mfd);
    return { raw, manifest: parseManifest(raw.toString("utf8"), `${treeDir}/${MANIFEST_FILE}`) };
  });
}

/** sha256 of a stored manifest's bytes, as the record carries it: what a receiver checks the
 * manifest it fetched against. Throws when `treeDir` holds no committed tree. */
export function manifestDigestOf(treeDir: string): string {
  const stored = readStoredManifest(treeDir);
  if (!stored) throw new Error(`${treeDir} holds no committed tree`);
  return createHash("sha256").update(stored.raw).digest("hex");
}

export class PeerServer {
  readonly server: https.Server;
  private active = 0;
  private readonly trees = new Map<string, Served>();
  private readonly filling = new Map<string, { tree: FillingTree; sizes: Map<string, number> }>();

  constructor(private readonly o: PeerServerOptions) {
    this.server = https.createServer(
      {
        ca: o.tls.ca,
        cert: o.tls.cert,
        key: o.tls.key,
        // Only node agents hold certificates of this CA: nobody else gets a byte of a tree.
        requestCert: true,
        rejectUnauthorized: true,
        minVersion: "TLSv1.2",
      },
      (req, res) => void this.handle(req, res),
    );
    // One identity per connection (peerOf reads it once): no renegotiation may change it.
    this.server.on("secureConnection", (socket: TLSSocket) => socket.disableRenegotiation());
    this.server.timeout = o.idleTimeoutMs ?? 60_000;
    this.server.headersTimeout = 15_000;
    this.server.keepAliveTimeout = 30_000;
  }

  /**
   * Serves `tree` as `short` while it fills, until the returned function is called (at the
   * latest when it commits: from then on the committed tree is served). A committed tree of
   * that short is served before a filling one.
   */
  serveFilling(short: string, tree: FillingTree): () => void {
    const sizes = new Map(tree.manifest.files.map((f) => [nameOf(f.path, f.pathBytes), f.size]));
    const entry = { tree, sizes };
    this.filling.set(short, entry);
    return () => {
      if (this.filling.get(short) === entry) this.filling.delete(short);
    };
  }

  /** File streams being sent now. */
  get activeStreams(): number {
    return this.active;
  }

  /** Listens; resolves with the port (0 picks a free one). */
  listen(port: number, host: string): Promise<number> {
    return new Promise((resolve, reject) => {
      this.server.once("error", reject);
      this.server.listen(port, host, () => {
        this.server.off("error", reject);
        resolve((this.server.address() as AddressInfo).port);
      });
    });
  }

  /** Stops listening and cuts every connection, streams included. */
  close(): Promise<void> {
    return new Promise((resolve) => {
      this.server.close(() => resolve());
      this.server.closeAllConnections();
    });
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    res.setHeader(ACTIVE_STREAMS_HEADER, String(this.active));
    try {
      if (req.method !== "GET" && req.method !== "HEAD") throw new HttpError(405, "only GET and HEAD");
      const url = req.url ?? "/";
      if (url === "/v1/load")
        return send(res, 200, JSON.stringify({ activeStreams: this.active }), "application/json");
      const m = /^\/v1\/trees\/([^/]+)\/(manifest|meta|have|files\/(.+))$/.exec(url);
      if (!m) throw new HttpError(404, "no such endpoint");
      const short = m[1] as string;
      if (!/^[0-9a-f]{16}$/.test(short)) throw new HttpError(400, "not a short hash");
      const peer = { ...peerOf(req), ...bearerOf(req) };
      if (!(await (this.o.authorize ?? (() => true))(short, peer))) {
        this.o.log?.warn({ short, peer: peer.commonName }, "peer refused a tree outside its scope");
        throw new HttpError(403, "not shared with this peer");
      }
      const tree = this.load(short);
      if (!tree) return await this.handleFilling(req, res, short, m[2] as string, m[3]);
      if (m[2] === "have") return send(res, 200, "", "text/plain", req.method === "HEAD");
      if (m[2] === "manifest") return send(res, 200, tree.raw, "application/json", req.method === "HEAD");
      if (m[2] === "meta")
        return send(res, 200, await this.meta(short, tree), "application/json", req.method === "HEAD");
      const rel = decodeRel(m[3] as string);
      if (rel === undefined) throw new HttpError(400, "bad path encoding");
      const size = tree.sizes.get(rel);
      if (size === undefined) throw new HttpError(404, "not a file of this tree");
      await this.sendFile(req, res, join(this.o.storeDir, short), short, rel, size);
    } catch (err) {
      const status = err instanceof HttpError ? err.status : 500;
      if (status === 500) this.o.log?.error({ err, url: req.url }, "peer request failed");
      if (!res.headersSent) send(res, status, `${(err as Error).message}\n`, "text/plain");
      else res.destroy();
    }
  }

  /** The same answers for a tree being filled, from what is in. */
  private async handleFilling(
    req: IncomingMessage,
    res: ServerResponse,
    short: string,
    what: string,
    encoded: string | undefined,
  ): Promise<void> {
    const entry = this.filling.get(short);
    if (!entry) throw new HttpError(404, "no committed tree");
    const { tree, sizes } = entry;
    res.setHeader(HAVE_HEADER, tree.have());
    const head = req.method === "HEAD";
    if (what === "have") return send(res, 200, "", "text/plain", head);
    if (what === "manifest") return send(res, 200, tree.raw, "application/json", head);
    if (what === "meta") return send(res, 200, tree.meta, "application/json", head);
    const rel = decodeRel(encoded as string);
    if (rel === undefined) throw new HttpError(400, "bad path encoding");
    const size = sizes.get(rel);
    if (size === undefined) throw new HttpError(404, "not a file of this tree");
    const ask = parseRange(req.headers.range, size);
    const [start, end] = ask.kind === "range" ? [ask.start, ask.end] : [0, size - 1];
    if (ask.kind !== "unsatisfiable" && size > 0 && !tree.holds(rel, start, end))
      throw new HttpError(NOT_HELD_STATUS, "not held yet");
    await this.sendFile(req, res, tree.staging, short, rel, size);
  }

  /** The committed tree `short`, from the cache while its manifest is the same file. */
  private load(short: string): Served | undefined {
    const served = this.read(short);
    if (!served) this.trees.delete(short);
    return served;
  }

  private read(short: string): Served | undefined {
    return withTree(this.o.storeDir, short, (_root, mfd, key) => {
      const cached = this.trees.get(short);
      if (cached?.key === key) return cached;
      const raw = readFileSync(mfd);
      let manifest: Manifest;
      try {
        manifest = parseManifest(raw.toString("utf8"), `${short}/${MANIFEST_FILE}`);
      } catch (err) {
        this.o.log?.warn({ err, short }, "a committed tree's manifest does not parse; not serving it");
        return undefined;
      }
      if (!manifest.hash || shortHash(manifest.hash) !== short) return undefined;
      const sizes = new Map(manifest.files.map((f) => [nameOf(f.path, f.pathBytes), f.size]));
      const served: Served = { key, raw, manifest, sizes };
      this.trees.set(short, served);
      return served;
    });
  }

  /** Kind, mode, owner and times of every entry, walked below the root without symlinks. */
  private async meta(short: string, tree: Served): Promise<Buffer> {
    if (tree.meta) return tree.meta;
    const rootFd = openDirNoFollow(join(this.o.storeDir, short));
    let scanned;
    try {
      scanned = (await scanTree(rootFd, { reserved: [READY_MARKER, MANIFEST_FILE] })).entries;
    } finally {
      closeSync(rootFd);
    }
    const body: TreeMeta = {
      hash: tree.manifest.hash,
      entries: scanned.map((e) => ({
        ...nameFields(e.rel, "path"),
        // A committed tree holds nothing else: capture never copies specials.
        kind: e.kind as "dir" | "file" | "symlink",
        mode: Number(e.stat.mode) & 0o7777,
        uid: Number(e.stat.uid),
        gid: Number(e.stat.gid),
        atimeNs: String(e.stat.atimeNs),
        mtimeNs: String(e.stat.mtimeNs),
      })),
    };
    tree.meta = Buffer.from(JSON.stringify(body));
    return tree.meta;
  }

  private async sendFile(
    req: IncomingMessage,
    res: ServerResponse,
    treeDir: string,
    short: string,
    rel: string,
    size: number,
  ): Promise<void> {
    const pathFd = openTreeFile(treeDir, rel, size);
    if (pathFd === undefined) throw new HttpError(404, "the file is not the one the manifest lists");
    // Reopened through the checked descriptor: the stream gets an ordinary one of Node's fs.
    const flags = fsc.O_RDONLY | fsc.O_NONBLOCK | fsc.O_NOCTTY;
    // O_NOATIME: serving a tree leaves its access times as captured (owner or root only).
    const file = await open(at(pathFd), flags | fsc.O_NOATIME)
      .catch((err: NodeJS.ErrnoException) => {
        if (err.code !== "EPERM") throw err;
        return open(at(pathFd), flags);
      })
      .finally(() => closeFd(pathFd));
    try {
      const ask = parseRange(req.headers.range, size);
      res.setHeader("accept-ranges", "bytes");
      if (ask.kind === "unsatisfiable") {
        res.setHeader("content-range", `bytes */${size}`);
        throw new HttpError(416, "range not satisfiable");
      }
      const [start, end] = ask.kind === "range" ? [ask.start, ask.end] : [0, size - 1];
      res.statusCode = ask.kind === "range" ? 206 : 200;
      res.setHeader("content-type", "application/octet-stream");
      res.setHeader("content-length", String(end - start + 1));
      if (ask.kind === "range") res.setHeader("content-range", `bytes ${start}-${end}/${size}`);
      if (req.method === "HEAD" || size === 0) {
        res.end();
        return;
      }
      this.active++;
      this.o.metrics?.servingStreams.inc();
      try {
        await sendRange(file, res, start, end, (n) => this.o.metrics?.servedBytes.inc(n));
      } catch (err) {
        // Cut short: the peer must see a body that ended early, not wait for the rest.
        res.destroy();
        this.o.log?.debug({ err, short }, "a peer stream ended early");
      } finally {
        this.active--;
        this.o.metrics?.servingStreams.dec();
      }
    } finally {
      await file.close();
    }
  }
}

/**
 * A descriptor (O_PATH) of the regular file `rel` of a committed tree, opened below its root
 * with no symlink at any component; undefined when it is missing, not a regular file, or not of
 * the manifest's size. The caller reopens it for reading and closes it.
 */
function openTreeFile(treeDir: string, rel: string, size: number): number | undefined {
  let rootFd: number;
  try {
    rootFd = openDirNoFollow(treeDir);
  } catch {
    return undefined;
  }
  try {
    const pathFd = openBeneath(rootFd, rel, O_PATH);
    const st = fstatSync(pathFd, { bigint: true });
    if (st.isFile() && st.size === BigInt(size)) return pathFd;
    closeFd(pathFd);
    return undefined;
  } catch {
    return undefined;
  } finally {
    closeSync(rootFd);
  }
}

/** Each connection's peer, read from its certificate once: decoding it costs more CPU than
 * serving a small chunk, and a connection asks for thousands. */
const peers = new WeakMap<TLSSocket, PeerIdentity>();

function peerOf(req: IncomingMessage): PeerIdentity {
  const socket = req.socket as TLSSocket;
  let peer = peers.get(socket);
  if (!peer) {
    const cert = socket.getPeerCertificate();
    const subject = (cert.subject ?? {}) as unknown as Record<string, string | undefined>;
    peer = {
      commonName: subject.CN ?? "",
      organization: subject.O,
      fingerprint256: cert.fingerprint256 ?? "",
    };
    peers.set(socket, peer);
  }
  return peer;
}

function send(res: ServerResponse, status: number, body: string | Buffer, type: string, head = false): void {
  res.statusCode = status;
  res.setHeader("content-type", type);
  res.setHeader("content-length", String(Buffer.byteLength(body)));
  res.end(head ? undefined : body);
}

/** The bearer token of a request, if it sent one. */
function bearerOf(req: IncomingMessage): { token?: string } {
  const m = /^Bearer ([A-Za-z0-9._~+/=-]{1,8192})$/.exec(req.headers.authorization ?? "");
  return m?.[1] ? { token: m[1] } : {};
}
