import { test } from "node:test";
import assert from "node:assert/strict";
import { X509Certificate, createPrivateKey } from "node:crypto";
import { mkdtemp, readFile, readdir, rm, stat } from "node:fs/promises";
import { once } from "node:events";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { checkServerIdentity, connect, createServer, type TLSSocket } from "node:tls";
import type { AddressInfo } from "node:net";
import {
  checkStoreDriverOptions,
  enableStoreDriver,
  peerTlsFiles,
  storeDriverArgs,
  storeDriverWanted,
  writePeerTls,
} from "./store-driver.js";

const nodes = [
  { name: "real-0", kubeletRoot: "/s/nodes/real-0/kubelet", address: "127.0.1.1" },
  { name: "real-1", kubeletRoot: "/s/nodes/real-1/kubelet", address: "127.0.1.2" },
];

void test("the driver's flags: the socket under the kubelet root, then the peer certificate at the node's address", () => {
  assert.deepEqual(storeDriverArgs(nodes[0]!), [
    "--csi-plugin-dir=/s/nodes/real-0/kubelet/plugins/store.warmstart.dev",
  ]);
  assert.deepEqual(storeDriverArgs(nodes[1]!, "/s/peer-tls"), [
    "--csi-plugin-dir=/s/nodes/real-1/kubelet/plugins/store.warmstart.dev",
    "--peer-cert=/s/peer-tls/real-1.crt",
    "--peer-key=/s/peer-tls/real-1.key",
    "--peer-ca=/s/peer-tls/ca.crt",
    "--peer-token-file=/s/peer-tls/real-1.token",
    "--peer-service-account=system:serviceaccount:warmstart-system:warmstart-node-agent",
    "--peer-port=0",
    "--host=0.0.0.0",
    "--peer-address=127.0.1.2",
  ]);
});

void test("the certificate folder: one CA (no key), a leaf per node that it signed, keys owner-only", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "peer-tls-test-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await writePeerTls(dir, nodes);
  assert.deepEqual((await readdir(dir)).sort(), [
    "ca.crt",
    "real-0.crt",
    "real-0.key",
    "real-1.crt",
    "real-1.key",
  ]);
  assert.equal((await stat(dir)).mode & 0o777, 0o700);
  const ca = new X509Certificate(await readFile(join(dir, "ca.crt")));
  assert.ok(ca.ca);
  for (const node of nodes) {
    const f = peerTlsFiles(dir, node.name);
    const leaf = new X509Certificate(await readFile(f.cert));
    assert.ok(leaf.verify(ca.publicKey), `${node.name}'s certificate is signed by the CA`);
    assert.ok(leaf.checkIssued(ca));
    assert.ok(!leaf.ca);
    assert.match(leaf.subject, new RegExp(`^CN=${node.name}$`, "m"));
    assert.equal(leaf.subjectAltName, `IP Address:${node.address}`);
    assert.equal(leaf.checkIP(node.address), node.address);
    // Server and client auth: an agent serves its trees and fetches its peers'.
    assert.deepEqual([...(leaf.keyUsage ?? [])].sort(), ["1.3.6.1.5.5.7.3.1", "1.3.6.1.5.5.7.3.2"]);
    assert.equal((await stat(f.key)).mode & 0o777, 0o600);
    assert.ok(leaf.checkPrivateKey(createPrivateKey(await readFile(f.key))));
  }
});

void test("two nodes' agents accept each other's certificate both ways (mutual TLS)", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "peer-tls-test-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await writePeerTls(dir, nodes);
  const files = async (name: string): Promise<{ cert: Buffer; key: Buffer; ca: Buffer }> => {
    const f = peerTlsFiles(dir, name);
    return { cert: await readFile(f.cert), key: await readFile(f.key), ca: await readFile(f.ca) };
  };
  const server = createServer({ ...(await files("real-0")), requestCert: true, rejectUnauthorized: true });
  let client = "";
  server.on("secureConnection", (s: TLSSocket) => {
    client = s.getPeerX509Certificate()?.subject ?? "";
    s.end("ok");
  });
  server.listen(0, "127.0.0.1");
  await once(server, "listening");
  t.after(() => server.close());
  const socket = connect({
    ...(await files("real-1")),
    port: (server.address() as AddressInfo).port,
    host: "127.0.0.1",
    // The peer is announced at its node's address; the test reaches it on 127.0.0.1.
    checkServerIdentity: (_host, cert) => checkServerIdentity("127.0.1.1", cert),
  });
  await once(socket, "secureConnect");
  assert.ok(socket.authorized, String(socket.authorizationError));
  // The server's answer comes after it has seen the client's certificate.
  const [answer] = (await once(socket, "data")) as [Buffer];
  socket.destroy();
  assert.equal(answer.toString(), "ok");
  assert.match(client, /CN=real-1/);
});

void test("cluster up --store-driver: certificates for the real nodes only, under the state folder", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "store-driver-state-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const lines: string[] = [];
  const st = await enableStoreDriver(
    dir,
    [
      { name: "gpu-0" },
      { name: "real-0", real: true, address: "127.0.1.1" },
      { name: "real-1", real: true, address: "127.0.1.2" },
    ],
    (l) => lines.push(l),
  );
  assert.deepEqual(st, {
    driver: "store.warmstart.dev",
    peerTls: join(dir, "peer-tls"),
    nodes: ["real-0", "real-1"],
  });
  assert.deepEqual((await readdir(st.peerTls)).sort(), [
    "ca.crt",
    "real-0.crt",
    "real-0.key",
    "real-1.crt",
    "real-1.key",
  ]);
  assert.equal(lines.length, 1);
  await assert.rejects(
    enableStoreDriver(dir, [{ name: "gpu-0" }], () => undefined),
    /--real-nodes/,
  );
});

void test("the store driver is on by default wherever there are real nodes and roles; asked or refused by name", () => {
  assert.equal(storeDriverWanted({ realNodes: 3, bare: false }), true);
  assert.equal(storeDriverWanted({ realNodes: 0, bare: false }), false, "no kubelet registers it");
  assert.equal(storeDriverWanted({ realNodes: 1, bare: true }), false, "no node agents");
  assert.equal(
    storeDriverWanted({ storeDriver: false, realNodes: 3, bare: false }),
    false,
    "--no-store-driver",
  );
  assert.equal(storeDriverWanted({ storeDriver: true, realNodes: 1, bare: false }), true);
});

void test("--store-driver without real nodes, or with --bare, is refused with a clear error", () => {
  assert.throws(
    () => checkStoreDriverOptions({ storeDriver: true, realNodes: 0, bare: false }),
    /--store-driver needs real nodes \(--real-nodes 1 or more\)/,
  );
  assert.throws(() => checkStoreDriverOptions({ storeDriver: true, realNodes: 2, bare: true }), /--bare/);
  checkStoreDriverOptions({ storeDriver: true, realNodes: 1, bare: false });
  // Off (the default): every cluster up as before, real nodes or not.
  checkStoreDriverOptions({ storeDriver: false, realNodes: 0, bare: true });
  checkStoreDriverOptions({ realNodes: 0, bare: false });
});
