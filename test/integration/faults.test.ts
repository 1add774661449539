/**
 * The fault suite (SPEC 4): the story of a chart of engine replicas on the real node, with a role
 * killed and restarted at a chosen moment, the API server failing or slow, the store's disk
 * full, a stored manifest corrupted, the kubelet restarted. Each scenario states the end it
 * expects and asserts it: every replica Ready (warm or cold), no pod gated forever, no
 * incomplete cache Ready, nothing already captured lost, no role crash-looping.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { watch } from "node:fs";
import { mkdtemp, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { promisify } from "node:util";
import * as k8s from "@kubernetes/client-node";
import { getModelCache } from "../../src/common/modelcache.js";
import { ANN_ROLE, LABEL_HASH, MANIFEST_FILE, SCHEDULING_GATE } from "../../src/core/contract.js";
import { readState, startClusterProcessAgain, stopClusterProcess } from "../../tools/localcluster/cluster.js";
import { FaultProxy } from "../fault-proxy.js";
import { isPodReady, kube, listPods, tempNamespace, uniqueName, waitFor } from "../harness.js";
import {
  containerLog,
  createEngines,
  hubStats,
  modelBytes,
  realNodeOrSkip,
  type RealNode,
} from "../realnode.js";
import { clusterProcessesAlive, takeOverRole, type RoleHandle } from "../roles.js";

const run = promisify(execFile);
const READY_MS = 300_000;
const jsonPatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch);

const role = (p: k8s.V1Pod): string | undefined => p.metadata?.annotations?.[ANN_ROLE];
const gated = (p: k8s.V1Pod): boolean =>
  (p.spec?.schedulingGates ?? []).some((g) => g.name === SCHEDULING_GATE);

async function allReady(ns: string, n: number, timeoutMs = READY_MS): Promise<k8s.V1Pod[]> {
  let seen: k8s.V1Pod[] = [];
  try {
    return await waitFor(
      `${n} Ready engine pods in ${ns}`,
      async () => {
        seen = await listPods(ns, "app=engine");
        const pods = seen.filter((p) => !p.metadata?.deletionTimestamp);
        return pods.length === n && pods.every(isPodReady) ? pods : undefined;
      },
      timeoutMs,
    );
  } catch (err) {
    // What each pod was doing, and its cache's record: what a failure in CI leaves to go on.
    const { custom } = await kube();
    const lines = seen.map(
      (p) =>
        `${p.metadata?.name}: role ${role(p) ?? "-"}, ${gated(p) ? "gated, " : ""}${p.status?.phase}` +
        `${isPodReady(p) ? " Ready" : ""}${p.metadata?.deletionTimestamp ? " deleting" : ""}, node ${p.spec?.nodeName ?? "-"}, ` +
        `reason ${p.metadata?.annotations?.["warmstart.dev/reason"] ?? "-"}; ` +
        (p.status?.conditions ?? [])
          .map((c) => `${c.type}=${c.status}${c.reason ? `(${c.reason})` : ""}`)
          .join(" ") +
        "; " +
        [...(p.status?.initContainerStatuses ?? []), ...(p.status?.containerStatuses ?? [])]
          .map(
            (c) =>
              `${c.name}:${Object.keys(c.state ?? {})[0] ?? "?"}${c.state?.waiting?.reason ? `/${c.state.waiting.reason}` : ""}`,
          )
          .join(" "),
    );
    for (const short of new Set(seen.map((p) => p.metadata?.labels?.[LABEL_HASH]).filter(Boolean))) {
      const c = await getModelCache(custom, short!).catch(() => undefined);
      lines.push(`cache ${short}: ${JSON.stringify(c?.status ?? null)}`);
    }
    throw new Error(`${(err as Error).message}\n${lines.join("\n")}`);
  }
}

async function leaderOf(ns: string): Promise<k8s.V1Pod> {
  return waitFor("a leader", async () =>
    (await listPods(ns, "app=engine")).find((p) => role(p) === "leader"),
  );
}

/** The expected end every scenario shares. */
async function assertSettled(
  t: TestContext,
  ns: string,
  n: number,
  roles: RoleHandle[] = [],
): Promise<k8s.V1Pod[]> {
  const { custom } = await kube();
  const pods = await allReady(ns, n);
  assert.deepEqual(
    pods.filter(gated).map((p) => p.metadata?.name),
    [],
    "no pod left gated",
  );
  for (const short of new Set(pods.map((p) => p.metadata?.labels?.[LABEL_HASH]).filter(Boolean))) {
    const cache = await getModelCache(custom, short!);
    if (cache?.status?.phase === "Ready") await assertTreeComplete(short!);
    t.diagnostic(`cache ${short}: ${cache?.status?.phase ?? "none"} ${cache?.status?.reason ?? ""}`);
  }
  assert.deepEqual(await clusterProcessesAlive(), [], "every role of the cluster is running");
  for (const r of roles) assert.ok(r.pid(), `${r.name} (taken over by the test) is running`);
  return pods;
}

/** A Ready cache's committed tree on the real node carries its manifest and ready marker. */
async function assertTreeComplete(short: string): Promise<void> {
  const st = await readState();
  const node = st!.nodes.find((n) => n.real)!;
  const store = join(node.kubeletRoot, "..", "store");
  const entries = await readdir(join(store, short)).catch(() => [] as string[]);
  if (entries.length === 0) return; // promoted from another store (a CSI volume)
  assert.ok(entries.includes(MANIFEST_FILE), `the Ready tree ${short} has its manifest`);
  assert.ok(entries.includes(".warmstart-ready"), `the Ready tree ${short} has its ready marker`);
}

/**
 * Kills the role the instant (inotify) a staging folder of the given cache appears in the store;
 * the signal is sent from the watch callback itself, before any other await can let the copy on.
 */
function killOnStaging(store: string, short: string, agent: RoleHandle): Promise<string> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      watcher.close();
      reject(new Error(`no staging folder of ${short} appeared in ${store} within ${READY_MS} ms`));
    }, READY_MS);
    const watcher = watch(store, (_event, name) => {
      if (!name?.startsWith(`${short}.tmp-`)) return;
      watcher.close();
      clearTimeout(timer);
      agent.kill().then(() => resolve(name), reject);
    });
  });
}

async function proxyFile(t: TestContext, proxy: FaultProxy): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), "faults-"));
  t.after(async () => {
    await proxy.close();
    await rm(dir, { recursive: true, force: true });
  });
  return proxy.kubeconfigFile(dir);
}

async function scenario(t: TestContext): Promise<{ node: RealNode; ns: string; model: string } | undefined> {
  const node = await realNodeOrSkip(t);
  if (!node) return undefined;
  return { node, ns: await tempNamespace(t, "fault"), model: `synthetic/${uniqueName("f")}` };
}

test("the webhook dies during an election: pods admitted meanwhile start cold, a restarted webhook elects again", async (t) => {
  const s = await scenario(t);
  if (!s) return;
  const { apps } = await kube();
  const webhook = await takeOverRole(t, "webhook");
  await createEngines(t, s.node, s.ns, { replicas: 2, model: s.model });
  // Both replicas admitted by the webhook (a slow answer past its timeout admits one unchanged:
  // then it is simply one more replica that starts cold).
  const admitted = await waitFor("both replicas admitted", async () => {
    const pods = await listPods(s.ns, "app=engine");
    return pods.length === 2 && pods.some((p) => role(p) === "leader") ? pods : undefined;
  });
  const followers = admitted.filter((p) => role(p) === "follower").length;
  await webhook.kill();
  // failurePolicy Ignore: with the webhook gone the API server admits the new replica unchanged.
  await apps.patchNamespacedDeploymentScale(
    { name: "engine", namespace: s.ns, body: [{ op: "replace", path: "/spec/replicas", value: 3 }] },
    jsonPatch,
  );
  const unchanged = await waitFor("a replica admitted while the webhook was down", async () =>
    (await listPods(s.ns, "app=engine")).find(
      (p) => role(p) === undefined && !admitted.some((a) => a.metadata?.uid === p.metadata?.uid),
    ),
  );
  await webhook.start();
  const pods = await assertSettled(t, s.ns, 3, [webhook]);
  assert.ok(pods.some((p) => p.metadata?.name === unchanged.metadata?.name && role(p) === undefined));
  assert.equal(pods.filter((p) => role(p) === "follower").length, followers, "the follower still restored");
  const size = await modelBytes(s.node, s.model);
  const cold = pods.filter((p) => role(p) === undefined).length;
  assert.ok(
    (await hubStats(s.node)).repos[s.model]!.bytes <= (1 + cold) * size,
    "the leader and the replicas admitted unchanged only",
  );
});

test("the node agent dies mid-capture: the staging is never taken for a capture, the restarted agent captures", async (t) => {
  const s = await scenario(t);
  if (!s) return;
  const agent = await takeOverRole(t, `node-agent-${s.node.name}`);
  const store = join(s.node.kubeletRoot, "..", "store");
  await createEngines(t, s.node, s.ns, { replicas: 3, model: s.model });
  const short = (await leaderOf(s.ns)).metadata!.labels![LABEL_HASH]!;
  // The moment its copy is under way: a staging folder appears beside where the tree will be.
  // Watched, not polled: a capture of this size can begin and commit between two polls.
  const staging = await killOnStaging(store, short, agent);
  const entries = await readdir(store);
  assert.ok(!entries.includes(short), "nothing committed by a killed capture");
  t.diagnostic(`killed mid-copy (${staging})`);
  await agent.start();
  await assertSettled(t, s.ns, 3, [agent]);
  const { custom } = await kube();
  assert.equal((await getModelCache(custom, short))?.status?.phase, "Ready");
  assert.ok(!(await readdir(store)).includes(staging), "the killed capture's staging is cleaned up");
  assert.equal(
    (await hubStats(s.node)).repos[s.model]!.bytes,
    await modelBytes(s.node, s.model),
    "one download",
  );
});

test("the node agent dies mid-promote: the restarted agent finishes the promote", async (t) => {
  const s = await scenario(t);
  if (!s) return;
  const { kc, custom } = await kube();
  const proxy = await FaultProxy.start(kc);
  const agent = await takeOverRole(t, `node-agent-${s.node.name}`, { kubeconfig: await proxyFile(t, proxy) });
  // The first volume the promote creates: the agent dies there, before it is answered.
  const rule = proxy.inject({
    method: "POST",
    path: /^\/api\/v1\/persistentvolumes$/,
    times: 1,
    status: [503],
    onMatch: () => agent.kill(),
  });
  await createEngines(t, s.node, s.ns, { replicas: 3, model: s.model });
  const short = (await leaderOf(s.ns)).metadata!.labels![LABEL_HASH]!;
  // The rule counts its hit before its kill has landed: wait for both.
  await waitFor("the agent killed as the promote starts", () => rule.hits > 0 && !agent.pid(), READY_MS);
  assert.notEqual((await getModelCache(custom, short))?.status?.phase, "Ready");
  await agent.start();
  await assertSettled(t, s.ns, 3, [agent]);
  assert.equal((await getModelCache(custom, short))?.status?.phase, "Ready");
});

test("the server dies between retiring a leader's Lease and evicting its followers: the restarted server evicts them", async (t) => {
  const s = await scenario(t);
  if (!s) return;
  const { kc, core } = await kube();
  const proxy = await FaultProxy.start(kc);
  const server = await takeOverRole(t, "server", { kubeconfig: await proxyFile(t, proxy) });
  const rule = proxy.inject({
    method: "POST",
    path: /\/pods\/[^/]+\/eviction$/,
    times: 1,
    status: [503],
    onMatch: () => server.kill(),
  });
  await createEngines(t, s.node, s.ns, { replicas: 3, model: s.model });
  const leader = await leaderOf(s.ns);
  // The leader goes away mid-download: its election is retired and its followers re-elected.
  await core.deleteNamespacedPod({ name: leader.metadata!.name!, namespace: s.ns, gracePeriodSeconds: 0 });
  await waitFor("the server killed at the first eviction", () => rule.hits > 0 && !server.pid(), READY_MS);
  await server.start();
  await assertSettled(t, s.ns, 3, [server]);
});

test("the API server fails and stalls (429, 500, latency, dropped watches) under every role: the story still ends", async (t) => {
  const s = await scenario(t);
  if (!s) return;
  const { kc } = await kube();
  const proxy = await FaultProxy.start(kc);
  const file = await proxyFile(t, proxy);
  proxy.inject({ path: /./, query: /watch=true/, dropAfterMs: 3_000 });
  proxy.inject({ path: /./, probability: 0.15, status: [500] });
  proxy.inject({ path: /./, probability: 0.1, status: [429] });
  proxy.inject({ path: /./, probability: 0.2, delayMs: 300 });
  const roles: RoleHandle[] = [];
  for (const r of ["webhook", "server", `node-agent-${s.node.name}`])
    roles.push(await takeOverRole(t, r, { kubeconfig: file }));
  await createEngines(t, s.node, s.ns, { replicas: 3, model: s.model });
  await assertSettled(t, s.ns, 3, roles);
  const injected = proxy.requests.filter((r) => r.injected).length;
  t.diagnostic(`${injected} of ${proxy.requests.length} API calls failed on purpose`);
  assert.ok(injected > 0);
});

test("the store's disk is full: the capture fails cleanly, nothing half-made is Ready, every replica ends Ready", async (t) => {
  const s = await scenario(t);
  if (!s) return;
  const { custom } = await kube();
  const dir = await mkdtemp(join(tmpdir(), "full-store-"));
  await run("mount", ["-t", "tmpfs", "-o", "size=16m", "tmpfs", dir]);
  t.after(async () => {
    await run("umount", ["-l", dir]).catch(() => undefined);
    await rm(dir, { recursive: true, force: true });
  });
  const agent = await takeOverRole(t, `node-agent-${s.node.name}`, { extraArgs: [`--store=${dir}`] });
  await createEngines(t, s.node, s.ns, { replicas: 2, model: s.model });
  const short = (await leaderOf(s.ns)).metadata!.labels![LABEL_HASH]!;
  const failed = await waitFor(
    "the capture to fail",
    async () => {
      const c = await getModelCache(custom, short);
      return c?.status?.phase === "Failed" ? c : undefined;
    },
    READY_MS,
  );
  t.diagnostic(`cache ${short}: ${failed.status?.reason} ${failed.status?.message}`);
  assert.match(String(failed.status?.message ?? ""), /space|ENOSPC|budget/i);
  assert.deepEqual(
    (await readdir(dir)).filter((e) => e.startsWith(short)),
    [],
    "no tree and no staging left on the full disk",
  );
  await assertSettled(t, s.ns, 2, [agent]);
});

test("a stored manifest corrupted after the capture: restores refuse the tree, the replicas already running stay up", async (t) => {
  const s = await scenario(t);
  if (!s) return;
  const { apps, core } = await kube();
  await createEngines(t, s.node, s.ns, { replicas: 2, model: s.model });
  const pods = await assertSettled(t, s.ns, 2);
  const short = pods[0]!.metadata!.labels![LABEL_HASH]!;
  const manifest = join(s.node.kubeletRoot, "..", "store", short, MANIFEST_FILE);
  const original = await readFile(manifest);
  await writeFile(
    manifest,
    original.toString().replace(/"size":\s*(\d+)/, (_m, n: string) => `"size":${Number(n) + 1}`),
  );
  t.after(() => writeFile(manifest, original));
  await apps.patchNamespacedDeploymentScale(
    { name: "engine", namespace: s.ns, body: [{ op: "replace", path: "/spec/replicas", value: 3 }] },
    jsonPatch,
  );
  // Refused where the tree is first looked at: the store driver's publish (its manifest is not
  // the record's: never mounted) or, on a backend that mounts it as is, the restore's seed.
  const refusal = await waitFor(
    "the new restore's tree refused",
    async () => {
      const p = (await listPods(s.ns, "app=engine")).find((x) => role(x) === "restore");
      if (!p) return undefined;
      const seed = p.status?.initContainerStatuses?.find((c) => c.name === "warmstart-seed-cache");
      const exit = seed?.lastState?.terminated?.exitCode ?? seed?.state?.terminated?.exitCode;
      if (exit !== undefined && exit !== 0) return { pod: p, by: "seed" as const };
      const events = await core.listNamespacedEvent({
        namespace: s.ns,
        fieldSelector: `involvedObject.name=${p.metadata!.name!},reason=FailedMount`,
      });
      return events.items.some((e) => /not the record's/.test(e.message ?? ""))
        ? { pod: p, by: "publish" as const }
        : undefined;
    },
    READY_MS,
  );
  const restore = refusal.pod;
  t.diagnostic(`refused by the ${refusal.by}`);
  if (refusal.by === "seed") {
    // The kubelet may list the restarted seed's fresh (empty) log before the failed run's is flushed.
    const log = await waitFor(
      "the seed's log to say why",
      async () => {
        const text = await containerLog(s.node, restore, "warmstart-seed-cache").catch(() => "");
        return /manifest|size/i.test(text) ? text : undefined;
      },
      30_000,
    );
    assert.match(log, /manifest|size/i, "seed says why");
  }
  assert.equal(isPodReady(restore), false, "the engine never started on an unverified tree");
  for (const p of pods)
    assert.ok(
      isPodReady(await core.readNamespacedPod({ name: p.metadata!.name!, namespace: s.ns })),
      "still up",
    );
});

test("the real node's kubelet restarts: running replicas keep running, the node keeps its GPUs, new replicas start", async (t) => {
  const s = await scenario(t);
  if (!s) return;
  const { core, apps } = await kube();
  await createEngines(t, s.node, s.ns, { replicas: 2, model: s.model });
  const before = await assertSettled(t, s.ns, 2);
  const kubelet = `kubelet-${s.node.name}`;
  await stopClusterProcess(kubelet);
  t.after(() => startClusterProcessAgain(kubelet).then(() => undefined));
  await startClusterProcessAgain(kubelet);
  await waitFor(
    "the node Ready with its GPUs",
    async () => {
      const n = await core.readNode({ name: s.node.name });
      return (
        n.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") &&
        Number(n.status?.allocatable?.["nvidia.com/gpu"] ?? 0) >= 3
      );
    },
    120_000,
  );
  await apps.patchNamespacedDeploymentScale(
    { name: "engine", namespace: s.ns, body: [{ op: "replace", path: "/spec/replicas", value: 3 }] },
    jsonPatch,
  );
  const after = await assertSettled(t, s.ns, 3);
  for (const p of before) {
    const same = after.find((x) => x.metadata?.uid === p.metadata?.uid);
    assert.ok(same, `${p.metadata?.name} survived the kubelet restart`);
    assert.equal(same.status?.containerStatuses?.[0]?.restartCount, 0, "its engine was not restarted");
  }
});
