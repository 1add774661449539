import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile, rename } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "node:tls";
import { setTimeout as sleep } from "node:timers/promises";
import { pino } from "pino";
import { createCA, issueCert } from "../common/certs.js";
import { startAdmissionServer } from "./server.js";

/** The serial number of the certificate the server presents now. */
function servedSerial(port: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: "127.0.0.1", port, rejectUnauthorized: false }, () => {
      resolve(socket.getPeerCertificate().serialNumber);
      socket.end();
    });
    socket.on("error", reject);
  });
}

test("a rotated serving certificate is picked up without a restart", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "webhook-cert-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const ca = await createCA("test");
  const first = await issueCert(ca, { commonName: "a", ips: ["127.0.0.1"], usage: "server" });
  const second = await issueCert(ca, { commonName: "b", ips: ["127.0.0.1"], usage: "server" });
  const certFile = join(dir, "tls.crt");
  const keyFile = join(dir, "tls.key");
  await writeFile(certFile, first.cert);
  await writeFile(keyFile, first.key);

  const srv = await startAdmissionServer({
    host: "127.0.0.1",
    port: 0,
    cert: { certFile, keyFile },
    maxBodyBytes: 1024 * 1024,
    handler: (r) => Promise.resolve({ uid: r.request.uid, allowed: true }),
    onHandlerError: (_e, r) => ({ uid: r.request.uid, allowed: true }),
    log: pino({ level: "silent" }),
  });
  t.after(() => srv.close());
  const port = Number(new URL(srv.url).port);
  const before = await servedSerial(port);

  // Swap both files the way a Secret volume update does: new files renamed into place.
  await writeFile(`${keyFile}.new`, second.key);
  await writeFile(`${certFile}.new`, second.cert);
  await rename(`${keyFile}.new`, keyFile);
  await rename(`${certFile}.new`, certFile);

  const deadline = Date.now() + 10_000;
  let after = before;
  while (after === before && Date.now() < deadline) {
    await sleep(200);
    after = await servedSerial(port);
  }
  assert.notEqual(after, before, "the new certificate is served");
});
