import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { createServer, type RequestListener } from "node:http";
import type { AddressInfo } from "node:net";
import { ControlPlaneClient, ControlPlaneError, type AuthKind } from "./client.js";
import { CLUSTER_TOKEN, OPERATOR_TOKEN, startHarness } from "../../test/support/control-plane.js";

/** A real HTTP server that answers like a broken or overloaded control plane would. */
async function upstream(t: TestContext, handler: RequestListener): Promise<string> {
  const srv = createServer(handler);
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", r));
  t.after(() => new Promise<void>((r) => srv.close(() => r())));
  return `http://127.0.0.1:${(srv.address() as AddressInfo).port}`;
}

const isError =
  (status: number, retryable: boolean, message?: RegExp) =>
  (err: unknown): boolean =>
    err instanceof ControlPlaneError &&
    err.status === status &&
    err.retryable === retryable &&
    (message === undefined || message.test(err.message));

void test("errors carry the status, the server's message and whether to retry", async (t) => {
  const h = await startHarness(t);
  const bad = new ControlPlaneClient({ baseUrl: h.cp.url, token: "wrong-token" });
  await assert.rejects(bad.listClusters(), isError(401, false, /401 unknown token/));
  await assert.rejects(
    h.operator.submit({ name: "Not_Valid", model: "m", image: "i" }),
    isError(400, false, /name: must be a DNS-1123 label/),
  );

  const overloaded = await upstream(t, (req, res) => {
    const status = req.url?.includes("clusters") ? 503 : 429;
    res.writeHead(status, { "content-type": "application/json" });
    res.end(JSON.stringify({ error: status === 503 ? "database locked" : "slow down" }));
  });
  const c = new ControlPlaneClient({ baseUrl: overloaded, token: OPERATOR_TOKEN });
  await assert.rejects(c.listClusters(), isError(503, true, /database locked/));
  await assert.rejects(c.listRequests(), isError(429, true, /slow down/));

  const garbled = await upstream(t, (_req, res) => {
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify({ clusters: [{ clusterId: 42 }] }));
  });
  await assert.rejects(
    new ControlPlaneClient({ baseUrl: garbled, token: OPERATOR_TOKEN }).listClusters(),
    isError(200, false, /unexpected response/),
  );

  // Nothing listening (the control plane was stopped): a network error, retryable, status 0.
  await h.cp.close();
  const dead = new ControlPlaneClient({ baseUrl: h.cp.url, token: OPERATOR_TOKEN });
  await assert.rejects(dead.listClusters(), isError(0, true, /failed/));

  // A server that never answers: the client's own timeout, retryable.
  const stuck = await upstream(t, () => undefined);
  const slow = new ControlPlaneClient({ baseUrl: stuck, token: OPERATOR_TOKEN, timeoutMs: 200 });
  await assert.rejects(slow.listClusters(), isError(0, true, /timed out/));
});

void test("the token supplier is asked per call with the kind of token the call needs", async (t) => {
  const h = await startHarness(t);
  const asked: AuthKind[] = [];
  let credential: string | undefined;
  const client = new ControlPlaneClient({
    baseUrl: `${h.cp.url}/`,
    // Async, as a supplier that reads a Secret would be.
    token: (kind) => {
      asked.push(kind);
      return Promise.resolve(kind === "cluster" ? CLUSTER_TOKEN : credential);
    },
  });
  // No credential yet: refused before any request is made.
  await assert.rejects(
    client.heartbeat("alpha", { inventory: [], ready: false, paused: true }),
    isError(401, false, /no queue token/),
  );
  const reg = await client.register({ clusterId: "alpha", inventory: [{ gpuType: "H100", count: 2 }] });
  credential = reg.credentials.token;
  const renewed = await client.renew("alpha");
  credential = renewed.credentials.token;
  assert.deepEqual(await client.heartbeat("alpha", { inventory: [], ready: false, paused: true }), {
    instruction: "none",
  });
  assert.deepEqual(asked, ["queue", "cluster", "queue", "queue"]);
});
