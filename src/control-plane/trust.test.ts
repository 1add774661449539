/**
 * The control plane's trust rules (SPEC 1.9, 3), each played by the attacker it stops: a cluster
 * that registers as another to take its queue, a request into a namespace nobody allowed, a model
 * URL's credentials leaking into records, answers and logs, and a client that does not check
 * whom it talks to over TLS.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdtemp, rm, stat, writeFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { ControlPlaneClient, ControlPlaneError } from "./client.js";
import {
  OPERATOR_TOKEN,
  call,
  clusterToken,
  registerAgent,
  startHarness,
} from "../../test/support/control-plane.js";
import { createCA, issueCert } from "../common/certs.js";
import { memoryLogger } from "../../test/support/testing.js";
import type { DeploymentRequest } from "./api.js";

const H100 = [{ gpuType: "H100", count: 8 }];

void test("a cluster token registers its own cluster only: cluster alpha cannot take beta's queue", async (t) => {
  const h = await startHarness(t);
  const beta = await registerAgent(h.cp.url, "beta", H100);
  const { id } = await h.operator.submit({ name: "llama", model: "m", image: "i", gpuType: "H100" });
  assert.equal((await h.operator.getRequest(id)).clusterId, "beta");

  // The attacker holds alpha's (valid) registration token and claims to be beta.
  const asBeta = await call(h.cp.url, "POST", "/v1/clusters/register", {
    token: clusterToken("alpha"),
    body: { clusterId: "beta", inventory: H100 },
  });
  assert.equal(asBeta.status, 403, JSON.stringify(asBeta.body));
  assert.match(String(asBeta.body.error), /issued to cluster alpha, not beta/);
  assert.equal(asBeta.body.credentials, undefined, "no credentials for beta");

  // Nor can alpha's own credentials read or acknowledge beta's queue.
  const alpha = await registerAgent(h.cp.url, "alpha", H100);
  for (const path of ["/v1/clusters/beta/queues/receive", "/v1/clusters/beta/credentials/renew"]) {
    const r = await call(h.cp.url, "POST", path, { token: alpha.credential, body: { queue: "deploy" } });
    assert.equal(r.status, 403, path);
  }
  const stolen = await call(h.cp.url, "POST", `/v1/requests/${id}/status`, {
    token: alpha.credential,
    body: { phase: "Terminated", instances: [] },
  });
  assert.equal(stolen.status, 403, "alpha cannot report beta's request");

  // Beta's message is still there for beta, untouched.
  const got = await beta.client.receive("beta", { queue: "deploy", maxMessages: 10 });
  assert.deepEqual(
    got.messages.map((m) => m.body.requestId),
    [id],
  );
  assert.equal(got.messages[0]?.receiveCount, 1, "never delivered to anyone else");
  const clusters = await h.operator.listClusters();
  assert.deepEqual(
    clusters.map((c) => c.clusterId),
    ["alpha", "beta"],
  );
});

void test("an unknown or removed cluster token is 401; an operator or queue token on register is 403", async (t) => {
  const h = await startHarness(t);
  const a = await registerAgent(h.cp.url, "alpha", H100);
  const unknown = await call(h.cp.url, "POST", "/v1/clusters/register", {
    token: "cluster-token-for-tests-nobody",
    body: { clusterId: "nobody", inventory: [] },
  });
  assert.equal(unknown.status, 401);
  for (const token of [OPERATOR_TOKEN, a.credential]) {
    const r = await call(h.cp.url, "POST", "/v1/clusters/register", {
      token,
      body: { clusterId: "alpha", inventory: [] },
    });
    assert.equal(r.status, 403);
  }
});

void test("the token file is re-read: a token added there registers, a removed one is refused", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "warmstart-tokens-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const file = join(dir, "cluster-tokens");
  const logs = memoryLogger();
  const h = await startHarness(t, { clusterTokens: [], clusterTokenFile: file, logger: logs.log });
  const register = (token: string, clusterId: string): Promise<{ status: number }> =>
    call(h.cp.url, "POST", "/v1/clusters/register", { token, body: { clusterId, inventory: [] } });

  assert.equal((await register("token-of-cluster-east-0001", "east")).status, 401, "no file yet");
  await writeFile(file, "# east\neast=token-of-cluster-east-0001\n", { mode: 0o600 });
  assert.equal((await register("token-of-cluster-east-0001", "east")).status, 200);
  assert.equal((await register("token-of-cluster-east-0001", "west")).status, 403);

  // A broken edit keeps the tokens read before, and says so.
  await writeFile(file, "east=token-of-cluster-east-0001\nwest\n");
  assert.equal((await register("token-of-cluster-east-0001", "east")).status, 200);
  assert.ok(logs.warnings().some((w) => /cannot reload the cluster token file/.test(w.msg)));

  // A file others can read is made owner-only when it is read.
  await writeFile(file, "west=token-of-cluster-west-0001\n", { mode: 0o644 });
  assert.equal((await register("token-of-cluster-east-0001", "east")).status, 401, "east was removed");
  assert.equal((await register("token-of-cluster-west-0001", "west")).status, 200);
  assert.equal((await stat(file)).mode & 0o777, 0o600);
  const text = JSON.stringify(logs.entries);
  assert.ok(!text.includes("token-of-cluster"), "no token is ever logged");
});

void test("requests only into allowed namespaces: 403 at submit otherwise", async (t) => {
  const h = await startHarness(t, { allowedNamespaces: ["serving"] });
  await registerAgent(h.cp.url, "alpha", H100);
  for (const namespace of ["kube-system", "warmstart-system", "default"]) {
    await assert.rejects(
      h.operator.submit({ name: "escape", namespace, model: "m", image: "i" }),
      (err: unknown) =>
        err instanceof ControlPlaneError &&
        err.status === 403 &&
        new RegExp(`namespace ${namespace} is not one deployment requests may target`).test(err.message),
    );
  }
  assert.deepEqual(await h.operator.listRequests(), [], "nothing was stored");
  const ok = await h.operator.submit({ name: "llama", namespace: "serving", model: "m", image: "i" });
  assert.equal(ok.status, "Queued");

  const any = await startHarness(t, { allowedNamespaces: ["*"] });
  const r = await any.operator.submit({ name: "x", namespace: "team-a", model: "m", image: "i" });
  assert.equal(r.status, "Pending", "accepted (no cluster yet)");
});

void test("a request is placed only on a cluster whose agent deploys into its namespace", async (t) => {
  const h = await startHarness(t);
  const alpha = await registerAgent(h.cp.url, "alpha", H100);
  // alpha now says it deploys into "serving" only.
  await alpha.client.register({ clusterId: "alpha", inventory: H100, namespaces: ["serving"] });
  const { id } = await h.operator.submit({ name: "llama", namespace: "default", model: "m", image: "i" });
  const pending = await h.operator.getRequest(id);
  assert.equal(pending.status, "Pending");
  assert.match(pending.message ?? "", /that deploys into namespace default/);
  const [c] = await h.operator.listClusters();
  assert.deepEqual(c?.namespaces, ["serving"]);

  // Beta says nothing about namespaces: it takes any.
  await registerAgent(h.cp.url, "beta", H100);
  const placed = await h.operator.getRequest(id);
  assert.equal(placed.status, "Queued");
  assert.equal(placed.clusterId, "beta");

  // A request alpha was given but has not taken goes back when alpha narrows its namespaces.
  const { id: second } = await h.operator.submit({
    name: "second",
    namespace: "serving",
    model: "m",
    image: "i",
  });
  assert.equal((await h.operator.getRequest(second)).clusterId, "alpha");
  await alpha.client.register({ clusterId: "alpha", inventory: H100, namespaces: ["other"] });
  assert.equal((await h.operator.getRequest(second)).clusterId, "beta");
});

void test("credentials in a model URL are redacted in every record, answer and log line; args reach the container as given", async (t) => {
  const logs = memoryLogger();
  const h = await startHarness(t, { logger: logs.log });
  const a = await registerAgent(h.cp.url, "alpha", H100);
  const secret = "hf_s3cretT0ken";
  const model = `https://user:${secret}@hub.example.com/org/model-7b`;

  const noArgs = await h.operator.submit({ name: "plain", model, image: "i" });
  const withArgs = await h.operator.submit({
    name: "explicit",
    model,
    image: "i",
    args: ["--model", model, "--port", "8000"],
  });
  const redacted = "https://<redacted>@hub.example.com/org/model-7b";
  for (const id of [noArgs.id, withArgs.id]) {
    const view = await h.operator.getRequest(id);
    assert.equal(view.model, redacted);
    assert.ok(!JSON.stringify(view).includes(secret), JSON.stringify(view));
  }
  const listed = await call(h.cp.url, "GET", "/v1/requests", { token: OPERATOR_TOKEN });
  assert.ok(!JSON.stringify(listed.body).includes(secret));

  // The agent gets the model redacted, and the args (the user's own) as given: the container
  // needs the credentials to download.
  const got = await a.client.receive("alpha", { queue: "deploy", maxMessages: 10 });
  const bodies = got.messages.map((m) => m.body as DeploymentRequest);
  for (const b of bodies) assert.equal(b.model, redacted);
  assert.deepEqual(bodies.find((b) => b.name === "plain")?.args, ["--model", model]);
  assert.deepEqual(bodies.find((b) => b.name === "explicit")?.args, ["--model", model, "--port", "8000"]);

  // The stored model column holds no credential; nothing logged does either.
  await h.cp.close();
  const db = new Database(h.dbPath, { readonly: true });
  const models = db.prepare("SELECT model FROM requests").all() as { model: string }[];
  db.close();
  assert.deepEqual(
    models.map((m) => m.model),
    [redacted, redacted],
  );
  assert.ok(logs.entries.length > 0);
  assert.ok(!JSON.stringify(logs.entries).includes(secret), "no log line holds the credential");
});

void test("TLS: the control plane serves HTTPS; the client trusts its CA file and refuses another", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "warmstart-cp-tls-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const ca = await createCA("warmstart test CA");
  const leaf = await issueCert(ca, { commonName: "control-plane", ips: ["127.0.0.1"], usage: "server" });
  await writeFile(join(dir, "tls.crt"), leaf.cert);
  await writeFile(join(dir, "tls.key"), leaf.key, { mode: 0o600 });
  const h = await startHarness(t, {
    tlsCertFile: join(dir, "tls.crt"),
    tlsKeyFile: join(dir, "tls.key"),
  });
  assert.match(h.cp.url, /^https:\/\/127\.0\.0\.1:\d+$/);

  const trusting = new ControlPlaneClient({ baseUrl: h.cp.url, token: OPERATOR_TOKEN, ca: ca.cert });
  assert.deepEqual(await trusting.listClusters(), []);
  const { id } = await trusting.submit({ name: "tls", model: "m", image: "i" });
  assert.equal((await trusting.getRequest(id)).name, "tls");

  // A client without the CA, or trusting another CA, does not talk to it.
  const other = await createCA("someone else");
  for (const c of [
    new ControlPlaneClient({ baseUrl: h.cp.url, token: OPERATOR_TOKEN }),
    new ControlPlaneClient({ baseUrl: h.cp.url, token: OPERATOR_TOKEN, ca: other.cert }),
  ]) {
    await assert.rejects(
      c.listClusters(),
      (err: unknown) => err instanceof ControlPlaneError && err.status === 0,
    );
  }
  // The operator commands take the CA as a file.
  await writeFile(join(dir, "ca.crt"), ca.cert);
  const bin = fileURLToPath(new URL("../../../bin/warmstart", import.meta.url));
  const env = { ...process.env, WARMSTART_STATE_DIR: dir, WARMSTART_LOG_FORMAT: "json" };
  const conn = ["--control-plane", h.cp.url, "--token", OPERATOR_TOKEN];
  const viaCli = await promisify(execFile)(
    process.execPath,
    [bin, "requests", "-o", "json", ...conn, "--ca-file", join(dir, "ca.crt")],
    { env },
  );
  assert.deepEqual(
    (JSON.parse(viaCli.stdout) as { name: string }[]).map((r) => r.name),
    ["tls"],
  );
  await assert.rejects(
    promisify(execFile)(process.execPath, [bin, "requests", ...conn], { env }),
    /GET \/v1\/requests failed: fetch failed: unable to verify the first certificate/,
  );

  // Plain HTTP to the TLS port gets no answer from the API.
  await assert.rejects(fetch(`${h.cp.url.replace("https:", "http:")}/healthz`).then((r) => r.json()));
});
