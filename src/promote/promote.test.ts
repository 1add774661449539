import assert from "node:assert/strict";
import { test } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { pino } from "pino";
import { CLUSTER_SCOPE_KEY } from "../core/scope.js";
import {
  UnsupportedBackendError,
  isNamespaceGone,
  type CreatedObject,
  type PromoteClients,
} from "./claims.js";
import { describeFailures, ensureClaimsForStampedPods, retry } from "./promote.js";
import { CacheSourceSchema } from "./source.js";

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

void test("claims for an election: once `current` says it moved on, no namespace gets anything more, and each object made is told", async () => {
  const creates: string[] = [];
  let uid = 0;
  const made = <T extends k8s.KubernetesObject>(body: T): Promise<T> => {
    creates.push(`${body.kind ?? "?"} ${body.metadata?.namespace ?? ""}/${body.metadata?.name ?? ""}`);
    return Promise.resolve({ ...body, metadata: { ...body.metadata, uid: `u${++uid}` } });
  };
  const core = {
    listPodForAllNamespaces: () =>
      Promise.resolve({ items: ["a", "b", "c"].map((namespace) => ({ metadata: { namespace } })) }),
    readNamespacedPersistentVolumeClaim: () =>
      Promise.reject(Object.assign(new Error("not found"), { code: 404 })),
    createPersistentVolume: ({ body }: { body: k8s.V1PersistentVolume }) => made(body),
    createNamespacedPersistentVolumeClaim: ({ body }: { body: k8s.V1PersistentVolumeClaim }) => made(body),
  };
  const told: CreatedObject[] = [];
  let asked = 0;
  const r = await ensureClaimsForStampedPods({
    clients: { core, custom: {} } as unknown as PromoteClients,
    short: "0123456789abcdef",
    scope: CLUSTER_SCOPE_KEY,
    source: CacheSourceSchema.parse({
      backend: "host-path",
      provisioner: "warmstart.dev/host-path",
      sizeBytes: 1,
      node: "gpu-0",
      path: "/store/0123456789abcdef",
    }),
    log: pino({ level: "silent" }),
    parallel: 1,
    retry: { attempts: 2, initialMs: 1, maxMs: 1 },
    // Current for namespace a only.
    current: () => Promise.resolve(++asked === 1),
    created: (o) => told.push(o),
  });
  assert.equal(r.superseded, true);
  assert.equal(r.ok, false);
  assert.deepEqual(r.namespaces, ["a"]);
  assert.equal(asked, 2, "asked again before b, never before c");
  assert.deepEqual(creates, [
    "PersistentVolume /warmstart-0123456789abcdef-a",
    "PersistentVolumeClaim a/rox-0123456789abcdef",
  ]);
  assert.deepEqual(told, [
    { kind: "PersistentVolume", name: "warmstart-0123456789abcdef-a", uid: "u1" },
    { kind: "PersistentVolumeClaim", name: "rox-0123456789abcdef", namespace: "a", uid: "u2" },
  ]);
});
