/** How a user's cache reference is read: the webhook and the release controller share this. */
import assert from "node:assert/strict";
import { test } from "node:test";
import { ANN_RESTORE_FROM } from "./contract.js";
import { HASH_REF, restoreFromOf } from "./refs.js";

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
