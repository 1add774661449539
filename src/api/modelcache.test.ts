import assert from "node:assert/strict";
import { test } from "node:test";
import { parseModelCache } from "./modelcache.js";

const record = (status?: Record<string, unknown>, spec: Record<string, unknown> = {}): unknown => ({
  apiVersion: "warmstart.dev/v1alpha1",
  kind: "ModelCache",
  metadata: { name: "0123456789abcdef", resourceVersion: "7" },
  spec: { hash: "0123456789abcdef".repeat(4), ...spec },
  ...(status ? { status } : {}),
});

void test("an old record without status or optional fields reads", () => {
  const c = parseModelCache(record());
  assert.equal(c.status, undefined);
  assert.equal(c.metadata.resourceVersion, "7");
});

void test("fields this version does not know survive a read (and so a read-modify-write)", () => {
  const c = parseModelCache(
    record(
      {
        phase: "Ready",
        mirrors: [{ node: "n1" }],
        recentRestores: [
          {
            namespace: "a",
            name: "p",
            uid: "u",
            role: "restore",
            readySeconds: 1,
            at: "2026-01-01T00:00:00Z",
            extra: 1,
          },
        ],
      },
      { inputs: { v: 2, image: "i" }, future: "x" },
    ),
  );
  assert.deepEqual(c.status?.mirrors, [{ node: "n1" }]);
  assert.equal(c.status?.recentRestores?.[0]?.extra, 1);
  assert.deepEqual(c.spec.inputs, { v: 2, image: "i" });
  assert.equal(c.spec.future, "x");
});

void test("a record that does not match names itself and the field", () => {
  assert.throws(() => parseModelCache(record({ phase: "Warm" })), /ModelCache 0123456789abcdef .*phase/s);
  assert.throws(() => parseModelCache(record({}, { hash: "nope" })), /spec\.hash/);
});
