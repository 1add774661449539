/**
 * The server's HTTP side in-process: who may read it, what it says about itself, and what it never
 * publishes. The snapshot source stands in for the controller's caches (the integration test
 * server-api.test.ts runs it on the real caches).
 */
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { request } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Registry } from "prom-client";
import { KubeConfig } from "@kubernetes/client-node";
import { pino } from "pino";
import { apiServer, checkExposure, defaultServerConfig, isLoopback, runServer } from "./run.js";
import { DASHBOARD_CSP, DASHBOARD_HTML } from "./dashboard/dashboard.js";
import { buildSnapshot, type Snapshot } from "./dashboard/views.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import { listen } from "../common/http.js";

const TOKEN = "dashboard-token-for-tests-0001";
const HOLDER = "warmstart-leader-7f3a9c-pod-uid-0001";

const SNAPSHOT: Snapshot = {
  caches: [],
  stores: [],
  elections: [
    {
      hash: "0123456789abcdef",
      holder: HOLDER,
      leaderNamespace: "team-a",
      acquired: "2026-01-01T00:00:00.000Z",
      deadline: "2026-01-01T01:00:00.000Z",
      followers: 3,
    },
  ],
  pods: [],
  totals: { savedSeconds: 0, savedBytes: 0, restores: 0, caches: 0 },
};

async function serve(
  t: TestContext,
  o: { token?: string; host?: string; snapshot?: () => Snapshot | undefined } = {},
): Promise<string> {
  const host = o.host ?? "127.0.0.1";
  const srv = apiServer({
    host,
    token: o.token,
    registry: new Registry(),
    log: pino({ level: "silent" }),
    snapshot: o.snapshot ?? (() => SNAPSHOT),
  });
  const l = await listen(srv, { host, port: 0, role: "server" });
  t.after(() => l.close());
  return l.url;
}

/** A raw GET, so the Host header can be anything (fetch does not let a caller set it). */
function get(
  url: string,
  headers: Record<string, string> = {},
): Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { headers }, (res) => {
      let body = "";
      res.on("data", (d: Buffer) => (body += d.toString()));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body }));
    });
    req.on("error", reject);
    req.end();
  });
}

void test("loopback by default; off loopback it refuses to start without a token", async () => {
  const cfg = await defaultServerConfig({}, {});
  assert.equal(cfg.host, "127.0.0.1");
  assert.equal(cfg.token, undefined);
  for (const host of ["0.0.0.0", "::", "10.0.0.5"]) {
    await assert.rejects(defaultServerConfig({ host }, {}), /refusing to serve the dashboard and API on/);
    assert.throws(() => checkExposure({ host }), /without a token/);
  }
  // runServer checks before it talks to any cluster.
  await assert.rejects(
    runServer({ host: "0.0.0.0", port: 0, systemNamespace: "x" }),
    /refusing to serve the dashboard and API on 0\.0\.0\.0 without a token/,
  );
  const withEnv = await defaultServerConfig({ host: "0.0.0.0" }, { WARMSTART_SERVER_TOKEN: TOKEN });
  assert.equal(withEnv.token, TOKEN);
  await assert.rejects(defaultServerConfig({ token: "short" }, {}), /at least 16 characters/);
  assert.ok(isLoopback("127.0.0.1") && isLoopback("::1") && isLoopback("[::1]") && isLoopback("localhost"));
  assert.ok(!isLoopback("0.0.0.0") && !isLoopback("::") && !isLoopback("192.168.1.1"));
});

void test("the token can come from a file", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "warmstart-server-token-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await writeFile(join(dir, "token"), `${TOKEN}\n`, { mode: 0o600 });
  const cfg = await defaultServerConfig({ host: "0.0.0.0", tokenFile: join(dir, "token") }, {});
  assert.equal(cfg.token, TOKEN);
});

void test("with a token: data and metrics answer 401 without it, 200 with it; probes and the empty page stay open", async (t) => {
  const url = await serve(t, { token: TOKEN });
  for (const path of ["/api/snapshot", "/metrics"]) {
    const none = await get(`${url}${path}`);
    assert.equal(none.status, 401, path);
    assert.match(String(none.headers["www-authenticate"]), /^Bearer/);
    assert.ok(!none.body.includes("team-a"));
    assert.equal((await get(`${url}${path}`, { authorization: "Bearer not-the-token-000000" })).status, 401);
    assert.equal((await get(`${url}${path}`, { authorization: `Basic ${TOKEN}` })).status, 401);
    assert.equal((await get(`${url}${path}`, { authorization: `Bearer ${TOKEN}` })).status, 200, path);
  }
  assert.equal((await get(`${url}/healthz`)).status, 200);
  const page = await get(`${url}/`);
  assert.equal(page.status, 200);
  assert.ok(!page.body.includes("team-a"), "the page itself holds no data");
});

void test("security headers on every answer; API answers are never stored", async (t) => {
  const url = await serve(t, { token: TOKEN });
  const auth = { authorization: `Bearer ${TOKEN}` };
  for (const [path, headers] of [
    ["/api/snapshot", auth],
    ["/api/snapshot", {}],
    ["/metrics", auth],
    ["/nope", {}],
    ["/", {}],
  ] as const) {
    const r = await get(`${url}${path}`, headers);
    assert.equal(r.headers["x-content-type-options"], "nosniff", path);
    assert.equal(r.headers["x-frame-options"], "DENY", path);
    assert.equal(r.headers["referrer-policy"], "no-referrer", path);
    assert.match(String(r.headers["content-security-policy"]), /frame-ancestors 'none'/, path);
    if (path !== "/") assert.equal(r.headers["cache-control"], "no-store", path);
  }
  // The page's policy allows exactly its own inline script and style.
  const page = await get(`${url}/`);
  assert.equal(page.headers["content-security-policy"], DASHBOARD_CSP);
  const script = /<script>([\s\S]*?)<\/script>/.exec(DASHBOARD_HTML)![1]!;
  const hash = createHash("sha256").update(script).digest("base64");
  assert.ok(DASHBOARD_CSP.includes(`script-src 'sha256-${hash}'`));
  assert.match(DASHBOARD_CSP, /default-src 'none'/);
  assert.ok(!DASHBOARD_CSP.includes("unsafe-inline"));
});

void test("the API never publishes an election's holder id", async (t) => {
  for (const token of [undefined, TOKEN]) {
    const url = await serve(t, { token });
    const r = await get(`${url}/api/snapshot`, token ? { authorization: `Bearer ${token}` } : {});
    assert.equal(r.status, 200);
    assert.ok(!r.body.includes(HOLDER), "no holder id");
    const body = JSON.parse(r.body) as Snapshot;
    assert.equal(body.elections[0]?.hash, "0123456789abcdef");
    assert.equal(body.elections[0]?.followers, 3);
    assert.deepEqual(Object.keys(body.elections[0] ?? {}).includes("holder"), false);
  }
});

void test("on loopback without a token: open to this machine's names only (no DNS rebinding)", async (t) => {
  const url = await serve(t);
  const port = new URL(url).port;
  assert.equal((await get(`${url}/api/snapshot`)).status, 200);
  assert.equal((await get(`${url}/api/snapshot`, { host: `localhost:${port}` })).status, 200);
  const rebound = await get(`${url}/api/snapshot`, { host: `attacker.example:${port}` });
  assert.equal(rebound.status, 403);
  assert.ok(!rebound.body.includes("team-a"));
  assert.equal((await get(`${url}/`, { host: "attacker.example" })).status, 403);
});

void test("before the caches have listed the API says so instead of showing an empty cluster", async (t) => {
  const url = await serve(t, { snapshot: () => undefined });
  const r = await get(`${url}/api/snapshot`);
  assert.equal(r.status, 503);
  assert.equal(r.headers["retry-after"], "1");
  assert.match(r.body, /warming up/);
});

void test("a cache record holding a model URL with credentials is shown redacted", () => {
  const s = buildSnapshot(
    [
      {
        apiVersion: "warmstart.dev/v1alpha1",
        kind: "ModelCache",
        metadata: { name: "0123456789abcdef" },
        spec: { model: "https://user:hf_s3cret@hub.example.com/org/m" },
      } as ModelCacheObject,
    ],
    [],
    [],
  );
  assert.equal(s.caches[0]?.model, "https://<redacted>@hub.example.com/org/m");
});

void test("a server that cannot listen stops the controller it started", async (t) => {
  const busy = await listen(
    apiServer({
      host: "127.0.0.1",
      registry: new Registry(),
      log: pino({ level: "silent" }),
      snapshot: () => SNAPSHOT,
    }),
    { host: "127.0.0.1", port: 0, role: "server" },
  );
  t.after(() => busy.close());
  // A cluster that refuses every connection: the controller's watches fail and retry, its resync ticks.
  const kc = new KubeConfig();
  kc.loadFromOptions({
    clusters: [{ name: "c", server: "https://127.0.0.1:1", skipTLSVerify: true }],
    users: [{ name: "u" }],
    contexts: [{ name: "x", cluster: "c", user: "u" }],
    currentContext: "x",
  });
  const timers = (): number => process.getActiveResourcesInfo().filter((r) => r === "Timeout").length;
  const before = timers();
  await assert.rejects(
    runServer(
      { host: "127.0.0.1", port: Number(new URL(busy.url).port), systemNamespace: "x" },
      { kubeConfig: kc, log: pino({ level: "silent" }) },
    ),
    /server cannot listen/,
  );
  // What the failed calls left settles (their retries back off for up to a few seconds); a
  // running controller would keep its timers for good.
  for (let i = 0; i < 50 && timers() > before; i++) await new Promise((r) => setTimeout(r, 100));
  assert.equal(timers(), before, "no timer of the controller is left");
});
