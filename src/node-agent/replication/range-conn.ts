/**
 * One kept-alive TLS connection to a peer server for ranged GETs, read through one fixed buffer
 * (the socket's `onread`). Node's HTTP client makes a fresh buffer and two stream events of
 * every TLS record (16 KiB): that per-record cost and the garbage it left were most of a
 * receiver's CPU. Only what a range answer of a peer server needs is parsed here: the status
 * line, the headers and a body of content-length bytes; any other shape fails the request, and
 * a connection is reused only after an answer read to its end.
 */
import tls from "node:tls";
import type { TlsMaterial } from "./server.js";

const READ_BYTES = 64 * 1024;
const MAX_HEAD_BYTES = 64 * 1024;

/** The peer broke the protocol (its fault, unlike a connection that failed). */
const protocolError = (message: string): Error => Object.assign(new Error(message), { protocol: true });

/** What a request is told: the answer's head, its body piece by piece (valid during the call
 * only; false pauses the connection until resume), its end, or why it failed. `stale`: a
 * reused connection ended before any byte of the answer (the server closed it as it idled). */
export interface RangeHandlers {
  head(status: number, headers: Record<string, string>): void;
  body(b: Buffer): boolean;
  end(): void;
  error(err: Error, stale: boolean): void;
}

export class RangeConn {
  private readonly socket: tls.TLSSocket;
  private current?: RangeHandlers;
  private head: Buffer[] = [];
  private headBytes = 0;
  /** Body bytes still to come; -1 while the head is read. */
  private left = -1;
  private heard = false;
  /** Answers read to their end on this connection. */
  private answered = 0;
  private closed = false;
  private keep = true;
  /** Whether it may take another request: open, idle, and its last answer read to the end. */
  reusable = false;

  constructor(url: URL, material: TlsMaterial, timeoutMs: number) {
    // Node reads TLS sockets through `onread` too; its types only know it for net sockets.
    const onread = {
      buffer: Buffer.allocUnsafe(READ_BYTES),
      callback: (n: number, buf: Buffer): boolean => this.read(buf, n),
    };
    this.socket = tls.connect({
      host: url.hostname.replace(/^\[|\]$/g, ""),
      port: Number(url.port || 443),
      ca: material.ca,
      cert: material.cert,
      key: material.key,
      // As for every peer: the chain is the check, not the name (docs/adr/0010).
      checkServerIdentity: () => undefined,
      onread,
    } as tls.ConnectionOptions);
    this.socket.setTimeout(timeoutMs, () =>
      this.fail(Object.assign(new Error(`sent nothing for ${timeoutMs} ms`), { timeout: true })),
    );
    this.socket.on("error", (err: Error) => this.fail(err));
    this.socket.on("close", () => this.fail(new Error("the connection closed")));
  }

  /** Sends `GET path` with `headers`; the answer goes to `h`. */
  request(path: string, headers: Record<string, string>, h: RangeHandlers): void {
    this.reusable = false;
    this.current = h;
    this.heard = false;
    [this.head, this.headBytes, this.left] = [[], 0, -1];
    const lines = Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`);
    this.socket.write(`GET ${path} HTTP/1.1\r\nhost: peer\r\n${lines.join("")}\r\n`);
    // The last answer's final piece may have paused it.
    this.socket.resume();
  }

  resume(): void {
    this.socket.resume();
  }

  /** Ends the connection; a request on it fails with `err`. */
  destroy(err?: Error): void {
    if (err) this.fail(err);
    // The request's own end: nothing more of this answer goes to it.
    this.current = undefined;
    this.closed = true;
    this.reusable = false;
    this.socket.destroy();
  }

  private fail(err: Error): void {
    const h = this.current;
    this.current = undefined;
    this.reusable = false;
    if (!this.closed) {
      this.closed = true;
      this.socket.destroy();
    }
    h?.error(err, this.answered > 0 && !this.heard && !(err as { timeout?: boolean }).timeout);
  }

  /** `n` bytes came in `buf`; returns false to pause. */
  private read(buf: Buffer, n: number): boolean {
    const h = this.current;
    if (!h) {
      this.fail(protocolError("bytes came with no request"));
      return false;
    }
    this.heard = true;
    let at = 0;
    if (this.left < 0) {
      at = this.readHead(buf, n);
      if (at < 0) return true;
      if (this.current !== h) return false;
    }
    const take = Math.min(this.left, n - at);
    if (n - at > take) {
      this.fail(protocolError("more bytes than the answer's content-length"));
      return false;
    }
    this.left -= take;
    const go = take === 0 || h.body(buf.subarray(at, at + take));
    if (this.left === 0 && this.current === h) {
      this.current = undefined;
      this.answered++;
      this.reusable = !this.closed && this.keep;
      h.end();
    }
    return go;
  }

  /** Gathers the head; once whole, parses it, tells the request, and returns where its body
   * starts in `buf` (-1 while the head is still coming). */
  private readHead(buf: Buffer, n: number): number {
    const prev = this.headBytes;
    this.head.push(Buffer.from(buf.subarray(0, n)));
    this.headBytes += n;
    const all = this.head.length === 1 ? (this.head[0] as Buffer) : Buffer.concat(this.head);
    const end = all.indexOf("\r\n\r\n", Math.max(0, prev - 3));
    if (end < 0) {
      if (this.headBytes > MAX_HEAD_BYTES) this.fail(protocolError("an answer's head is too large"));
      return -1;
    }
    const [status, ...lines] = all.subarray(0, end).toString("latin1").split("\r\n");
    const m = /^HTTP\/1\.1 (\d{3}) /.exec(`${status} `);
    const headers: Record<string, string> = {};
    let lengths = 0;
    for (const line of lines) {
      const colon = line.indexOf(":");
      if (colon <= 0) continue;
      const name = line.slice(0, colon).trim().toLowerCase();
      if (name === "content-length") lengths++;
      headers[name] = line.slice(colon + 1).trim();
    }
    // Digits only, and once: "", "0x10", "1e3" or a second value would frame the body otherwise.
    const raw = headers["content-length"] ?? "";
    const length = /^\d{1,15}$/.test(raw) && lengths === 1 ? Number(raw) : NaN;
    if (!m || !Number.isSafeInteger(length) || headers["transfer-encoding"] !== undefined) {
      this.fail(protocolError(`an answer that is not a plain HTTP/1.1 one: ${String(status).slice(0, 80)}`));
      return -1;
    }
    this.left = length;
    const h = this.current as RangeHandlers;
    if (headers.connection?.toLowerCase() === "close") this.keep = false;
    h.head(Number(m[1]), headers);
    return end + 4 - prev;
  }
}
