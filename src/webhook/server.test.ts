import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile, rename } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect } from "node:tls";
import { request as httpsRequest } from "node:https";
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

/** POSTs a minimal review, with or without a client certificate; resolves to the HTTP status. */
function postReview(port: number, client?: { cert: string; key: string }): Promise<number> {
  const body = JSON.stringify({
    apiVersion: "admission.k8s.io/v1",
    kind: "AdmissionReview",
    request: { uid: "u", operation: "CREATE", resource: { group: "", version: "v1", resource: "pods" } },
  });
  return new Promise((resolve, reject) => {
    const req = httpsRequest(
      {
        host: "127.0.0.1",
        port,
        path: "/mutate",
        method: "POST",
        rejectUnauthorized: false,
        headers: { "content-type": "application/json" },
        ...(client ?? {}),
      },
      (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

test("with a client CA, only the API server's certificate may post reviews; probes stay open", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "webhook-client-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const serving = await createCA("serving");
  const leaf = await issueCert(serving, { commonName: "webhook", ips: ["127.0.0.1"], usage: "server" });
  const clusterCa = await createCA("cluster");
  const otherCa = await createCA("elsewhere");
  const apiserver = await issueCert(clusterCa, {
    commonName: "kube-apiserver-webhook-client",
    usage: "client",
  });
  const admin = await issueCert(clusterCa, {
    commonName: "admin",
    organization: "system:masters",
    usage: "client",
  });
  const forged = await issueCert(otherCa, { commonName: "kube-apiserver-webhook-client", usage: "client" });
  const caFile = join(dir, "client-ca.crt");
  await writeFile(caFile, clusterCa.cert);

  let handled = 0;
  const refused: string[] = [];
  const srv = await startAdmissionServer({
    host: "127.0.0.1",
    port: 0,
    cert: leaf,
    maxBodyBytes: 1024 * 1024,
    handler: (r) => (handled++, Promise.resolve({ uid: r.request.uid, allowed: true })),
    onHandlerError: (_e, r) => ({ uid: r.request.uid, allowed: true }),
    log: pino({ level: "silent" }),
    clientAuth: { caFile, names: ["kube-apiserver-webhook-client"], onRefused: (why) => refused.push(why) },
  });
  t.after(() => srv.close());
  const port = Number(new URL(srv.url).port);

  assert.equal(await postReview(port), 401, "no certificate");
  assert.equal(await postReview(port, forged), 403, "a certificate another CA signed, with the right name");
  assert.equal(await postReview(port, admin), 403, "the cluster CA's certificate for someone else");
  assert.equal(handled, 0, "no review reached the handler");
  assert.deepEqual(refused, ["no-certificate", "untrusted", "name"]);
  assert.equal(await postReview(port, apiserver), 200);
  assert.equal(handled, 1);
  const health = await new Promise<number>((resolve, reject) =>
    httpsRequest(`${srv.url}/healthz`, { rejectUnauthorized: false }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    })
      .on("error", reject)
      .end(),
  );
  assert.equal(health, 200);
});

test("a server that cannot listen leaves no certificate watcher behind", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "webhook-busy-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const ca = await createCA("test");
  const leaf = await issueCert(ca, { commonName: "a", ips: ["127.0.0.1"], usage: "server" });
  const certFile = join(dir, "tls.crt");
  const keyFile = join(dir, "tls.key");
  await writeFile(certFile, leaf.cert);
  await writeFile(keyFile, leaf.key);
  const opts: Omit<Parameters<typeof startAdmissionServer>[0], "port"> = {
    host: "127.0.0.1",
    cert: { certFile, keyFile },
    maxBodyBytes: 1024,
    handler: (r) => Promise.resolve({ uid: r.request.uid, allowed: true }),
    onHandlerError: (_e, r) => ({ uid: r.request.uid, allowed: true }),
    log: pino({ level: "silent" }),
  };
  // The port's holder serves its certificate from memory: it watches no file.
  const first = await startAdmissionServer({ ...opts, cert: leaf, port: 0 });
  t.after(() => first.close());
  const watchers = (): number => process.getActiveResourcesInfo().filter((r) => r === "StatWatcher").length;
  const before = watchers();
  await assert.rejects(
    startAdmissionServer({ ...opts, port: Number(new URL(first.url).port) }),
    /webhook cannot listen/,
  );
  assert.equal(watchers(), before, "no file watched for a server that does not serve");
});
