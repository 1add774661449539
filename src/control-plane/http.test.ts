// The control plane's HTTP edges that the API tests do not reach: a body far past the cap, a
// malformed request, a port already taken, an unreadable or rotated certificate.
import assert from "node:assert/strict";
import { test } from "node:test";
import { request } from "node:http";
import { connect } from "node:net";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createCA, issueCert } from "../common/certs.js";
import { ControlPlaneClient, ControlPlaneError } from "./client.js";
import { startControlPlane } from "./server.js";
import { OPERATOR_TOKEN, clusterToken, startHarness } from "../../test/support/control-plane.js";
import { memoryLogger } from "../../test/support/testing.js";

const base = (dir: string): Parameters<typeof startControlPlane>[0] => ({
  dbPath: join(dir, "control-plane.db"),
  port: 0,
  host: "127.0.0.1",
  clusterTokens: [{ clusterId: "alpha", token: clusterToken("alpha") }],
  operatorToken: OPERATOR_TOKEN,
  logger: memoryLogger().log,
});

void test("a body far past the cap without a declared length is cut off; a malformed request gets a plain 400", async (t) => {
  const h = await startHarness(t, { maxBodyBytes: 1024 });
  const { port } = new URL(h.cp.url);
  const outcome = await new Promise<string>((resolve) => {
    const req = request(
      {
        host: "127.0.0.1",
        port,
        method: "POST",
        path: "/v1/requests",
        headers: { authorization: `Bearer ${OPERATOR_TOKEN}`, "content-type": "application/json" },
      },
      (res) => {
        res.resume();
        resolve(`status ${res.statusCode}`);
      },
    );
    req.on("error", () => resolve("connection closed"));
    // Chunked: no content-length for the server to refuse up front.
    const chunk = Buffer.alloc(4096, "x");
    let sent = 0;
    const pump = (): void => {
      while (sent < 1024 * 64 && req.write(chunk)) sent += chunk.length;
      if (sent < 1024 * 64) req.once("drain", pump);
      else req.end();
    };
    pump();
  });
  assert.match(outcome, /^(status 413|connection closed)$/);

  const answer = await new Promise<string>((resolve, reject) => {
    const s = connect(Number(port), "127.0.0.1", () => s.write("NOT HTTP AT ALL\r\n\r\n"));
    let text = "";
    s.on("data", (d) => (text += d.toString()));
    s.on("end", () => resolve(text));
    s.on("error", reject);
  });
  assert.match(answer, /^HTTP\/1\.1 400 Bad Request\r\n/);
  // The server is still answering.
  assert.deepEqual(await h.operator.listClusters(), []);
});

void test("a port already taken, or a certificate that cannot be read, fails the start with one clear error", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "warmstart-cp-http-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const first = await startControlPlane(base(dir));
  t.after(() => first.close());
  await assert.rejects(
    startControlPlane({ ...base(dir), dbPath: join(dir, "other.db"), port: first.port }),
    new RegExp(`^Error: control plane cannot listen on 127\\.0\\.0\\.1:${first.port}: .*EADDRINUSE`),
  );
  await assert.rejects(
    startControlPlane({
      ...base(dir),
      dbPath: join(dir, "third.db"),
      tlsCertFile: join(dir, "missing.crt"),
      tlsKeyFile: join(dir, "missing.key"),
    }),
    /^Error: control plane cannot read its TLS certificate: ENOENT/,
  );
});

void test("a rotated certificate is served without a restart; an unreadable one keeps the old", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "warmstart-cp-rotate-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const logs = memoryLogger();
  const oldCa = await createCA("old CA");
  const newCa = await createCA("new CA");
  const write = async (ca: typeof oldCa): Promise<void> => {
    const leaf = await issueCert(ca, { commonName: "control-plane", ips: ["127.0.0.1"], usage: "server" });
    await writeFile(join(dir, "tls.key"), leaf.key, { mode: 0o600 });
    await writeFile(join(dir, "tls.crt"), leaf.cert);
  };
  await write(oldCa);
  const cp = await startControlPlane({
    ...base(dir),
    logger: logs.log,
    tlsCertFile: join(dir, "tls.crt"),
    tlsKeyFile: join(dir, "tls.key"),
  });
  t.after(() => cp.close());
  const client = (ca: typeof oldCa): ControlPlaneClient =>
    new ControlPlaneClient({ baseUrl: cp.url, token: OPERATOR_TOKEN, ca: ca.cert });
  assert.deepEqual(await client(oldCa).listClusters(), []);

  const until = async (what: RegExp): Promise<void> => {
    for (let i = 0; i < 100 && !logs.entries.some((e) => what.test(e.msg)); i++)
      await new Promise((r) => setTimeout(r, 100));
    assert.ok(
      logs.entries.some((e) => what.test(e.msg)),
      `logged ${what}`,
    );
  };
  await writeFile(join(dir, "tls.crt"), "not a certificate");
  await until(/could not reload the serving certificate; keeping the old one/);
  assert.deepEqual(await client(oldCa).listClusters(), [], "still served with the old certificate");

  await write(newCa);
  await until(/serving certificate reloaded/);
  assert.deepEqual(await client(newCa).listClusters(), []);
  await assert.rejects(
    client(oldCa).listClusters(),
    (err: unknown) => err instanceof ControlPlaneError && err.status === 0,
  );
});
