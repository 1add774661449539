import assert from "node:assert/strict";
import { test } from "node:test";
import { UnsupportedBackendError, isNamespaceGone } from "./claims.js";
import { describeFailures, retry } from "./promote.js";

void test("retry: fails twice, then succeeds on the third attempt after growing waits", async () => {
  const waits: number[] = [];
  let calls = 0;
  const v = await retry(
    (attempt) => {
      calls++;
      assert.equal(attempt, calls);
      return attempt < 3 ? Promise.reject(new Error(`transient ${attempt}`)) : Promise.resolve("ok");
    },
    { attempts: 5, initialMs: 1, maxMs: 100, onRetry: (_a, _e, d) => waits.push(d) },
  );
  assert.equal(v, "ok");
  assert.equal(calls, 3);
  assert.deepEqual(waits, [1, 2]);
});

void test("retry: gives up after the last attempt with the last error, waits capped", async () => {
  const waits: number[] = [];
  let calls = 0;
  await assert.rejects(
    retry(
      (attempt) => {
        calls++;
        return Promise.reject(new Error(`refused ${attempt}`));
      },
      { attempts: 4, initialMs: 1, maxMs: 2, onRetry: (_a, _e, d) => waits.push(d) },
    ),
    /refused 4/,
  );
  assert.equal(calls, 4);
  assert.deepEqual(waits, [1, 2, 2]);
});

void test("retry: an error no retry can fix ends the loop at once", async () => {
  let calls = 0;
  await assert.rejects(
    retry(
      () => {
        calls++;
        return Promise.reject(new UnsupportedBackendError("per-pod clones"));
      },
      { attempts: 5, initialMs: 1, maxMs: 1, retryable: (e) => !(e instanceof UnsupportedBackendError) },
    ),
    UnsupportedBackendError,
  );
  assert.equal(calls, 1);
});

void test("retry: an abort stops the wait between attempts", async () => {
  const ac = new AbortController();
  let calls = 0;
  const p = retry(
    () => {
      calls++;
      return Promise.reject(new Error("down"));
    },
    { attempts: 10, initialMs: 10_000, maxMs: 10_000, signal: ac.signal },
  );
  setTimeout(() => ac.abort(), 20);
  const started = Date.now();
  await assert.rejects(p);
  assert.ok(Date.now() - started < 5_000, "did not sit out the 10 s wait");
  assert.equal(calls, 1);
});

void test("a terminating or missing namespace is told apart from other refusals", () => {
  const err = (code: number, message: string): unknown => ({ code, body: JSON.stringify({ message, code }) });
  assert.equal(
    isNamespaceGone(
      err(
        403,
        'persistentvolumeclaims "rox-x" is forbidden: unable to create new content in namespace t-1 because it is being terminated',
      ),
      "t-1",
    ),
    true,
  );
  assert.equal(isNamespaceGone(err(404, 'namespaces "t-1" not found'), "t-1"), true);
  assert.equal(isNamespaceGone(err(404, 'namespaces "t-2" not found'), "t-1"), false);
  assert.equal(isNamespaceGone(err(403, "forbidden: RBAC says no"), "t-1"), false);
  assert.equal(isNamespaceGone(err(500, "etcd timeout"), "t-1"), false);
});

void test("the failure summary names each namespace that still lacks its claim", () => {
  const s = describeFailures({
    ok: false,
    namespaces: ["a"],
    results: [
      { namespace: "a", outcome: "created", attempts: 1 },
      { namespace: "b", attempts: 5, error: "creating claim b/rox-x: 500 InternalError boom" },
    ],
  });
  assert.equal(s, "claim in b failed after 5 attempt(s): creating claim b/rox-x: 500 InternalError boom");
});
