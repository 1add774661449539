import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { open, readFile, type FileHandle } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import https from "node:https";
import type { AddressInfo, Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { createCA, issueCert } from "../../common/certs.js";
import { ACTIVE_STREAMS_HEADER } from "./plan.js";
import { dueForPoll, POLLS_PER_TICK } from "./polls.js";
import { NotHeldError, Source, SourceError, StalledStreamError } from "./source.js";

async function tls(): Promise<{ ca: string; cert: string; key: string }> {
  const ca = await createCA("warmstart node agents");
  return { ca: ca.cert, ...(await issueCert(ca, { commonName: "peer", usage: "both", ips: ["127.0.0.1"] })) };
}

/** A peer server on loopback answering with `handler`, and a Source of it taking `streams` at once. */
async function sourceOf(
  t: TestContext,
  handler: (req: IncomingMessage, res: ServerResponse) => void,
  streams = 1,
): Promise<Source> {
  const pem = await tls();
  const server = https.createServer({ ...pem, requestCert: true }, handler);
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  const url = new URL(`https://127.0.0.1:${(server.address() as AddressInfo).port}`);
  const source = new Source("peer", url, pem, streams, 5_000, () => undefined);
  t.after(() => source.close());
  return source;
}

/** A file in a folder of its own, open to read and write; both go when the test ends. */
async function tempFile(t: TestContext): Promise<{ path: string; fh: FileHandle }> {
  const dir = mkdtempSync(join(tmpdir(), "ws-source-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, "f");
  const fh = await open(path, "w+");
  t.after(() => fh.close());
  return { path, fh };
}

void test("a kept-alive connection closed under a reused request is retried, not held against the source", async (t) => {
  const served = new Map<Socket, number>();
  let requests = 0;
  // The second request on any connection finds it closed, as when the server's keep-alive
  // timeout fires just as the client reuses the socket.
  const source = await sourceOf(t, (req, res) => {
    requests++;
    const n = (served.get(req.socket) ?? 0) + 1;
    served.set(req.socket, n);
    if (n > 1) return req.socket.destroy();
    res.setHeader(ACTIVE_STREAMS_HEADER, "3");
    res.end("hello");
  });

  assert.equal((await source.fetchBody("/a", 100)).toString(), "hello");
  assert.equal(source.others, 3, "the load header is read");
  assert.equal((await source.fetchBody("/b", 100)).toString(), "hello");
  assert.equal(requests, 3, "the second request went out twice: once on the closed connection");
  assert.ok(source.alive);
});

void test("a body larger than asked for, or an error status, fails with the reason the source is dropped for", async (t) => {
  const source = await sourceOf(
    t,
    (req, res) => {
      if (req.url === "/big") return res.end(Buffer.alloc(1000));
      res.statusCode = 404;
      res.end("no");
    },
    2,
  );
  await assert.rejects(
    source.fetchBody("/big", 10),
    (e: unknown) => e instanceof SourceError && e.reason === "protocol",
  );
  await assert.rejects(
    source.fetchBody("/x", 10),
    (e: unknown) => e instanceof SourceError && e.reason === "status",
  );
  assert.ok(source.drop("status"));
  await assert.rejects(source.fetchBody("/big", 10_000), /dropped/);
});

void test("ranges come over kept-alive connections: reused, retried once when closed under reuse, and checked", async (t) => {
  const data = Buffer.from(Array.from({ length: 3000 }, (_, i) => i % 251));
  const sockets = new Set<Socket>();
  const served = new Map<Socket, number>();
  const source = await sourceOf(t, (req, res) => {
    sockets.add(req.socket);
    const n = (served.get(req.socket) ?? 0) + 1;
    served.set(req.socket, n);
    const [start, end] = (/^bytes=(\d+)-(\d+)$/.exec(req.headers.range ?? "") ?? []).slice(1).map(Number);
    if (req.url === "/closing" && n > 1) return req.socket.destroy();
    if (req.url === "/wrong") return void res.writeHead(206, { "content-range": "bytes 1-10/3000" }).end();
    // A length that is not plain digits frames nothing.
    if (req.url === "/exponent")
      return void res
        .writeHead(206, { "content-length": "1e1", "content-range": "bytes 0-9/3000" })
        .end(data.subarray(0, 10));
    if (req.url === "/short") {
      res.writeHead(206, { "content-length": "100", "content-range": `bytes ${start}-${end}/3000` });
      res.write(data.subarray(0, 10));
      return setTimeout(() => req.socket.destroy(), 50);
    }
    res.writeHead(206, {
      "content-length": String(end! - start! + 1),
      "content-range": `bytes ${start}-${end}/3000`,
    });
    res.end(data.subarray(start, end! + 1));
  });
  const { path, fh } = await tempFile(t);
  const o = { skipZeros: false, compare: false };

  await source.fetchRange("/a", 0, 1000, fh, o);
  await source.fetchRange("/a", 1000, 2000, fh, o);
  assert.ok((await readFile(path)).equals(data), "both ranges in place");
  assert.equal(sockets.size, 1, "one connection for both");
  // The next request on that connection finds it closed: sent again on a fresh one.
  await source.fetchRange("/closing", 0, 10, fh, o);
  assert.equal(sockets.size, 2);
  assert.ok(source.alive);
  await assert.rejects(
    source.fetchRange("/wrong", 0, 10, fh, o),
    (e: unknown) => e instanceof SourceError && e.reason === "protocol",
  );
  await assert.rejects(
    source.fetchRange("/exponent", 0, 10, fh, o),
    (e: unknown) => e instanceof SourceError && e.reason === "protocol",
  );
  await assert.rejects(
    source.fetchRange("/short", 0, 100, fh, o),
    (e: unknown) => e instanceof SourceError && e.reason === "error",
  );
  assert.equal(source.bytes, 3020, "every byte received is counted");
});

void test("filling sources are asked what they hold a few at a time, those heard from least recently first", () => {
  const every = 500;
  const now = 10_000;
  // Twelve filling peers heard from at different times, one committed, one dropped, one just heard.
  const peers: { id: number; alive: boolean; have: Uint8Array | "all"; heardAt: number }[] = Array.from(
    { length: 12 },
    (_, i) => ({ id: i, alive: true, have: new Uint8Array(1), heardAt: 1_000 + i * 100 }),
  );
  peers[0]!.have = "all";
  peers[1]!.alive = false;
  peers[2]!.heardAt = now - 10;
  const asked = dueForPoll(peers, now, every);
  assert.equal(asked.length, POLLS_PER_TICK, "no more than a few per tick, whatever the swarm's size");
  assert.deepEqual(
    asked.map((p) => p.id),
    [3, 4, 5, 6],
  );
  // Each asked peer counts as heard: the next tick asks the next ones, and all in turn.
  const seen = new Set<number>();
  for (let tick = 0; tick < 3; tick++)
    for (const p of dueForPoll(peers, now + tick, every)) {
      p.heardAt = now + tick;
      seen.add(p.id);
    }
  assert.deepEqual(
    [...seen].sort((a, b) => a - b),
    [3, 4, 5, 6, 7, 8, 9, 10, 11],
  );
});

void test("a range stopped while a run is being written settles only once that write is done", async (t) => {
  const MiB = 1024 * 1024;
  // Sends a full run, then goes away before the rest of what it promised.
  const source = await sourceOf(t, (req, res) => {
    res.writeHead(206, {
      "content-length": String(2 * MiB),
      "content-range": `bytes 0-${2 * MiB - 1}/${2 * MiB}`,
    });
    res.write(Buffer.alloc(MiB, 9));
    setTimeout(() => req.socket.destroy(), 50);
  });
  const { fh: real } = await tempFile(t);
  // A slow disk: the run's write is still out when the source goes away.
  let writtenAt = 0;
  const slow = {
    write: async (...args: Parameters<FileHandle["write"]>) => {
      await new Promise((r) => setTimeout(r, 400));
      const r = await real.write(...args);
      writtenAt = Date.now();
      return r;
    },
    read: real.read.bind(real),
  } as unknown as FileHandle;
  // Stopped (an abort, as a stall timer's would) while that write is out.
  const stop = new AbortController();
  setTimeout(() => stop.abort(), 150);
  await assert.rejects(
    source.fetchRange("/f", 0, 2 * MiB, slow, { skipZeros: false, compare: false, signal: stop.signal }),
  );
  const settledAt = Date.now();
  assert.ok(writtenAt > 0 && writtenAt <= settledAt, "the write was done before the range failed");
});

void test("a source keeps its place after one stalled stream per chunk, and after a range a filling copy lacks", () => {
  const tls = { ca: "", cert: "", key: "" };
  const origin = new Source("origin", new URL("https://127.0.0.1:1"), tls, 8, 1000, () => undefined);
  const stalled = (): Error => new StalledStreamError("one stream waits");
  assert.equal(origin.keptAfter(stalled(), 5), true);
  // The same chunk stalling again at the same source: a read that hangs there every time.
  assert.equal(origin.keptAfter(stalled(), 5), false);
  assert.equal(origin.keptAfter(stalled(), 6), true);
  // A source silent on every stream, or failing otherwise, is not kept.
  assert.equal(origin.keptAfter(new SourceError("timeout", "nothing at all"), 7), false);
  assert.equal(origin.keptAfter(new SourceError("status", "answered 500"), 8), false);
  const filling = new Source("peer", new URL("https://127.0.0.1:2"), tls, 8, 1000, () => undefined, true);
  filling.have = new Uint8Array([0xff]);
  assert.equal(filling.keptAfter(new NotHeldError("not yet"), 3), true);
  assert.deepEqual(filling.have, new Uint8Array(0), "it holds nothing until it says otherwise");
});
