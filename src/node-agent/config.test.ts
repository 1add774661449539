import assert from "node:assert/strict";
import { test } from "node:test";
import { loadNodeAgentConfig } from "./config.js";

const base = { node: "gpu-0", kubeletRoot: "/var/lib/kubelet", store: "/var/lib/warmstart/store" };

void test("the store budget takes Kubernetes-style sizes; none by default", () => {
  assert.equal(loadNodeAgentConfig(base, {}).storeBudget, 0);
  assert.equal(loadNodeAgentConfig({ ...base, storeBudget: "5Mi" }, {}).storeBudget, 5 * 2 ** 20);
  assert.equal(loadNodeAgentConfig({ ...base, storeBudget: "2T" }, {}).storeBudget, 2e12);
  assert.equal(loadNodeAgentConfig({ ...base, storeBudget: "1.5Gi" }, {}).storeBudget, 1.5 * 2 ** 30);
  assert.equal(loadNodeAgentConfig(base, { WARMSTART_STORE_BUDGET: "100Gi" }).storeBudget, 100 * 2 ** 30);
  assert.throws(
    () => loadNodeAgentConfig({ ...base, storeBudget: "lots" }, {}),
    /--store-budget \(WARMSTART_STORE_BUDGET\): not a size: "lots"/,
  );
});

void test("a capture has a deadline: 30 minutes unless configured (0: none)", () => {
  assert.equal(loadNodeAgentConfig(base, {}).captureDeadlineMs, 30 * 60_000);
  assert.equal(loadNodeAgentConfig({ ...base, captureDeadlineMs: "90s" }, {}).captureDeadlineMs, 90_000);
  assert.equal(loadNodeAgentConfig(base, { WARMSTART_CAPTURE_DEADLINE: "0" }).captureDeadlineMs, 0);
});
