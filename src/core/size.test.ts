import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { captureSizeLimit, quantityBytes } from "./size.js";

const cluster = { defaultLimit: "200Gi", maxLimit: "1Ti" };

void describe("capture size limit", () => {
  void test("quantities in Kubernetes' forms, and nothing else", () => {
    assert.equal(quantityBytes("200Gi"), 200 * 2 ** 30);
    assert.equal(quantityBytes("1.5Ti"), 1.5 * 2 ** 40);
    assert.equal(quantityBytes("500G"), 500e9);
    assert.equal(quantityBytes("1048576"), 2 ** 20);
    for (const bad of ["", "abc", "-1Gi", "0", "10 Gi", "1e3", "100m", "1GB", "Gi", "1..5Gi"])
      assert.equal(quantityBytes(bad), undefined, bad);
  });

  void test("the cluster default when the pod asks nothing", () => {
    assert.deepEqual(captureSizeLimit(undefined, cluster), { limit: "200Gi" });
  });

  void test("the pod's own limit, up to the cluster's maximum", () => {
    assert.deepEqual(captureSizeLimit("500Gi", cluster), { limit: "500Gi" });
    assert.deepEqual(captureSizeLimit("1Ti", cluster), { limit: "1Ti" });
    const capped = captureSizeLimit("4Ti", cluster);
    assert.equal(capped.limit, "1Ti");
    assert.match(capped.note ?? "", /above the cluster's maximum/);
  });

  void test("a value that is not a size falls back to the default, and says so", () => {
    const r = captureSizeLimit("lots", cluster);
    assert.equal(r.limit, "200Gi");
    assert.match(r.note ?? "", /"lots" is not a size/);
  });
});
