import assert from "node:assert/strict";
import { test } from "node:test";
import { CREDENTIALS_SECRET, loadConfig, parseDuration } from "./config.js";

const required = {
  WARMSTART_CONTROL_PLANE_URL: "http://127.0.0.1:8090",
  WARMSTART_CLUSTER_TOKEN: "cluster-token-0123456789",
  WARMSTART_CLUSTER_ID: "local",
};

void test("durations: units, compounds, and bare seconds", () => {
  assert.equal(parseDuration("250ms"), 250);
  assert.equal(parseDuration("30s"), 30_000);
  assert.equal(parseDuration("1m30s"), 90_000);
  assert.equal(parseDuration("1h"), 3_600_000);
  assert.equal(parseDuration("1.5s"), 1500);
  assert.equal(parseDuration("60"), 60_000);
  assert.equal(parseDuration(2), 2000);
  assert.throws(() => parseDuration("5x"), /not a duration/);
  assert.throws(() => parseDuration("-1s"), /not a duration/);
});

void test("defaults from the spec", () => {
  const c = loadConfig({}, required);
  assert.equal(c.gpuPollInterval, 60_000);
  assert.equal(c.debounce, 30_000);
  assert.equal(c.gracefulNoGpu, true);
  assert.equal(c.secretName, CREDENTIALS_SECRET);
  assert.equal(c.secretNamespace, c.namespace);
  assert.deepEqual(c.nodeSelector.requirements, []);
  assert.equal(c.gpuTypeLabel, "warmstart.dev/gpu-type");
  assert.equal(c.queueBatch, 5);
  assert.equal(c.renewBefore, undefined, "the control plane's value unless set");
});

void test("flags win over the environment; env values are parsed", () => {
  const c = loadConfig(
    { debounce: "2s", nodeSelector: "pool=test" },
    {
      ...required,
      WARMSTART_DEBOUNCE: "10s",
      WARMSTART_GRACEFUL_NO_GPU: "false",
      WARMSTART_QUEUE_BATCH: "10",
      WARMSTART_PORT: "0",
    },
  );
  assert.equal(c.debounce, 2000);
  assert.equal(c.gracefulNoGpu, false);
  assert.equal(c.queueBatch, 10);
  assert.equal(c.port, 0);
  assert.deepEqual(c.nodeSelector.requirements, [{ key: "pool", operator: "In", values: ["test"] }]);
});

void test("every bad setting is named by flag and variable in one error", () => {
  assert.throws(
    () =>
      loadConfig(
        { queueWait: "30s", port: "http", gpuPollInterval: "0s" },
        {
          WARMSTART_CONTROL_PLANE_URL: "ftp://x",
          WARMSTART_CLUSTER_ID: "bad id",
          WARMSTART_GRACEFUL_NO_GPU: "maybe",
        },
      ),
    (err: Error) => {
      for (const s of [
        "--control-plane-url (WARMSTART_CONTROL_PLANE_URL)",
        "--cluster-token (WARMSTART_CLUSTER_TOKEN): is required",
        "--cluster-id (WARMSTART_CLUSTER_ID)",
        "--queue-wait (WARMSTART_QUEUE_WAIT): queue wait is at most 20s",
        "--port (WARMSTART_PORT)",
        "--gpu-poll-interval (WARMSTART_GPU_POLL_INTERVAL): gpu poll interval must be greater than zero",
        '--graceful-no-gpu (WARMSTART_GRACEFUL_NO_GPU): expected true or false, got "maybe"',
      ])
        assert.ok(err.message.includes(s), `missing ${s} in:\n${err.message}`);
      return true;
    },
  );
});

void test("workload namespaces: default, the workload namespace, or a list that must hold it", () => {
  assert.deepEqual(loadConfig({}, required).namespaces, ["default"]);
  assert.deepEqual(loadConfig({ workloadNamespace: "serving" }, required).namespaces, ["serving"]);
  assert.deepEqual(
    loadConfig({}, { ...required, WARMSTART_WORKLOAD_NAMESPACES: " team-a, team-b " }).namespaces,
    ["team-a", "team-b"],
  );
  assert.throws(
    () => loadConfig({ namespaces: "team-a", workloadNamespace: "serving" }, required),
    /--workload-namespace \(WARMSTART_WORKLOAD_NAMESPACE\): is not one of the namespaces \(team-a\)/,
  );
  assert.throws(
    () => loadConfig({ namespaces: "Team_A" }, required),
    /--namespaces \(WARMSTART_WORKLOAD_NAMESPACES\)/,
  );
  assert.throws(() => loadConfig({ namespaces: " , " }, required), /name at least one namespace/);
});
