import assert from "node:assert/strict";
import { networkInterfaces } from "node:os";
import { test } from "node:test";
import { Gauge, Registry } from "prom-client";
import { createLogger } from "../common/log.js";
import { loadNodeAgentConfig } from "./config.js";
import { isLoopback, startHttp, type HttpHandle } from "./http.js";

const log = createLogger("node-agent", "silent");

/** An address of this machine that is not loopback: a client there is "another pod". */
const external = Object.values(networkInterfaces())
  .flat()
  .find((i) => i && i.family === "IPv4" && !i.internal)?.address;

async function serve(metricsRemote?: boolean): Promise<HttpHandle> {
  const registry = new Registry();
  new Gauge({ name: "warmstart_probe_series", help: "a series", registers: [registry] }).set(1);
  return startHttp({
    host: "0.0.0.0",
    port: 0,
    ...(metricsRemote === undefined ? {} : { metricsRemote }),
    registry,
    health: () => ({ ready: true }),
    log,
  });
}

const at = (h: HttpHandle, host: string, path: string): Promise<Response> =>
  fetch(`http://${host}:${new URL(h.url).port}${path}`);

void test("loopback addresses: IPv4 127/8, ::1 and IPv4-mapped 127/8; nothing else", () => {
  for (const a of ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"]) assert.ok(isLoopback(a), a);
  for (const a of [undefined, "", "10.0.0.1", "::ffff:10.0.0.1", "fe80::1", "::", "0.0.0.0", "128.0.0.1"])
    assert.ok(!isLoopback(a), String(a));
});

void test("metrics are loopback only unless --metrics-remote (or WARMSTART_METRICS_REMOTE) says otherwise", () => {
  const base = { node: "gpu-0", kubeletRoot: "/var/lib/kubelet", store: "/var/lib/warmstart/store" };
  assert.equal(loadNodeAgentConfig(base, {}).metricsRemote, false);
  assert.equal(loadNodeAgentConfig({ ...base, metricsRemote: true }, {}).metricsRemote, true);
  assert.equal(loadNodeAgentConfig(base, { WARMSTART_METRICS_REMOTE: "true" }).metricsRemote, true);
});

void test("metrics: a client off loopback is refused without --metrics-remote; probes stay open", async (t) => {
  const h = await serve();
  t.after(() => h.close());
  const local = await at(h, "127.0.0.1", "/metrics");
  assert.equal(local.status, 200);
  assert.match(await local.text(), /^warmstart_probe_series 1$/m);
  if (!external) return t.skip("no address but loopback on this machine");
  const remote = await at(h, external, "/metrics");
  assert.equal(remote.status, 403);
  assert.doesNotMatch(await remote.text(), /warmstart_probe_series/);
  // The kubelet probes the pod's address.
  assert.equal((await at(h, external, "/healthz")).status, 200);
  assert.equal((await at(h, external, "/livez")).status, 200);
});

void test("metrics: --metrics-remote serves every address (the chart's NetworkPolicy says who reaches it)", async (t) => {
  if (!external) return t.skip("no address but loopback on this machine");
  const h = await serve(true);
  t.after(() => h.close());
  const remote = await at(h, external, "/metrics");
  assert.equal(remote.status, 200);
  assert.match(await remote.text(), /^warmstart_probe_series 1$/m);
});
