import assert from "node:assert/strict";
import { test, type TestContext } from "node:test";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { ApiError } from "./errors.js";
import { Store } from "./store.js";

async function tempDb(t: TestContext): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "warmstart-store-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  return join(dir, "control-plane.db");
}

function open(t: TestContext, path: string, woken: string[] = []): Store {
  const store = new Store({ path, onMessages: (c, q) => void woken.push(`${c}/${q}`) });
  t.after(() => store.close());
  return store;
}

const isApiError =
  (status: number, message: RegExp) =>
  (err: unknown): boolean =>
    err instanceof ApiError && err.status === status && message.test(err.message);

void test("a schema 1 database is migrated on open: clusters gain their namespaces", async (t) => {
  const path = await tempDb(t);
  const v1 = new Database(path);
  v1.exec(`
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    INSERT INTO meta (key, value) VALUES ('schema', '1');
    CREATE TABLE clusters (
      id TEXT PRIMARY KEY, name TEXT, agent_version TEXT, inventory TEXT NOT NULL,
      ready INTEGER NOT NULL DEFAULT 0, paused INTEGER NOT NULL DEFAULT 0,
      instruction TEXT NOT NULL DEFAULT 'none', registered_at INTEGER NOT NULL,
      updated_at INTEGER NOT NULL, last_heartbeat_at INTEGER
    );
    INSERT INTO clusters (id, inventory, registered_at, updated_at)
      VALUES ('old', '[{"gpuType":"H100","count":2}]', 1, 1);
  `);
  v1.close();

  const store = open(t, path);
  const [old] = store.listClusters();
  assert.equal(old?.clusterId, "old");
  assert.equal(old?.namespaces, null, "a cluster registered before namespaces deploys anywhere");
  store.register({ clusterId: "old", inventory: [{ gpuType: "H100", count: 2 }], namespaces: ["b", "a"] });
  assert.deepEqual(store.getCluster("old").namespaces, ["a", "b"]);
  store.close();

  const db = new Database(path, { readonly: true });
  const row = db.prepare("SELECT value FROM meta WHERE key = 'schema'").get() as { value: string };
  db.close();
  assert.equal(row.value, "2");
});

void test("a database of a newer schema is refused with a clear error, and left as it is", async (t) => {
  const path = await tempDb(t);
  open(t, path).close();
  const db = new Database(path);
  db.prepare("UPDATE meta SET value = '99' WHERE key = 'schema'").run();
  db.close();
  assert.throws(
    () => new Store({ path }),
    /cannot open control plane database .*: database schema 99 is newer than this control plane understands \(2\)/,
  );
  const after = new Database(path, { readonly: true });
  const row = after.prepare("SELECT value FROM meta WHERE key = 'schema'").get() as { value: string };
  after.close();
  assert.equal(row.value, "99");
});

void test("re-registering without a namespace takes back the undelivered requests placed there", async (t) => {
  const woken: string[] = [];
  const store = open(t, await tempDb(t), woken);
  const inventory = [{ gpuType: "H100", count: 8 }];
  store.register({ clusterId: "alpha", inventory, namespaces: ["serving", "team-a"] });
  const a = store.submit({ name: "a", namespace: "team-a", model: "m", image: "i", gpus: 1, replicas: 1 });
  const s = store.submit({ name: "s", namespace: "serving", model: "m", image: "i", gpus: 1, replicas: 1 });
  assert.equal(store.getRequest(a.id).status, "Queued");
  assert.deepEqual(woken, ["alpha/deploy", "alpha/deploy"], "each enqueue wakes the queue after its commit");

  store.register({ clusterId: "alpha", inventory, namespaces: ["serving"] });
  const back = store.getRequest(a.id);
  assert.equal(back.status, "Pending");
  assert.equal(back.clusterId, null);
  assert.match(back.message ?? "", /that deploys into namespace team-a/);
  assert.equal(
    store.getRequest(s.id).status,
    "Queued",
    "a request in a namespace it still deploys into stays",
  );
  assert.deepEqual(
    store
      .receive("alpha", "deploy", { maxMessages: 10, visibilityTimeoutSeconds: 30 })
      .messages.map((m) => m.body.requestId),
    [s.id],
  );
});

void test("requests: filtered by status, 404 for unknown ones, and Terminated is final", async (t) => {
  const store = open(t, await tempDb(t));
  store.register({ clusterId: "alpha", inventory: [{ gpuType: "H100", count: 1 }] });
  const placed = store.submit({
    name: "one",
    namespace: "serving",
    model: "m",
    image: "i",
    gpus: 1,
    replicas: 1,
  });
  const waiting = store.submit({
    name: "two",
    namespace: "serving",
    model: "m",
    image: "i",
    gpus: 1,
    replicas: 1,
  });
  assert.deepEqual(
    store.listRequests("Pending").map((r) => r.id),
    [waiting.id],
  );
  assert.deepEqual(
    store.listRequests("Queued").map((r) => r.id),
    [placed.id],
  );
  assert.equal(store.listRequests().length, 2);
  assert.throws(() => store.getRequest("nope"), isApiError(404, /request nope not found/));
  assert.throws(() => store.terminate("nope"), isApiError(404, /request nope not found/));
  assert.throws(
    () => store.reportStatus("alpha", "nope", { phase: "Running", instances: [] }),
    isApiError(404, /request nope not found/),
  );
  assert.throws(() => store.getCluster("nope"), isApiError(404, /cluster nope is not registered/));
  assert.equal(store.hasCluster("alpha"), true);
  assert.equal(store.hasCluster("nope"), false);

  const [msg] = store.receive("alpha", "deploy", { maxMessages: 1, visibilityTimeoutSeconds: 30 }).messages;
  store.ack("alpha", [msg!.receiptHandle]);
  store.reportStatus("alpha", placed.id, { phase: "Running", instances: [] });
  assert.equal(store.terminate(placed.id).status, "Terminating");
  store.reportStatus("alpha", placed.id, { phase: "Terminated", instances: [] });
  assert.equal(store.getRequest(placed.id).status, "Terminated");
  assert.equal(store.getRequest(waiting.id).status, "Queued", "the freed GPU goes to the waiting request");
  // A late report from the cluster does not bring a Terminated request back.
  store.reportStatus("alpha", placed.id, { phase: "Running", message: "late", instances: [] });
  assert.equal(store.getRequest(placed.id).status, "Terminated");
  assert.deepEqual(
    store.requestCounts().sort((x, y) => x.status.localeCompare(y.status)),
    [
      { status: "Queued", n: 1 },
      { status: "Terminated", n: 1 },
    ],
  );
});

void test("a receive tells when to look again from the instant it looked: a message due just after is waited for", async (t) => {
  // Every reading of this clock is 1 ms later than the one before, as a loaded machine's may be.
  let clock = 1_000_000;
  const store = new Store({ path: await tempDb(t), now: () => clock++ });
  t.after(() => store.close());
  store.register({ clusterId: "alpha", inventory: [{ gpuType: "H100", count: 1 }] });
  store.submit({ name: "one", namespace: "serving", model: "m", image: "i", gpus: 1, replicas: 1 });
  const [msg] = store.receive("alpha", "deploy", { maxMessages: 1, visibilityTimeoutSeconds: 30 }).messages;
  assert.ok(msg);
  clock = 2_000_000;
  store.release("alpha", msg.receiptHandle, 1); // visible again at 2,001,000
  // The receive looks 1 ms before the message is due; the clock has reached it by the next reading.
  clock = 2_000_999;
  const looked = store.receive("alpha", "deploy", { maxMessages: 1, visibilityTimeoutSeconds: 30 });
  assert.deepEqual(looked.messages, []);
  assert.equal(looked.nextVisibleAt, 2_001_000, "the long poll waits for the message, not its deadline");
  clock = 2_001_000;
  assert.equal(
    store.receive("alpha", "deploy", { maxMessages: 1, visibilityTimeoutSeconds: 30 }).messages[0]?.messageId,
    msg.messageId,
  );
});
