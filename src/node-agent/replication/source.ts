/**
 * One peer a receiver pulls from: its HTTPS agent (client certificate, kept-alive connections),
 * what the receiver knows of its load and, for a copy still filling, of the chunks it holds
 * (have.ts), and the requests in flight to it, so dropping it cuts them all at once. A request
 * that sees no byte for `stallMs` fails as a stall.
 */
import type { FileHandle } from "node:fs/promises";
import type { ClientRequest, IncomingMessage } from "node:http";
import https from "node:https";
import type { TlsMaterial } from "./server.js";
import { chunkBuffers } from "./buffer-pool.js";
import { HAVE_HEADER, NOT_HELD_STATUS, parseHave, type Holder } from "./have.js";
import { ACTIVE_STREAMS_HEADER } from "./plan.js";
import { RangeConn } from "./range-conn.js";

/** Why a source was given up on (the metric's label). */
export type DropReason = "error" | "timeout" | "status" | "protocol" | "corrupt" | "manifest";

/** A request to a source failed; `reason` says how, for the source's drop. */
export class SourceError extends Error {
  constructor(
    readonly reason: DropReason,
    message: string,
    options?: ErrorOptions,
  ) {
    super(message, options);
  }
}

/** A reused connection was closed under a request that got no answer (see Source.get). */
class StaleSocketError extends Error {}

/** A filling copy does not hold the range asked for yet: not its fault, the chunk goes elsewhere. */
export class NotHeldError extends Error {}

/** One range got nothing for the stall limit while the source's other ranges went on: the source
 * is alive, and one of its connections waits (a crowded link's TCP backs off one flow for
 * seconds at a time). A timeout still, wherever the caller does not tell it apart. */
export class StalledStreamError extends SourceError {
  constructor(message: string) {
    super("timeout", message);
  }
}

/** The receiver's own disk failed (not the source's fault: no source is dropped for it). */
export class LocalIoError extends Error {}

const local = async <T>(what: string, op: Promise<T>): Promise<T> => {
  try {
    return await op;
  } catch (err) {
    throw new LocalIoError(`${what}: ${(err as Error).message}`, { cause: err });
  }
};

const RUN_BYTES = 1024 * 1024;
const ZERO = Buffer.alloc(64 * 1024);
/** Whether `b` is all zeros, looked at in pieces of ZERO's size. */
const isZero = (b: Buffer): boolean => {
  for (let at = 0; at < b.length; at += ZERO.length) {
    const part = b.subarray(at, at + ZERO.length);
    if (!part.equals(ZERO.subarray(0, part.length))) return false;
  }
  return true;
};

export class Source implements Holder {
  alive = true;
  inflight = 0;
  others = 0;
  bytes = 0;
  dropReason?: DropReason;
  /** Every chunk (a committed copy), or the bitmap a filling copy last sent. */
  have: Uint8Array | "all";
  fetching?: Uint8Array;
  /** When an answer last came (performance.now() milliseconds). */
  heardAt = 0;
  /** When a byte of a range last came (performance.now() milliseconds; 0: never). */
  lastByteAt = 0;
  /** Chunks one of whose ranges stalled alone here (keptAfter). */
  private readonly stalledOn = new Set<number>();
  /** The plan's chunk size and count, once known: a HAVE_HEADER is read against them. */
  plan?: { chunkBytes: number; chunks: number };
  private readonly agent: https.Agent;
  private readonly requests = new Set<ClientRequest>();
  /** Connections for ranged GETs (range-conn.ts), and those idle between requests. */
  private readonly conns = new Set<RangeConn>();
  private idle: RangeConn[] = [];
  private readonly stalled = new WeakMap<IncomingMessage, SourceError>();

  constructor(
    readonly node: string,
    readonly url: URL,
    private readonly tls: TlsMaterial,
    streams: number,
    private readonly stallMs: number,
    private readonly onBytes: (source: Source, n: number) => void,
    /** A copy still filling: it holds nothing until it says otherwise. */
    readonly filling = false,
    private readonly onHave: (source: Source) => void = () => undefined,
  ) {
    this.have = filling ? new Uint8Array(0) : "all";
    this.agent = new https.Agent({
      ca: tls.ca,
      cert: tls.cert,
      key: tls.key,
      keepAlive: true,
      maxSockets: streams,
      // The CA signs node agents only, and the chart cannot know every node's address when it
      // issues their certificates: the chain is the check, not the name (docs/adr/0010).
      checkServerIdentity: () => undefined,
    });
  }

  /**
   * Whether this source keeps its place after a range of chunk `chunk` failed with `err`: a
   * filling copy that lacks the chunk after all (or has just committed), which then holds
   * nothing until it says otherwise; and a live source with one stalled stream, unless it
   * stalled on that chunk before (a read that hangs on its side would stall it every time).
   */
  keptAfter(err: unknown, chunk: number): boolean {
    if (err instanceof NotHeldError) {
      if (this.have !== "all") this.have = new Uint8Array(0);
      return true;
    }
    if (!(err instanceof StalledStreamError) || this.stalledOn.has(chunk)) return false;
    this.stalledOn.add(chunk);
    return true;
  }

  /** Gives up on this source: every request in flight to it fails now. */
  drop(reason: DropReason): boolean {
    if (!this.alive) return false;
    this.alive = false;
    this.dropReason = reason;
    const err = new SourceError(reason, `source ${this.node} dropped (${reason})`);
    for (const r of this.requests) r.destroy(err);
    for (const c of this.conns) c.destroy(err);
    this.agent.destroy();
    return true;
  }

  /** The header proving this node to the source (TlsMaterial.token), when there is a token. */
  private authorization(): Record<string, string> {
    const token = this.tls.token?.();
    return token ? { authorization: `Bearer ${token}` } : {};
  }

  close(): void {
    for (const r of this.requests) r.destroy();
    for (const c of this.conns) c.destroy(new Error(`source ${this.node} closed`));
    this.agent.destroy();
  }

  /**
   * GET `path`; resolves with the response once its headers are in (any status). A kept-alive
   * connection the server closed just as it was reused fails before any answer: that request is
   * sent once more on a fresh connection rather than held against the source.
   */
  private async get(
    path: string,
    headers: Record<string, string>,
    signal?: AbortSignal,
  ): Promise<IncomingMessage> {
    try {
      return await this.send(path, headers, signal);
    } catch (err) {
      if (!(err instanceof StaleSocketError)) throw err;
      return this.send(path, headers, signal);
    }
  }

  private send(
    path: string,
    headers: Record<string, string>,
    signal?: AbortSignal,
  ): Promise<IncomingMessage> {
    if (!this.alive)
      return Promise.reject(new SourceError(this.dropReason ?? "error", `source ${this.node} is dropped`));
    return new Promise((resolve, reject) => {
      const req = https.request(new URL(path, this.url), {
        agent: this.agent,
        headers: { ...headers, ...this.authorization() },
        signal,
      });
      let response: IncomingMessage | undefined;
      this.requests.add(req);
      req.on("close", () => this.requests.delete(req));
      req.setTimeout(this.stallMs, () => {
        const err = new SourceError("timeout", `source ${this.node} sent nothing for ${this.stallMs} ms`);
        // Once the body is flowing, the reader sees a bare "aborted": the reason is kept for it.
        if (response) this.stalled.set(response, err);
        req.destroy(err);
      });
      req.on("error", (err: NodeJS.ErrnoException) => {
        const stale = req.reusedSocket && !response && (err.code === "ECONNRESET" || err.code === "EPIPE");
        reject(stale ? new StaleSocketError(err.message) : asSourceError(err, this.node));
      });
      req.on("response", (res) => {
        response = res;
        this.heard(res.statusCode ?? 0, res.headers);
        resolve(res);
      });
      req.end();
    });
  }

  /** What an answer says of the source's load, and of a filling copy's chunks: its HAVE_HEADER,
   * or all once it answers without one (it has committed). */
  private heard(status: number, headers: Record<string, string | string[] | undefined>): void {
    const active = Number(headers[ACTIVE_STREAMS_HEADER]);
    // Its count includes our own streams to it.
    if (Number.isFinite(active)) this.others = Math.max(0, active - this.inflight + 1);
    this.heardAt = performance.now();
    if (!this.filling || this.have === "all") return;
    const header = headers[HAVE_HEADER];
    if (typeof header === "string") {
      const bits = this.plan && parseHave(header, this.plan.chunkBytes, this.plan.chunks);
      if (!bits) return;
      this.have = bits.have;
      this.fetching = bits.fetching;
    } else if (status === 200 || status === 206) [this.have, this.fetching] = ["all", undefined];
    else return;
    this.onHave(this);
  }

  /** Counts a request the caller has picked this source for but not sent yet (the receiver
   * opens the chunk's file first) as in flight, until the returned function is called just
   * before the request: workers that pick in the same tick then see each other's picks. */
  claim(): () => void {
    this.inflight++;
    let held = true;
    return () => {
      if (held) this.inflight--;
      held = false;
    };
  }

  /** Asks a filling copy what it holds (the answer's headers say it); a copy that is not
   * serving the tree yet holds nothing. */
  async poll(path: string): Promise<void> {
    this.inflight++;
    try {
      const res = await this.get(path, {});
      res.resume();
      if (res.statusCode !== 200 && res.statusCode !== 404)
        throw new SourceError("status", `source ${this.node}: ${path} answered ${res.statusCode}`);
    } finally {
      this.inflight--;
    }
  }

  /** The whole body of `path` (manifest, metadata), at most `max` bytes. */
  async fetchBody(path: string, max: number, signal?: AbortSignal): Promise<Buffer> {
    this.inflight++;
    try {
      return await this.body(await this.get(path, {}, signal), path, max);
    } finally {
      this.inflight--;
    }
  }

  private async body(res: IncomingMessage, path: string, max: number): Promise<Buffer> {
    try {
      if (res.statusCode !== 200)
        throw new SourceError("status", `source ${this.node}: ${path} answered ${res.statusCode}`);
      const parts: Buffer[] = [];
      let n = 0;
      for await (const b of res as AsyncIterable<Buffer>) {
        n += b.length;
        if (n > max)
          throw new SourceError("protocol", `source ${this.node}: ${path} is larger than ${max} bytes`);
        parts.push(b);
      }
      if (!res.complete) throw new SourceError("error", `source ${this.node}: ${path} ended early`);
      return Buffer.concat(parts);
    } catch (err) {
      res.destroy();
      throw this.stalled.get(res) ?? asSourceError(err, this.node);
    }
  }

  /**
   * Fetches `length` bytes at `offset` of the file at `path` into `fh` at the same offset, over
   * one of this source's range connections (range-conn.ts). The bytes are copied into a buffer
   * of RUN_BYTES written with one positional write when full, the connection paused while a
   * write is out (the socket waits for the disk). `skipZeros` leaves runs of zeros unwritten
   * (the file was created sparse at its size), so holes stay holes. With `compare`, each run is
   * first read back from `fh`; resolves with whether any byte on disk differed from what this
   * source sent. A kept-alive connection the server closed just as it was reused is retried
   * once on a fresh one, as in get.
   */
  async fetchRange(
    path: string,
    offset: number,
    length: number,
    fh: FileHandle,
    o: { skipZeros: boolean; compare: boolean; signal?: AbortSignal },
  ): Promise<boolean> {
    this.inflight++;
    try {
      try {
        return await this.range(path, offset, length, fh, o, false);
      } catch (err) {
        if (!(err instanceof StaleSocketError)) throw err;
        return await this.range(path, offset, length, fh, o, true);
      }
    } finally {
      this.inflight--;
    }
  }

  /** An idle range connection still open (unless `fresh`), or a new one. */
  private conn(fresh: boolean): RangeConn {
    for (let c = fresh ? undefined : this.idle.pop(); c; c = this.idle.pop()) {
      if (c.reusable) return c;
      this.conns.delete(c);
    }
    const c = new RangeConn(this.url, this.tls, this.stallMs);
    this.conns.add(c);
    return c;
  }

  private range(
    path: string,
    offset: number,
    length: number,
    fh: FileHandle,
    o: { skipZeros: boolean; compare: boolean; signal?: AbortSignal },
    fresh: boolean,
  ): Promise<boolean> {
    if (!this.alive)
      return Promise.reject(new SourceError(this.dropReason ?? "error", `source ${this.node} is dropped`));
    if (o.signal?.aborted) return Promise.reject(abortError());
    const end = offset + length - 1;
    const conn = this.conn(fresh);
    /** When this request last heard from the source (its own timeout runs from then). */
    let heardAt = performance.now();
    return new Promise<boolean>((resolve, reject) => {
      const size = Math.min(RUN_BYTES, length);
      const free: Buffer[] = [];
      let buf: Buffer = chunkBuffers.take(size);
      // Once the request is over and no write of it is out, its buffers serve the next one.
      const giveBack = (): void => {
        for (const b of [buf, ...free.splice(0)]) chunkBuffers.give(b);
      };
      let [fill, pos, differed, done] = [0, offset, false, false];
      let writing: Promise<void> = Promise.resolve();
      const onAbort = (): void => fail(abortError());
      o.signal?.addEventListener("abort", onAbort);
      const settle = (): void => {
        done = true;
        o.signal?.removeEventListener("abort", onAbort);
      };
      const fail = (err: unknown): void => {
        if (done) return;
        settle();
        this.conns.delete(conn);
        conn.destroy();
        const e = err instanceof StaleSocketError ? err : asSourceError(err, this.node);
        // Settled once no write of this request is out: its chunk may be fetched from another
        // source at once, and a late write here would land over that one's bytes.
        void writing.finally(() => {
          giveBack();
          reject(e);
        });
      };
      const flush = (): void => {
        const [full, n, at] = [buf, fill, pos];
        [buf, fill, pos] = [free.pop() ?? chunkBuffers.take(size), 0, pos + n];
        writing = writing
          .then(async () => {
            if (done) return; // failed: nothing more of this request is written
            const run = full.subarray(0, n);
            if (o.compare && (await differs(fh, run, at))) differed = true;
            if (!(o.skipZeros && isZero(run))) await writeAll(fh, run, at);
            free.push(full);
            if (!done) conn.resume();
          })
          .catch(fail);
      };
      conn.request(
        path,
        { range: `bytes=${offset}-${end}`, ...this.authorization() },
        {
          head: (status, headers) => {
            heardAt = performance.now();
            this.heard(status, headers);
            // A filling copy answers 404 in the moment it commits (have.ts): not held, not a fault.
            if ((status === NOT_HELD_STATUS || status === 404) && this.filling && this.have !== "all")
              return fail(new NotHeldError(`source ${this.node} does not hold that range of ${path} yet`));
            if (status !== 206)
              return fail(
                new SourceError("status", `source ${this.node}: range of ${path} answered ${status}`),
              );
            const cr = /^bytes (\d+)-(\d+)\/\d+$/.exec(headers["content-range"] ?? "");
            if (!cr || Number(cr[1]) !== offset || Number(cr[2]) !== end)
              return fail(
                new SourceError("protocol", `source ${this.node}: wrong content-range for ${path}`),
              );
            if (Number(headers["content-length"]) !== length)
              fail(
                new SourceError(
                  "protocol",
                  `source ${this.node}: more or fewer bytes than asked for ${path}`,
                ),
              );
          },
          body: (b) => {
            if (done) return false;
            this.bytes += b.length;
            this.lastByteAt = heardAt = performance.now();
            this.onBytes(this, b.length);
            let flushed = false;
            for (let at = 0; at < b.length;) {
              const n = b.copy(buf, fill, at);
              [fill, at] = [fill + n, at + n];
              if (fill === buf.length) [flushed] = [true, flush()];
            }
            return !flushed;
          },
          end: () => {
            if (fill > 0) flush();
            void writing.then(() => {
              if (done) return;
              settle();
              giveBack();
              if (conn.reusable) this.idle.push(conn);
              else this.conns.delete(conn);
              resolve(differed);
            });
          },
          error: (err, stale) => {
            if ((err as { protocol?: boolean }).protocol)
              return fail(new SourceError("protocol", `source ${this.node}: ${err.message} (${path})`));
            if ((err as { timeout?: boolean }).timeout) {
              const what = `source ${this.node} sent nothing for ${this.stallMs} ms`;
              // Other ranges of this source moved since this one last did: this stream alone waits.
              return fail(
                this.lastByteAt > heardAt
                  ? new StalledStreamError(`${what} on one stream while its others went on`)
                  : new SourceError("timeout", what),
              );
            }
            fail(stale && !(err instanceof SourceError) ? new StaleSocketError(err.message) : err);
          },
        },
      );
    });
  }
}

/** Whether the bytes at `pos` of `fh` differ from `run`. */
async function differs(fh: FileHandle, run: Buffer, pos: number): Promise<boolean> {
  const have = Buffer.allocUnsafe(run.length);
  const { bytesRead } = await local("reading back", fh.read(have, 0, run.length, pos));
  return bytesRead !== run.length || !have.equals(run);
}

/** Writes all of `b` at `pos` of `fh` (a positional write may write less). */
async function writeAll(fh: FileHandle, b: Buffer, pos: number): Promise<void> {
  for (let at = 0; at < b.length;) {
    const { bytesWritten } = await local("writing", fh.write(b, at, b.length - at, pos + at));
    if (bytesWritten === 0) throw new LocalIoError("writing: no byte written");
    at += bytesWritten;
  }
}

function abortError(): Error {
  return Object.assign(new Error("The operation was aborted"), { name: "AbortError" });
}

function asSourceError(err: unknown, node: string): Error {
  if (err instanceof SourceError || err instanceof LocalIoError || err instanceof NotHeldError) return err;
  const e = err as Error;
  // An abort is the caller's, not the source's fault: passed on as it is.
  if (e.name === "AbortError") return e;
  return new SourceError("error", `source ${node}: ${e.message}`, { cause: err });
}
