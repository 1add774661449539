/**
 * `warmstart server`'s API on the real API server, through the fault proxy so that every call it
 * makes is counted: the snapshot comes from the release controller's informer caches, so serving
 * it makes no call at all, however often it is asked for.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import { pino } from "pino";
import * as k8s from "@kubernetes/client-node";
import { kube, tempNamespace, waitFor } from "../harness.js";
import { FaultProxy, type SeenRequest } from "../fault-proxy.js";
import { runServer } from "../../src/server/run.js";
import { fetchSnapshot, type Snapshot } from "../../src/server/dashboard/views.js";
import { SYSTEM_NAMESPACE } from "../../src/common/kube.js";
import { ANN_ROLE, LABEL_HASH } from "../../src/core/contract.js";

const TOKEN = "server-api-it-token-0001";

function pod(name: string, short: string): k8s.V1Pod {
  return {
    metadata: { name, labels: { [LABEL_HASH]: short }, annotations: { [ANN_ROLE]: "restore" } },
    // Held out of scheduling by a gate of the test's own: nothing updates the pod afterwards, so
    // no event makes the server reconcile it (and call the API server) while snapshots are
    // counted. Unheld, a pod being scheduled and failing to pull kept changing for seconds.
    spec: {
      schedulingGates: [{ name: "example.com/test-hold" }],
      containers: [{ name: "c", image: "img:1" }],
    },
  };
}

/** Waits until the proxy has seen no request for `quietMs` (start-up lists and reconciles are done). */
async function quiet(proxy: FaultProxy, quietMs = 1500): Promise<void> {
  const deadline = Date.now() + 30_000;
  let seen = proxy.requests.length;
  let since = Date.now();
  while (Date.now() < deadline) {
    await sleep(100);
    if (proxy.requests.length !== seen) {
      seen = proxy.requests.length;
      since = Date.now();
    } else if (Date.now() - since >= quietMs) return;
  }
  throw new Error("the server kept calling the API server");
}

/**
 * A call that names another group's hash: the release controller reconciling pods that earlier
 * tests left on the shared cluster (their namespaces still terminating). A snapshot names no hash,
 * so these cannot be its calls; every other call in the window still counts.
 */
function forAnotherGroup(r: SeenRequest, short: string): boolean {
  const named = decodeURIComponent(r.path + r.query).match(/[0-9a-f]{16,}/g) ?? [];
  return named.length > 0 && named.every((h) => !h.startsWith(short));
}

void test("the snapshot is served from the controller's caches: no API call per request; changes arrive by watch", async (t) => {
  const { kc, core } = await kube();
  const proxy = await FaultProxy.start(kc);
  t.after(() => proxy.close());
  const ns = await tempNamespace(t, "api", { "warmstart.dev/skip": "true" });
  const short = randomBytes(8).toString("hex");
  // The webhook removes stamps a pod's author sets; the test stamps its pods afterwards.
  const stamped = async (name: string, namespace = ns, group = short): Promise<void> => {
    await core.createNamespacedPod({ namespace, body: pod(name, group) });
    await core.patchNamespacedPod(
      { namespace, name, body: { metadata: pod(name, group).metadata } },
      k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
    );
  };
  await stamped("first");
  // Another test's group, torn down while snapshots are counted (as CI's earlier tests' are).
  const otherNs = await tempNamespace(t, "api-other", { "warmstart.dev/skip": "true" });
  const otherShort = randomBytes(8).toString("hex");
  await stamped("leftover", otherNs, otherShort);

  const srv = await runServer(
    {
      host: "127.0.0.1",
      port: 0,
      systemNamespace: SYSTEM_NAMESPACE,
      token: TOKEN,
      // No timed re-list or recheck inside the measured window.
      resyncMs: 3_600_000,
      recheckMs: 3_600_000,
    },
    { kubeConfig: proxy.kubeConfig(), log: pino({ level: "silent" }) },
  );
  t.after(() => srv.stop());
  const snapshot = async (): Promise<Snapshot> => {
    const res = await fetch(`${srv.url}/api/snapshot`, { headers: { authorization: `Bearer ${TOKEN}` } });
    assert.equal(res.status, 200, await res.clone().text());
    return (await res.json()) as Snapshot;
  };
  const mine = (s: Snapshot): string[] =>
    s.pods
      .filter((p) => p.namespace === ns)
      .map((p) => p.name)
      .sort();

  await waitFor("the first pod in the snapshot", async () => {
    const res = await fetch(`${srv.url}/api/snapshot`, { headers: { authorization: `Bearer ${TOKEN}` } });
    return res.ok && mine((await res.json()) as Snapshot).includes("first");
  });
  assert.equal((await fetch(`${srv.url}/api/snapshot`)).status, 401, "no token, no data");
  await quiet(proxy);

  const before = proxy.requests.length;
  const started = Date.now();
  const n = 50;
  await core.deleteNamespacedPod({ namespace: otherNs, name: "leftover", gracePeriodSeconds: 0 });
  for (let i = 0; i < n; i++) assert.deepEqual(mine(await snapshot()), ["first"]);
  const ms = Date.now() - started;
  await waitFor("the controller's reconcile of the other group", () =>
    proxy.requests.slice(before).some((r) => forAnotherGroup(r, short)),
  );
  const seen = proxy.requests.slice(before);
  const calls = seen.filter((r) => !forAnotherGroup(r, short));
  t.diagnostic(
    `${n} snapshot requests in ${ms} ms made ${calls.length} API calls ` +
      `(and the controller ${seen.length - calls.length} for other tests' groups)`,
  );
  assert.deepEqual(calls, [], "no call to the API server while serving snapshots");

  // The old way, for comparison: the same proxy counts three LISTs for every snapshot.
  const listed = proxy.requests.length;
  await fetchSnapshot(proxy.kubeConfig(), SYSTEM_NAMESPACE);
  const lists = proxy.requests.slice(listed).map((r) => `${r.method} ${r.path}`);
  t.diagnostic(`one snapshot listed from the API server: ${lists.join(", ")}`);
  // At least those four: the server's own informers go through this proxy too, and a relist of
  // theirs can land in the window.
  assert.ok(
    lists.length >= 4,
    `the counter sees LISTs when there are some (with the node stores'): ${lists.length}`,
  );

  // A pod created now reaches the snapshot through the watch.
  await stamped("second");
  await waitFor("the second pod, from the watch", async () => mine(await snapshot()).includes("second"));
});
