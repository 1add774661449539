/** How a user's cache reference is read: the webhook and the release controller share this. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { ANN_RESTORE_FROM } from "./contract.js";
import type { V1Pod } from "@kubernetes/client-node";
import { HASH_REF, restoreFromOf, restoredFrom } from "./refs.js";

void test("restore-from is read trimmed and lower-cased; blank or not a string is absent", () => {
  const short = "abcdef0123456789";
  assert.equal(restoreFromOf({ [ANN_RESTORE_FROM]: ` ${short.toUpperCase()} ` }), short);
  assert.equal(restoreFromOf({ [ANN_RESTORE_FROM]: "   " }), undefined);
  assert.equal(restoreFromOf({ [ANN_RESTORE_FROM]: 7 }), undefined);
  assert.equal(restoreFromOf(undefined), undefined);
});

void test("a hash reference is 16 or 64 hex digits, nothing in between", () => {
  assert.ok(HASH_REF.test("0".repeat(16)));
  assert.ok(HASH_REF.test("a".repeat(64)));
  assert.ok(!HASH_REF.test("a".repeat(32)));
  assert.ok(!HASH_REF.test("A".repeat(16)), "compared after normalizing");
});

test("restoredFrom reads the mounted claim, never an annotation an author can still edit", () => {
  const pod = (claimName: string | undefined, from?: string): V1Pod => ({
    metadata: { annotations: from ? { "warmstart.dev/restore-from": from } : {} },
    spec: {
      containers: [],
      volumes: claimName
        ? [{ name: "warmstart-ro", persistentVolumeClaim: { claimName, readOnly: true } }]
        : [],
    },
  });
  assert.equal(restoredFrom(pod("rox-0123456789abcdef", "fedcba9876543210")), "0123456789abcdef");
  assert.equal(restoredFrom(pod(undefined, "fedcba9876543210")), undefined);
  assert.equal(restoredFrom(pod("rox-../../x")), undefined);
  assert.equal(restoredFrom(pod("someone-elses-claim")), undefined);
});
