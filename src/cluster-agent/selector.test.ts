import assert from "node:assert/strict";
import { test } from "node:test";
import { formatSelector, matches, parseSelector } from "./selector.js";

void test("parses every kubectl selector form and writes it back", () => {
  const reqs = parseSelector(
    "pool=a, tier==gold,zone!=z1,gpu in (h100, a100),spot notin (yes),ready,!draining",
  );
  assert.deepEqual(reqs, [
    { key: "pool", operator: "In", values: ["a"] },
    { key: "tier", operator: "In", values: ["gold"] },
    { key: "zone", operator: "NotIn", values: ["z1"] },
    { key: "gpu", operator: "In", values: ["h100", "a100"] },
    { key: "spot", operator: "NotIn", values: ["yes"] },
    { key: "ready", operator: "Exists" },
    { key: "draining", operator: "DoesNotExist" },
  ]);
  assert.equal(
    formatSelector(reqs),
    "pool=a,tier=gold,zone!=z1,gpu in (h100,a100),spot!=yes,ready,!draining",
  );
  assert.deepEqual(parseSelector(formatSelector(reqs)), reqs);
  assert.deepEqual(parseSelector(""), []);
  assert.deepEqual(parseSelector("example.com/pool=a"), [
    { key: "example.com/pool", operator: "In", values: ["a"] },
  ]);
});

void test("matches labels", () => {
  const reqs = parseSelector("pool=a,!draining,gpu in (h100,a100)");
  assert.equal(matches(reqs, { pool: "a", gpu: "h100" }), true);
  assert.equal(matches(reqs, { pool: "a", gpu: "h100", draining: "" }), false);
  assert.equal(matches(reqs, { pool: "b", gpu: "h100" }), false);
  assert.equal(matches(reqs, { pool: "a" }), false);
  assert.equal(matches(parseSelector("zone!=z1"), {}), true, "NotIn matches a missing label");
  assert.equal(matches([], undefined), true);
});

void test("bad selectors are refused with the offending term", () => {
  assert.throws(() => parseSelector("a in ("), /unbalanced/);
  assert.throws(() => parseSelector("a=b,,c"), /empty term/);
  assert.throws(() => parseSelector("a in ()"), /at least one value/);
  assert.throws(() => parseSelector("-bad=x"), /not a valid label key/);
  assert.throws(() => parseSelector("a=has space"), /cannot parse|not a valid/);
  assert.throws(() => parseSelector("a=b)"), /unbalanced/);
});
