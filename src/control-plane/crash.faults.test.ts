/**
 * The control plane killed (SIGKILL) mid-commit: the real `warmstart control-plane` process, under
 * a burst of concurrent submits, receives, acknowledgements, status reports and terminations,
 * dies at a chosen point of one transaction (test/sqlite-crash.ts), and is started again on the
 * same database. Expected end, every time: every submit answered 201 is there exactly once, no
 * acknowledged message comes back, no request is delivered to two clusters, the transaction that
 * was cut short left nothing behind (or, cut after its commit, everything), the queues drain,
 * and the database passes its own checks and the queue's invariants.
 */
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { ControlPlaneClient } from "./client.js";
import type { RequestStatus } from "./api.js";
import { ControlPlaneProcess, clusterTokenOf } from "../../test/control-plane-process.js";
import { Seen, consume } from "../../test/queue-consumer.js";
import type { CrashMarker, CrashPoint } from "../../test/sqlite-crash.js";

const NAMESPACE = "faults";
const VISIBILITY_S = 2;

async function register(cp: ControlPlaneProcess, clusterId: string, gpuType: string): Promise<string> {
  await cp.allow(clusterId);
  const c = new ControlPlaneClient({ baseUrl: cp.url, token: clusterTokenOf(clusterId), timeoutMs: 10_000 });
  const r = await c.register({ clusterId, inventory: [{ gpuType, count: 10_000 }], agentVersion: "faults" });
  return r.credentials.token;
}

/** Waves of concurrent submits (every fourth one terminated as soon as it is answered) until `until` settles. */
async function burst(
  cp: ControlPlaneProcess,
  seen: Seen,
  until: Promise<unknown>,
  onWave: (n: number) => Promise<void>,
): Promise<void> {
  const operator = cp.operator();
  let over = false;
  void until.finally(() => (over = true)).catch(() => undefined);
  for (let wave = 0; wave < 8 && !over; wave++) {
    await Promise.allSettled(
      Array.from({ length: 24 }, async (_, i) => {
        const name = `r-${wave}-${i}`;
        try {
          const r = await operator.submit({
            name,
            namespace: NAMESPACE,
            model: "org/model",
            image: "img:1",
            gpus: 1,
            replicas: 1,
            gpuType: i % 2 === 0 ? "A" : "B",
          });
          seen.accepted.set(name, r.id);
          if (i % 4 === 3) await operator.terminate(r.id).catch(() => undefined);
        } catch {
          seen.unanswered.add(name);
        }
      }),
    );
    await onWave(wave);
    await sleep(150);
  }
}

interface Row {
  id: string;
  name: string;
  status: RequestStatus;
}

interface Case {
  name: string;
  point: Omit<CrashPoint, "marker">;
  /**
   * What the transaction that was cut short must (not) have left, checked before the restart;
   * returns the request it was about, for `finally`.
   */
  check(cp: ControlPlaneProcess, m: CrashMarker, seen: Seen): string | void;
  /** After the queues drained. */
  finally?(cp: ControlPlaneProcess, requestId: string, seen: Seen, restartedAt: number): void;
}

const requestById = (cp: ControlPlaneProcess, id: string): Row | undefined =>
  cp.read(
    (db) => db.prepare("SELECT id, name, status FROM requests WHERE id = ?").get(id) as Row | undefined,
  );
const messageById = (cp: ControlPlaneProcess, id: string): unknown =>
  cp.read((db) => db.prepare("SELECT id FROM messages WHERE id = ?").get(id));

function deliveredAgain(cp: ControlPlaneProcess, id: string, seen: Seen, restartedAt: number): void {
  // Unless a termination withdrew it first (every fourth request is terminated).
  if (requestById(cp, id)?.status === "Terminated") return;
  assert.ok(
    seen.deliveries.some((d) => d.requestId === id && d.at >= restartedAt),
    "delivered again after the restart",
  );
}

const CASES: Case[] = [
  {
    name: "a submit cut after its request row, before its queue message: no request",
    point: { statement: "INSERT INTO requests", nth: 30, at: "in-transaction" },
    check(cp, m, seen) {
      const [id, name] = m.params as [string, string];
      assert.equal(requestById(cp, id), undefined, "the cut submit left no request");
      assert.ok(seen.unanswered.has(name) && !seen.accepted.has(name), "and its caller got no 201");
    },
  },
  {
    name: "a submit cut after its queue message, before the commit: no request, no message",
    point: { statement: "INSERT INTO messages", nth: 30, at: "in-transaction" },
    check(cp, m) {
      const [messageId, , queue, , requestId] = m.params as string[];
      assert.equal(messageById(cp, messageId!), undefined, "no message");
      if (queue === "deploy") assert.equal(requestById(cp, requestId!), undefined, "no request");
    },
  },
  {
    name: "a submit committed but never answered: the request is there once and is delivered",
    point: { statement: "INSERT INTO requests", nth: 30, at: "after-commit" },
    check(cp, m, seen) {
      const [id, name] = m.params as [string, string];
      assert.equal(requestById(cp, id)?.name, name, "committed before the crash");
      assert.ok(!seen.accepted.has(name), "though its caller never heard");
    },
  },
  {
    name: "an acknowledgement cut after deleting the message, before the request is Accepted: the message is back",
    point: { statement: "UPDATE requests SET status = 'Accepted'", nth: 30, at: "in-transaction" },
    check(cp, m, seen) {
      const id = (m.params as string[])[1]!;
      assert.equal(requestById(cp, id)?.status, "Queued", "still Queued");
      assert.equal(
        cp.read(
          (db) =>
            (
              db
                .prepare("SELECT COUNT(*) AS n FROM messages WHERE request_id = ? AND queue = 'deploy'")
                .get(id) as { n: number }
            ).n,
        ),
        1,
        "its message was not deleted",
      );
      assert.ok(!seen.acked.has(id));
      return id;
    },
    finally: deliveredAgain,
  },
  {
    name: "an acknowledgement committed but never answered: never delivered again",
    point: { statement: "UPDATE requests SET status = 'Accepted'", nth: 30, at: "after-commit" },
    check(cp, m) {
      const id = (m.params as string[])[1]!;
      assert.equal(requestById(cp, id)?.status, "Accepted");
      return id;
    },
    finally(_cp, id, seen, restartedAt) {
      assert.deepEqual(
        seen.deliveries.filter((d) => d.requestId === id && d.at >= restartedAt),
        [],
        "an acknowledgement that committed is final, answered or not",
      );
    },
  },
  {
    name: "a receive committed but never answered: its messages come back after their visibility timeout",
    point: { statement: "UPDATE messages SET receipt", nth: 30, at: "after-commit" },
    check(cp, m) {
      const id = (m.params as string[])[2]!;
      const row = cp.read(
        (db) =>
          db.prepare("SELECT receive_count, request_id FROM messages WHERE id = ?").get(id) as
            { receive_count: number; request_id: string } | undefined,
      );
      assert.ok(row && row.receive_count >= 1, "marked as delivered, though nobody got it");
      return row.request_id;
    },
    finally: deliveredAgain,
  },
  {
    name: "a status report cut mid-write: the request keeps its earlier status",
    point: {
      statement: "UPDATE requests SET status = ?, message = ?, instances = ?",
      nth: 15,
      at: "in-transaction",
    },
    check(cp, m) {
      const [status, message, instances, updatedAt, id] = m.params as [
        string,
        string | null,
        string,
        number,
        string,
      ];
      const row = cp.read(
        (db) =>
          db.prepare("SELECT status, message, instances, updated_at FROM requests WHERE id = ?").get(id) as
            { status: string; message: string | null; instances: string; updated_at: number } | undefined,
      );
      assert.ok(row, "the request is there");
      assert.notDeepEqual(
        [row.status, row.message, row.instances, row.updated_at],
        [status, message, instances, updatedAt],
        "the report that was cut short left the request as it was",
      );
    },
  },
  {
    name: "a termination cut after marking the request Terminating, before its message: not terminating",
    point: { statement: "UPDATE requests SET status = 'Terminating'", nth: 8, at: "in-transaction" },
    check(cp, m) {
      const id = (m.params as string[])[1]!;
      assert.notEqual(requestById(cp, id)?.status, "Terminating");
    },
  },
  {
    name: "a registration cut while issuing its credential: no cluster without credentials",
    // Credentials 1 and 2 are clusters c1 and c2; the third is c3, registered during the burst.
    point: { statement: "INSERT INTO credentials", nth: 3, at: "in-transaction" },
    check(cp) {
      const c3 = cp.read((db) => db.prepare("SELECT id FROM clusters WHERE id = 'c3'").get());
      assert.equal(c3, undefined, "the registration is undone with its credential");
    },
  },
];

async function run(t: TestContext, c: Case): Promise<void> {
  const cp = await ControlPlaneProcess.create(t, { visibilityTimeoutSeconds: VISIBILITY_S });
  await cp.start(c.point);
  const seen = new Seen();
  const consumers = [
    consume(cp.url, "c1", await register(cp, "c1", "A"), "A", seen, VISIBILITY_S),
    consume(cp.url, "c2", await register(cp, "c2", "B"), "B", seen, VISIBILITY_S),
  ];
  t.after(() => Promise.all(consumers.map((x) => x.stop())));
  const crashed = cp.crashed(60_000);
  await burst(cp, seen, crashed, async (wave) => {
    // A cluster registering in the middle of it all (GPU type C: no request goes there).
    if (wave === 0) await register(cp, "c3", "C").catch(() => undefined);
  });
  const marker = await crashed;
  t.diagnostic(`crashed at ${marker.at} of "${marker.statement.replace(/\s+/g, " ").slice(0, 80)}"`);
  assert.deepEqual(cp.consistencyProblems(), [], "consistent right after the crash");
  const about = c.check(cp, marker, seen);

  const restartedAt = Date.now();
  await cp.start();
  const operator = cp.operator();
  // Every request settles: delivered and acknowledged, or terminated; both queues empty. (Accepted
  // counts: an acknowledgement that committed unanswered is never followed by a report.)
  await (async () => {
    const deadline = Date.now() + 30_000;
    for (;;) {
      const requests = await operator.listRequests();
      const open = requests.filter((r) => !["Accepted", "Running", "Terminated"].includes(r.status));
      const messages = cp.read(
        (db) => (db.prepare("SELECT COUNT(*) AS n FROM messages").get() as { n: number }).n,
      );
      if (open.length === 0 && messages === 0) return;
      if (Date.now() > deadline)
        assert.fail(
          `not drained: ${messages} messages; ${open.map((r) => `${r.name}=${r.status}`).join(", ")}`,
        );
      await sleep(200);
    }
  })();
  await Promise.all(consumers.map((x) => x.stop()));

  assert.deepEqual(cp.consistencyProblems(), [], "consistent after the queues drained");
  const rows = cp.read((db) => db.prepare("SELECT id, name, status FROM requests").all() as Row[]);
  const byName = new Map<string, Row[]>();
  for (const r of rows) byName.set(r.name, [...(byName.get(r.name) ?? []), r]);
  for (const [name, id] of seen.accepted)
    assert.deepEqual(
      byName.get(name)?.map((r) => r.id),
      [id],
      `${name}: answered 201, there exactly once`,
    );
  for (const name of seen.unanswered)
    assert.ok((byName.get(name)?.length ?? 0) <= 1, `${name}: at most once`);
  for (const id of seen.acked)
    assert.ok(
      ["Accepted", "Running", "Terminating", "Terminated"].includes(
        rows.find((r) => r.id === id)?.status ?? "",
      ),
      `${id}: acknowledged, so it stays past Queued`,
    );
  assert.deepEqual(seen.afterAck, [], "no acknowledged message was delivered again");
  const twice = [...seen.deliveredTo].filter(([, to]) => to.size > 1);
  assert.deepEqual(twice, [], "no request delivered to two clusters");
  if (c.finally) {
    assert.ok(about, "the case named its request");
    c.finally(cp, about, seen, restartedAt);
  }
  assert.ok(
    seen.accepted.size >= 10 && seen.acked.size >= 5,
    `a real burst ran (${seen.accepted.size} submits answered, ${seen.acked.size} acknowledged)`,
  );
  t.diagnostic(
    `${seen.accepted.size} submits answered, ${seen.unanswered.size} not; ${seen.acked.size} acknowledged; ${seen.deliveries.length} deliveries`,
  );
  assert.equal(await cp.stop(), 0, "a clean stop after the restart");
}

for (const c of CASES) void test(`control plane killed mid-commit: ${c.name}`, (t) => run(t, c));
