import assert from "node:assert/strict";
import https from "node:https";
import type { AddressInfo, Socket } from "node:net";
import { test } from "node:test";
import { createCA, issueCert } from "../../common/certs.js";
import { ACTIVE_STREAMS_HEADER } from "./plan.js";
import { Source, SourceError } from "./source.js";

async function tls(): Promise<{ ca: string; cert: string; key: string }> {
  const ca = await createCA("warmstart node agents");
  return { ca: ca.cert, ...(await issueCert(ca, { commonName: "peer", usage: "both", ips: ["127.0.0.1"] })) };
}

void test("a kept-alive connection closed under a reused request is retried, not held against the source", async (t) => {
  const pem = await tls();
  const served = new Map<Socket, number>();
  let requests = 0;
  // The second request on any connection finds it closed, as when the server's keep-alive
  // timeout fires just as the client reuses the socket.
  const server = https.createServer({ ...pem, requestCert: true }, (req, res) => {
    requests++;
    const n = (served.get(req.socket) ?? 0) + 1;
    served.set(req.socket, n);
    if (n > 1) return req.socket.destroy();
    res.setHeader(ACTIVE_STREAMS_HEADER, "3");
    res.end("hello");
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  const url = new URL(`https://127.0.0.1:${(server.address() as AddressInfo).port}`);
  const source = new Source("peer", url, pem, 1, 5_000, () => undefined);
  t.after(() => source.close());

  assert.equal((await source.fetchBody("/a", 100)).toString(), "hello");
  assert.equal(source.others, 3, "the load header is read");
  assert.equal((await source.fetchBody("/b", 100)).toString(), "hello");
  assert.equal(requests, 3, "the second request went out twice: once on the closed connection");
  assert.ok(source.alive);
});

void test("a body larger than asked for, or an error status, fails with the reason the source is dropped for", async (t) => {
  const pem = await tls();
  const server = https.createServer({ ...pem, requestCert: true }, (req, res) => {
    if (req.url === "/big") return res.end(Buffer.alloc(1000));
    res.statusCode = 404;
    res.end("no");
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => {
    server.closeAllConnections();
    server.close();
  });
  const url = new URL(`https://127.0.0.1:${(server.address() as AddressInfo).port}`);
  const source = new Source("peer", url, pem, 2, 5_000, () => undefined);
  t.after(() => source.close());
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
