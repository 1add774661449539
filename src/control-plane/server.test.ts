import { test } from "node:test";
import assert from "node:assert/strict";
import { ControlPlaneError } from "./client.js";
import {
  CLUSTER_TOKEN,
  OPERATOR_TOKEN,
  call,
  registerAgent,
  sleep,
  startHarness,
} from "../../test/support/control-plane.js";

void test("registration is idempotent, updates the inventory and issues credentials", async (t) => {
  const h = await startHarness(t, { credentialTtlSeconds: 600, heartbeatIntervalSeconds: 15 });
  const a = await registerAgent(h.cp.url, "gpu-east", [{ gpuType: "H100", count: 8 }]);
  assert.equal(a.registration.clusterId, "gpu-east");
  assert.deepEqual(a.registration.queues, { deploy: ["H100"], termination: true });
  assert.equal(a.registration.heartbeatIntervalSeconds, 15);
  assert.equal(a.registration.renewBeforeSeconds, 150);
  const ttl = Date.parse(a.registration.credentials.expiresAt) - Date.now();
  assert.ok(ttl > 590_000 && ttl <= 600_000, `credential lives about 600 s, got ${ttl} ms`);

  const again = await a.client.register({
    clusterId: "gpu-east",
    name: "East",
    inventory: [
      { gpuType: "H100", count: 4 },
      { gpuType: "L40S", count: 2 },
    ],
  });
  assert.notEqual(
    again.credentials.token,
    a.registration.credentials.token,
    "each registration issues a credential",
  );
  assert.deepEqual(again.queues.deploy, ["H100", "L40S"]);

  const clusters = await h.operator.listClusters();
  assert.equal(clusters.length, 1, "re-registering does not add a cluster");
  const c = clusters[0];
  assert.ok(c);
  assert.equal(c.name, "East");
  assert.equal(c.agentVersion, "test", "fields not sent again are kept");
  assert.equal(c.capacity, 6);
  assert.deepEqual(
    c.inventory.map((i) => [i.gpuType, i.count]),
    [
      ["H100", 4],
      ["L40S", 2],
    ],
  );
  assert.equal(c.schedulable, true);

  const metrics = await (await fetch(`${h.cp.url}/metrics`)).text();
  assert.match(metrics, /warmstart_control_plane_registrations_total\{result="created"\} 1/);
  assert.match(metrics, /warmstart_control_plane_registrations_total\{result="updated"\} 1/);
});

void test("a cluster with zero GPUs registers with capacity 0 and is not schedulable", async (t) => {
  const h = await startHarness(t);
  const a = await registerAgent(h.cp.url, "empty", [{ gpuType: "H100", count: 0 }]);
  assert.deepEqual(a.registration.queues.deploy, []);
  const [c] = await h.operator.listClusters();
  assert.equal(c?.capacity, 0);
  assert.equal(c?.schedulable, false);
  const { id, status } = await h.operator.submit({ name: "wants-gpus", model: "m", image: "img" });
  assert.equal(status, "Pending", "no cluster has a GPU for it");
  assert.match((await h.operator.getRequest(id)).message ?? "", /waiting for a cluster with 1 free GPU/);
  assert.deepEqual((await a.client.receive("empty", { queue: "deploy", maxMessages: 10 })).messages, []);
});

void test("credentials: renew overlaps until expiry; expired, foreign, missing and wrong-kind tokens are refused", async (t) => {
  const h = await startHarness(t, { credentialTtlSeconds: 2 });
  const a = await registerAgent(h.cp.url, "alpha", [{ gpuType: "H100", count: 1 }]);
  const hb = { inventory: [{ gpuType: "H100", count: 1 }], ready: true, paused: false };
  const old = a.credential;

  await sleep(900);
  const renewed = await a.client.renew("alpha");
  assert.notEqual(renewed.credentials.token, old);
  assert.ok(Date.parse(renewed.credentials.expiresAt) > Date.parse(a.registration.credentials.expiresAt));
  // Both the old and the new credential work during the overlap.
  for (const token of [old, renewed.credentials.token]) {
    const r = await call(h.cp.url, "POST", "/v1/clusters/alpha/heartbeat", { token, body: hb });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.deepEqual(r.body, { instruction: "none" });
  }

  await sleep(1300); // past the old credential's expiry, before the new one's
  const expired = await call(h.cp.url, "POST", "/v1/clusters/alpha/heartbeat", { token: old, body: hb });
  assert.equal(expired.status, 401);
  assert.match(String(expired.body.error), /expired/);
  const fresh = await call(h.cp.url, "POST", "/v1/clusters/alpha/heartbeat", {
    token: renewed.credentials.token,
    body: hb,
  });
  assert.equal(fresh.status, 200);

  const b = await registerAgent(h.cp.url, "beta", [{ gpuType: "H100", count: 1 }]);
  // Another cluster's (valid) credential: 403, on every queue call and on renew.
  for (const path of [
    "/v1/clusters/alpha/heartbeat",
    "/v1/clusters/alpha/credentials/renew",
    "/v1/clusters/alpha/queues/receive",
  ]) {
    const r = await call(h.cp.url, "POST", path, { token: b.credential, body: { ...hb, queue: "deploy" } });
    assert.equal(r.status, 403, path);
    assert.match(String(r.body.error), /issued to cluster beta, not alpha/);
  }

  const missing = await call(h.cp.url, "POST", "/v1/clusters/alpha/heartbeat", { body: hb });
  assert.equal(missing.status, 401);
  assert.match(missing.headers.get("www-authenticate") ?? "", /^Bearer/);
  const unknown = await call(h.cp.url, "POST", "/v1/clusters/alpha/heartbeat", {
    token: "not-a-real-token",
    body: hb,
  });
  assert.equal(unknown.status, 401);
  assert.match(String(unknown.body.error), /unknown token/);
  const basic = await fetch(`${h.cp.url}/v1/clusters`, {
    headers: { authorization: `Basic ${OPERATOR_TOKEN}` },
  });
  assert.equal(basic.status, 401);

  // Wrong kind of token, each way round.
  const clusterOnQueue = await call(h.cp.url, "POST", "/v1/clusters/alpha/heartbeat", {
    token: CLUSTER_TOKEN,
    body: hb,
  });
  assert.equal(clusterOnQueue.status, 403);
  assert.match(
    String(clusterOnQueue.body.error),
    /needs a queue credential, not a cluster registration token/,
  );
  const queueOnRegister = await call(h.cp.url, "POST", "/v1/clusters/register", {
    token: renewed.credentials.token,
    body: { clusterId: "alpha", inventory: [] },
  });
  assert.equal(queueOnRegister.status, 403);
  const operatorOnQueue = await call(h.cp.url, "POST", "/v1/clusters/alpha/queues/receive", {
    token: OPERATOR_TOKEN,
    body: { queue: "deploy" },
  });
  assert.equal(operatorOnQueue.status, 403);
  const queueOnOperator = await call(h.cp.url, "GET", "/v1/clusters", { token: renewed.credentials.token });
  assert.equal(queueOnOperator.status, 403);
  const clusterOnOperator = await call(h.cp.url, "POST", "/v1/requests", {
    token: CLUSTER_TOKEN,
    body: { name: "x", model: "m", image: "i" },
  });
  assert.equal(clusterOnOperator.status, 403);

  // The typed client reports it with the status and as not retryable.
  await assert.rejects(
    b.client.heartbeat("alpha", hb),
    (err: unknown) => err instanceof ControlPlaneError && err.status === 403 && !err.retryable,
  );
});

void test("bad input is a 4xx with a clear JSON message, never a crash", async (t) => {
  const h = await startHarness(t, { maxBodyBytes: 64 * 1024 });
  const a = await registerAgent(h.cp.url, "alpha", [{ gpuType: "H100", count: 4 }]);
  const op = { token: OPERATOR_TOKEN };
  const good = { name: "llama", model: "meta/llama", image: "vllm/vllm-openai:v0.9" };

  const cases: {
    what: string;
    path: string;
    token: string;
    body?: unknown;
    raw?: string;
    status: number;
    error: RegExp;
  }[] = [
    {
      what: "wrong type",
      path: "/v1/requests",
      token: OPERATOR_TOKEN,
      body: { ...good, replicas: "2" },
      status: 400,
      error: /replicas: .*number/,
    },
    {
      what: "bad name",
      path: "/v1/requests",
      token: OPERATOR_TOKEN,
      body: { ...good, name: "Bad_Name" },
      status: 400,
      error: /name: must be a DNS-1123 label/,
    },
    {
      what: "replicas 0",
      path: "/v1/requests",
      token: OPERATOR_TOKEN,
      body: { ...good, replicas: 0 },
      status: 400,
      error: /replicas: .*>=1/,
    },
    {
      what: "gpus 0",
      path: "/v1/requests",
      token: OPERATOR_TOKEN,
      body: { ...good, gpus: 0 },
      status: 400,
      error: /gpus/,
    },
    {
      what: "missing model",
      path: "/v1/requests",
      token: OPERATOR_TOKEN,
      body: { name: "x", image: "i" },
      status: 400,
      error: /model/,
    },
    {
      what: "array body",
      path: "/v1/requests",
      token: OPERATOR_TOKEN,
      body: [good],
      status: 400,
      error: /expected object/,
    },
    {
      what: "non-JSON",
      path: "/v1/requests",
      token: OPERATOR_TOKEN,
      raw: "{name: llama",
      status: 400,
      error: /not valid JSON/,
    },
    { what: "empty body", path: "/v1/requests", token: OPERATOR_TOKEN, raw: "", status: 400, error: /name/ },
    {
      what: "unknown queue",
      path: "/v1/clusters/alpha/queues/receive",
      token: a.credential,
      body: { queue: "gpu" },
      status: 400,
      error: /queue: .*"deploy"/,
    },
    {
      what: "too many messages",
      path: "/v1/clusters/alpha/queues/receive",
      token: a.credential,
      body: { queue: "deploy", maxMessages: 11 },
      status: 400,
      error: /maxMessages/,
    },
    {
      what: "wait too long",
      path: "/v1/clusters/alpha/queues/receive",
      token: a.credential,
      body: { queue: "deploy", waitSeconds: 21 },
      status: 400,
      error: /waitSeconds/,
    },
    {
      what: "negative count",
      path: "/v1/clusters/register",
      token: CLUSTER_TOKEN,
      body: { clusterId: "alpha", inventory: [{ gpuType: "H100", count: -1 }] },
      status: 400,
      error: /inventory\.0\.count/,
    },
    {
      what: "duplicate gpuType",
      path: "/v1/clusters/register",
      token: CLUSTER_TOKEN,
      body: {
        clusterId: "alpha",
        inventory: [
          { gpuType: "H100", count: 1 },
          { gpuType: "H100", count: 2 },
        ],
      },
      status: 400,
      error: /each gpuType may appear once/,
    },
    {
      what: "bad cluster id",
      path: "/v1/clusters/register",
      token: CLUSTER_TOKEN,
      body: { clusterId: "../etc", inventory: [] },
      status: 400,
      error: /clusterId/,
    },
    {
      what: "bad instruction",
      path: "/v1/clusters/alpha/instruction",
      token: OPERATOR_TOKEN,
      body: { instruction: "reboot" },
      status: 400,
      error: /instruction/,
    },
    {
      what: "bad phase",
      path: "/v1/requests/00000000-0000-4000-8000-000000000000/status",
      token: a.credential,
      body: { phase: "Dancing" },
      status: 400,
      error: /phase/,
    },
    {
      what: "empty ack",
      path: "/v1/clusters/alpha/queues/ack",
      token: a.credential,
      body: { receiptHandles: [] },
      status: 400,
      error: /receiptHandles/,
    },
  ];
  for (const c of cases) {
    const r = await call(h.cp.url, "POST", c.path, {
      token: c.token,
      ...(c.raw !== undefined ? { raw: c.raw } : { body: c.body }),
    });
    assert.equal(r.status, c.status, `${c.what}: ${JSON.stringify(r.body)}`);
    assert.match(String(r.body.error), c.error, c.what);
  }
  const issues = await call(h.cp.url, "POST", "/v1/requests", { ...op, body: { ...good, replicas: 0 } });
  assert.deepEqual(
    (issues.body.issues as { path: string }[]).map((i) => i.path),
    ["replicas"],
    "field-level issues come with the message",
  );

  const huge = await call(h.cp.url, "POST", "/v1/requests", {
    ...op,
    body: { ...good, args: Array.from({ length: 100 }, () => "x".repeat(1000)) },
  });
  assert.equal(huge.status, 413);
  assert.match(String(huge.body.error), /over the 65536-byte limit/);
  const veryHuge = await call(h.cp.url, "POST", "/v1/requests", { ...op, raw: "x".repeat(2 * 1024 * 1024) });
  assert.equal(veryHuge.status, 413);

  // No declared length (chunked): counted as it arrives.
  const chunked = await fetch(`${h.cp.url}/v1/requests`, {
    method: "POST",
    headers: { authorization: `Bearer ${OPERATOR_TOKEN}`, "content-type": "application/json" },
    body: new Blob(["[", "1,".repeat(100_000), "1]"]).stream(),
    duplex: "half",
  });
  assert.equal(chunked.status, 413);
  assert.equal(chunked.headers.get("content-length"), String(Buffer.byteLength(await chunked.text())));

  const form = await call(h.cp.url, "POST", "/v1/requests", {
    ...op,
    raw: "name=llama",
    contentType: "application/x-www-form-urlencoded",
  });
  assert.equal(form.status, 415);
  assert.match(String(form.body.error), /must be application\/json/);

  const badId = await call(h.cp.url, "GET", "/v1/requests/not-a-uuid", op);
  assert.equal(badId.status, 400);
  assert.match(String(badId.body.error), /invalid path: requestId/);
  const badStatusFilter = await call(h.cp.url, "GET", "/v1/requests?status=Sleeping", op);
  assert.equal(badStatusFilter.status, 400);
  const notFound = await call(h.cp.url, "GET", "/v1/requests/00000000-0000-4000-8000-000000000000", op);
  assert.equal(notFound.status, 404);
  const noRoute = await call(h.cp.url, "GET", "/v1/nothing", op);
  assert.equal(noRoute.status, 404);
  assert.match(String(noRoute.body.error), /no route/);
  const wrongMethod = await call(h.cp.url, "PUT", "/v1/requests", op);
  assert.equal(wrongMethod.status, 405);
  assert.match(wrongMethod.headers.get("allow") ?? "", /POST/);
  const unregistered = await call(h.cp.url, "POST", "/v1/clusters/ghost/instruction", {
    ...op,
    body: { instruction: "drain" },
  });
  assert.equal(unregistered.status, 404);

  const dup = await h.operator.submit(good);
  const clash = await call(h.cp.url, "POST", "/v1/requests", { ...op, body: good });
  assert.equal(clash.status, 409);
  assert.match(String(clash.body.error), new RegExp(`still active \\(${dup.id}\\)`));

  // Still serving after all of that.
  assert.deepEqual((await call(h.cp.url, "GET", "/healthz")).body, { status: "ok" });
});

void test("heartbeat returns the operator's instruction; cordon takes back undelivered work", async (t) => {
  const h = await startHarness(t);
  const a = await registerAgent(h.cp.url, "alpha", [{ gpuType: "H100", count: 4 }]);
  const hb = { inventory: [{ gpuType: "H100", count: 4 }], ready: true, paused: false };
  assert.deepEqual(await a.client.heartbeat("alpha", hb), { instruction: "none" });
  const before = (await h.operator.listClusters())[0];
  assert.equal(before?.ready, true);
  assert.ok(before?.lastHeartbeatAt, "the heartbeat is recorded");

  const { id } = await h.operator.submit({ name: "queued", model: "m", image: "i" });
  assert.equal((await h.operator.getRequest(id)).status, "Queued");

  const view = await h.operator.setInstruction("alpha", "cordon");
  assert.equal(view.instruction, "cordon");
  assert.equal(view.schedulable, false);
  assert.deepEqual(await a.client.heartbeat("alpha", { ...hb, paused: true }), { instruction: "cordon" });
  const pulled = await h.operator.getRequest(id);
  assert.equal(pulled.status, "Pending", "a cordoned cluster's undelivered request goes back to Pending");
  assert.equal(pulled.clusterId, null);
  assert.equal((await h.operator.listClusters())[0]?.paused, true);

  await h.operator.setInstruction("alpha", "drain");
  assert.deepEqual(await a.client.heartbeat("alpha", hb), { instruction: "drain" });

  await h.operator.setInstruction("alpha", "none");
  assert.deepEqual(await a.client.heartbeat("alpha", hb), { instruction: "none" });
  assert.equal(
    (await h.operator.getRequest(id)).status,
    "Queued",
    "queued again once the cluster takes work",
  );
  const got = await a.client.receive("alpha", { queue: "deploy" });
  assert.equal(got.messages[0]?.body.requestId, id);
});

void test("status reports update the request, only from the cluster it is assigned to", async (t) => {
  const h = await startHarness(t);
  const a = await registerAgent(h.cp.url, "alpha", [{ gpuType: "H100", count: 4 }]);
  const b = await registerAgent(h.cp.url, "beta", [{ gpuType: "A100", count: 4 }]);
  const { id } = await h.operator.submit({
    name: "llama",
    model: "m",
    image: "i",
    gpuType: "H100",
    replicas: 2,
  });
  const [msg] = (await a.client.receive("alpha", { queue: "deploy" })).messages;
  assert.ok(msg);
  await a.client.ack("alpha", [msg.receiptHandle]);
  assert.equal(
    (await h.operator.getRequest(id)).status,
    "Accepted",
    "acknowledging a deploy message accepts it",
  );

  const report = await a.client.reportStatus(id, {
    phase: "Running",
    message: "2/2 ready",
    instances: [
      { name: "llama-0", phase: "Running", ready: true },
      { name: "llama-1", phase: "Running", ready: true },
    ],
  });
  assert.equal(report.status, "Running");
  const seen = await h.operator.getRequest(id);
  assert.equal(seen.status, "Running");
  assert.equal(seen.message, "2/2 ready");
  assert.deepEqual(
    seen.instances.map((i) => i.name),
    ["llama-0", "llama-1"],
  );

  await assert.rejects(
    b.client.reportStatus(id, { phase: "Failed" }),
    (err: unknown) =>
      err instanceof ControlPlaneError &&
      err.status === 403 &&
      /not assigned to cluster beta/.test(err.message),
  );
  await assert.rejects(
    a.client.reportStatus("00000000-0000-4000-8000-000000000000", { phase: "Running" }),
    (err: unknown) => err instanceof ControlPlaneError && err.status === 404,
  );
  const listed = await h.operator.listRequests();
  assert.equal(listed.find((r) => r.id === id)?.status, "Running");
});

void test("the OpenAPI document lists every route, generated from the validating schemas", async (t) => {
  const h = await startHarness(t);
  const doc = (await (await fetch(`${h.cp.url}/openapi.json`)).json()) as {
    openapi: string;
    paths: Record<
      string,
      Record<string, { requestBody?: { content: Record<string, { schema: Record<string, unknown> }> } }>
    >;
  };
  assert.equal(doc.openapi, "3.1.0");
  const ops = Object.entries(doc.paths).flatMap(([p, m]) =>
    Object.keys(m).map((verb) => `${verb.toUpperCase()} ${p}`),
  );
  const expected = [
    "GET /healthz",
    "GET /metrics",
    "GET /openapi.json",
    "POST /v1/clusters/register",
    "POST /v1/clusters/{id}/credentials/renew",
    "POST /v1/clusters/{id}/heartbeat",
    "POST /v1/clusters/{id}/queues/receive",
    "POST /v1/clusters/{id}/queues/ack",
    "POST /v1/clusters/{id}/queues/release",
    "POST /v1/clusters/{id}/instruction",
    "POST /v1/requests/{requestId}/status",
    "POST /v1/requests",
    "GET /v1/requests",
    "GET /v1/requests/{requestId}",
    "DELETE /v1/requests/{requestId}",
    "GET /v1/clusters",
  ];
  assert.deepEqual([...ops].sort(), [...expected].sort());
  const submit = doc.paths["/v1/requests"]?.post?.requestBody?.content["application/json"]?.schema as {
    properties: Record<string, { pattern?: string; minimum?: number }>;
    required: string[];
  };
  assert.equal(submit.properties.name?.pattern, "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$");
  assert.equal(submit.properties.replicas?.minimum, 1);
  assert.deepEqual([...submit.required].sort(), ["image", "model", "name"]);
});

void test("metrics count calls by route and status and show queue depth per cluster", async (t) => {
  const h = await startHarness(t);
  const a = await registerAgent(h.cp.url, "alpha", [{ gpuType: "H100", count: 4 }]);
  await h.operator.submit({ name: "one", model: "m", image: "i" });
  await h.operator.submit({ name: "two", model: "m", image: "i" });
  await a.client.receive("alpha", { queue: "deploy" });
  await call(h.cp.url, "GET", "/v1/clusters");
  const text = await (await fetch(`${h.cp.url}/metrics`)).text();
  assert.match(
    text,
    /warmstart_control_plane_http_requests_total\{method="POST",route="\/v1\/requests",status="201"\} 2/,
  );
  assert.match(
    text,
    /warmstart_control_plane_http_requests_total\{method="GET",route="\/v1\/clusters",status="401"\} 1/,
  );
  assert.match(
    text,
    /warmstart_control_plane_queue_depth\{cluster="alpha",queue="deploy",state="visible"\} 1/,
  );
  assert.match(
    text,
    /warmstart_control_plane_queue_depth\{cluster="alpha",queue="deploy",state="inflight"\} 1/,
  );
  assert.match(text, /warmstart_control_plane_requests\{status="Queued"\} 2/);
});

void test("configuration is validated once at boot with a clear error", async () => {
  const { startControlPlane } = await import("./server.js");
  await assert.rejects(
    startControlPlane({ dbPath: "/tmp/unused.db", clusterTokens: [], operatorToken: OPERATOR_TOKEN }),
    /invalid control plane configuration: clusterTokens: at least one cluster token/,
  );
  await assert.rejects(
    startControlPlane({
      dbPath: "/tmp/unused.db",
      clusterTokens: [{ clusterId: "alpha", token: CLUSTER_TOKEN }],
      operatorToken: "short",
      credentialTtlSeconds: 0,
    }),
    /operatorToken: must be at least 16 characters.*credentialTtlSeconds/,
  );
  await assert.rejects(
    startControlPlane({
      dbPath: "/tmp/unused.db",
      clusterTokens: [{ clusterId: "alpha", token: CLUSTER_TOKEN }],
      operatorToken: CLUSTER_TOKEN,
    }),
    /operator token must differ/,
  );
  await assert.rejects(
    startControlPlane({
      dbPath: "/tmp/unused.db",
      clusterTokens: [
        { clusterId: "alpha", token: CLUSTER_TOKEN },
        { clusterId: "beta", token: CLUSTER_TOKEN },
      ],
      operatorToken: OPERATOR_TOKEN,
    }),
    /clusters alpha and beta share a token/,
  );
  await assert.rejects(
    startControlPlane({
      dbPath: "/tmp/unused.db",
      clusterTokens: [{ clusterId: "alpha", token: CLUSTER_TOKEN }],
      operatorToken: OPERATOR_TOKEN,
      tlsCertFile: "/tmp/cert.pem",
    }),
    /TLS needs both a certificate file and a key file/,
  );
  await assert.rejects(
    startControlPlane({
      dbPath: "/tmp/unused.db",
      clusterTokens: [{ clusterId: "alpha", token: CLUSTER_TOKEN }],
      operatorToken: OPERATOR_TOKEN,
      allowedNamespaces: ["Not_A_Namespace"],
    }),
    /allowedNamespaces/,
  );
});
