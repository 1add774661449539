/**
 * The local cluster is a real Kubernetes control plane: scheduling, gates, eviction, watches and
 * the simulated readiness switch all behave as they do on a real cluster.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { join } from "node:path";
import { tmpdir } from "node:os";
import * as k8s from "@kubernetes/client-node";
import {
  gpuContainer,
  isPodReady,
  kube,
  listPods,
  podCondition,
  tempNamespace,
  uniqueName,
  waitFor,
  createWorkers,
} from "../harness.js";
import { ensureSimulatedNode, setNodeGpus } from "../../tools/localcluster/nodes.js";
import { processStartTime } from "../../tools/localcluster/processes.js";
import { findTasks, realNodePaths } from "../../tools/localcluster/realnode.js";
import { PACKAGE_ROOT } from "../../tools/localcluster/versions.js";

const jsonPatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch);

test("a Deployment of 3 GPU replicas is scheduled onto the simulated GPU nodes and becomes Ready", async (t) => {
  const ns = await tempNamespace(t, "sched");
  const { core } = await kube();
  await createWorkers(ns, { replicas: 3, args: ["--model", "m"] });
  const pods = await waitFor(
    "3 Ready pods",
    async () => {
      const items = await listPods(ns, "app=worker");
      return items.length === 3 && items.every(isPodReady) ? items : undefined;
    },
    60_000,
  );
  const gpuNodes = new Set(
    (await core.listNode()).items
      .filter((n) => Number(n.status?.allocatable?.["nvidia.com/gpu"] ?? 0) > 0)
      .map((n) => n.metadata!.name!),
  );
  for (const p of pods) assert.ok(gpuNodes.has(p.spec!.nodeName!), `${p.metadata!.name} on a GPU node`);
});

test("a gated pod stays unscheduled until its gate is removed", async (t) => {
  const ns = await tempNamespace(t, "gate");
  const { core } = await kube();
  await core.createNamespacedPod({
    namespace: ns,
    body: {
      metadata: { name: "gated" },
      spec: { schedulingGates: [{ name: "example.com/wait" }], containers: [gpuContainer("vllm")] },
    },
  });
  const gated = await waitFor("SchedulingGated condition", async () => {
    const p = await core.readNamespacedPod({ name: "gated", namespace: ns });
    const c = podCondition(p, "PodScheduled");
    return c?.status === "False" && c.reason === "SchedulingGated" ? p : undefined;
  });
  assert.equal(gated.spec?.nodeName, undefined);
  await core.patchNamespacedPod(
    {
      name: "gated",
      namespace: ns,
      body: [
        { op: "test", path: "/spec/schedulingGates/0/name", value: "example.com/wait" },
        { op: "remove", path: "/spec/schedulingGates/0" },
      ],
    },
    jsonPatch,
  );
  const ready = await waitFor("scheduled and Ready", async () => {
    const p = await core.readNamespacedPod({ name: "gated", namespace: ns });
    return p.spec?.nodeName && isPodReady(p) ? p : undefined;
  });
  assert.equal(podCondition(ready, "PodScheduled")?.status, "True");
});

test("evicting a pod owned by a ReplicaSet gets it replaced", async (t) => {
  const ns = await tempNamespace(t, "evict");
  const { apps, core } = await kube();
  const labels = { app: "evictee" };
  await apps.createNamespacedReplicaSet({
    namespace: ns,
    body: {
      metadata: { name: "evictee" },
      spec: {
        replicas: 1,
        selector: { matchLabels: labels },
        template: { metadata: { labels }, spec: { containers: [gpuContainer("vllm")] } },
      },
    },
  });
  const first = await waitFor("the first pod Ready", async () =>
    (await listPods(ns, "app=evictee")).find(isPodReady),
  );
  await core.createNamespacedPodEviction({
    name: first.metadata!.name!,
    namespace: ns,
    body: { metadata: { name: first.metadata!.name!, namespace: ns } },
  });
  const replacement = await waitFor("a replacement pod Ready", async () =>
    (await listPods(ns, "app=evictee")).find((p) => p.metadata!.uid !== first.metadata!.uid && isPodReady(p)),
  );
  assert.notEqual(replacement.metadata!.name, first.metadata!.name);
});

test("patching a node's allocatable GPUs to 0 and back is seen through a watch", async (t) => {
  const { kc, core } = await kube();
  const name = uniqueName("gpu-watch");
  await ensureSimulatedNode(core, { name, gpus: 4 });
  t.after(() => core.deleteNode({ name }).then(() => undefined));
  const seen: string[] = [];
  const watch = new k8s.Watch(kc);
  const req = await watch.watch(
    "/api/v1/nodes",
    { fieldSelector: `metadata.name=${name}` },
    (_type: string, node: k8s.V1Node) => {
      const gpus = node.status?.allocatable?.["nvidia.com/gpu"];
      if (gpus !== undefined && seen.at(-1) !== gpus) seen.push(gpus);
    },
    () => undefined,
  );
  t.after(() => req.abort());
  await waitFor("the watch to see 4 GPUs", () => seen.includes("4"));
  await setNodeGpus(core, name, 0);
  await waitFor("the watch to see 0 GPUs", () => seen.at(-1) === "0");
  await setNodeGpus(core, name, 4);
  await waitFor("the watch to see 4 GPUs again", () => seen.at(-1) === "4");
  assert.deepEqual(seen, ["4", "0", "4"]);
});

test("a manual-ready pod runs but is not Ready until annotated ready", async (t) => {
  const ns = await tempNamespace(t, "manual");
  const { core } = await kube();
  await core.createNamespacedPod({
    namespace: ns,
    body: {
      metadata: { name: "slow", annotations: { "sim.warmstart.dev/manual-ready": "true" } },
      spec: { containers: [gpuContainer("vllm")] },
    },
  });
  const running = await waitFor("Running", async () => {
    const p = await core.readNamespacedPod({ name: "slow", namespace: ns });
    return p.status?.phase === "Running" ? p : undefined;
  });
  assert.equal(isPodReady(running), false);
  // Give the simulator time to (wrongly) make it Ready: it must stay not Ready.
  await new Promise((r) => setTimeout(r, 1500));
  assert.equal(isPodReady(await core.readNamespacedPod({ name: "slow", namespace: ns })), false);
  await core.patchNamespacedPod(
    {
      name: "slow",
      namespace: ns,
      body: [{ op: "add", path: "/metadata/annotations/sim.warmstart.dev~1ready", value: "true" }],
    },
    jsonPatch,
  );
  await waitFor("Ready after the annotation", async () =>
    isPodReady(await core.readNamespacedPod({ name: "slow", namespace: ns })),
  );
});

test("cluster up reuses a running cluster, and down leaves no process behind (also after a crash of up)", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "warmstart-cluster-"));
  const env = { ...process.env, WARMSTART_STATE_DIR: dir };
  const bin = join(PACKAGE_ROOT, "bin/warmstart");
  const cli = (...args: string[]): ReturnType<typeof spawnSync> =>
    spawnSync(process.execPath, [bin, ...args], { env, encoding: "utf8" });
  t.after(async () => {
    cli("cluster", "down");
    await rm(dir, { recursive: true, force: true });
  });
  const readPids = async (): Promise<number[]> =>
    (
      JSON.parse(await readFile(join(dir, "state.json"), "utf8")) as { processes: { pid: number }[] }
    ).processes.map((p) => p.pid);

  // A crash of `cluster up` midway: SIGKILL it once the API server has started.
  const crashing = spawn(
    process.execPath,
    [bin, "cluster", "up", "--bare", "--nodes", "1", "--real-nodes", "0"],
    {
      env,
      stdio: "ignore",
    },
  );
  await waitFor("up to start kube-apiserver", async () => (await readPids()).length >= 2, 60_000);
  crashing.kill("SIGKILL");
  const orphaned = await readPids();
  assert.ok(
    (await Promise.all(orphaned.map(processStartTime))).every(Boolean),
    "processes outlive the crashed parent",
  );
  assert.equal(cli("cluster", "down").status, 0);
  for (const pid of orphaned)
    assert.equal(await processStartTime(pid), undefined, `pid ${pid} gone after down`);

  const first = cli("cluster", "up", "--bare", "--nodes", "1", "--real-nodes", "0");
  assert.equal(first.status, 0, String(first.stderr));
  const pids = await readPids();
  assert.deepEqual(pids.length, 5, "etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok");
  const second = cli("cluster", "up", "--bare", "--nodes", "1", "--real-nodes", "0");
  assert.equal(second.status, 0);
  assert.match(String(second.stderr), /already running/);
  assert.deepEqual(await readPids(), pids, "the second up reused the same processes");

  const status = JSON.parse(String(cli("cluster", "status", "-o", "json").stdout)) as { running: boolean };
  assert.equal(status.running, true);
  assert.equal(cli("cluster", "down").status, 0);
  for (const pid of pids) assert.equal(await processStartTime(pid), undefined, `pid ${pid} gone after down`);
  const after = JSON.parse(String(cli("cluster", "status", "-o", "json").stdout)) as { running: boolean };
  assert.equal(after.running, false);
});

test("down stops a real node's kubelet, containerd, shims and containers, and unmounts everything it made", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), "warmstart-real-"));
  const env = { ...process.env, WARMSTART_STATE_DIR: dir };
  const bin = join(PACKAGE_ROOT, "bin/warmstart");
  const cli = (...args: string[]): ReturnType<typeof spawnSync> =>
    spawnSync(process.execPath, [bin, ...args], { env, encoding: "utf8" });
  t.after(async () => {
    cli("cluster", "down");
    await rm(dir, { recursive: true, force: true });
  });
  const up = cli("cluster", "up", "--bare", "--nodes", "0", "--real-nodes", "1");
  assert.equal(up.status, 0, String(up.stderr));
  const state = JSON.parse(await readFile(join(dir, "state.json"), "utf8")) as {
    kubeconfig: string;
    images: { engine: string };
    processes: { name: string; pid: number }[];
  };
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(state.kubeconfig);
  const core = kc.makeApiClient(k8s.CoreV1Api);
  await waitFor("the default ServiceAccount", () =>
    core.readNamespacedServiceAccount({ name: "default", namespace: "default" }),
  );
  // A running container with the volumes the kubelet mounts: a projected token and an emptyDir.
  await core.createNamespacedPod({
    namespace: "default",
    body: {
      metadata: { name: "sleeper" },
      spec: {
        hostNetwork: true,
        nodeSelector: { "kubernetes.io/hostname": "real-0" },
        tolerations: [{ key: "sim.warmstart.dev/real-node", operator: "Exists" }],
        volumes: [{ name: "scratch", emptyDir: { medium: "Memory" } }],
        containers: [
          {
            name: "sleep",
            image: state.images.engine,
            imagePullPolicy: "IfNotPresent",
            command: ["sleep", "3600"],
            volumeMounts: [{ name: "scratch", mountPath: "/scratch" }],
          },
        ],
      },
    },
  });
  await waitFor(
    "the container running",
    async () =>
      (await core.readNamespacedPod({ name: "sleeper", namespace: "default" })).status?.phase === "Running",
    120_000,
  );
  const tasks = await findTasks(realNodePaths(dir, "real-0"));
  const taskPids = tasks.flatMap((x) => [x.shim, x.init]);
  assert.ok(tasks.length >= 2, "the pod's shim runs its sandbox and its container");
  assert.ok((await mountsUnder(dir)).length > 0, "the kubelet and containerd mounted things under the state");
  const recorded = state.processes.map((p) => p.pid);
  assert.ok(state.processes.some((p) => p.name === "kubelet-real-0"));
  assert.ok(state.processes.some((p) => p.name === "containerd-real-0"));

  const down = cli("cluster", "down");
  assert.equal(down.status, 0, String(down.stderr));
  for (const pid of [...recorded, ...taskPids])
    assert.equal(
      await processStartTime(pid),
      undefined,
      `pid ${pid} (a role, shim or container) gone after down`,
    );
  assert.deepEqual(await processesMentioning(dir), [], "no process refers to the cluster's folder");
  assert.deepEqual(await mountsUnder(dir), [], "no mount left under the cluster's folder");
});

async function mountsUnder(dir: string): Promise<string[]> {
  const info = await readFile("/proc/self/mountinfo", "utf8");
  return info
    .split("\n")
    .map((l) => l.split(" ")[4] ?? "")
    .filter((m) => m === dir || m.startsWith(`${dir}/`));
}

async function processesMentioning(dir: string): Promise<string[]> {
  const { readdir } = await import("node:fs/promises");
  const found: string[] = [];
  for (const pid of await readdir("/proc")) {
    if (!/^\d+$/.test(pid) || Number(pid) === process.pid) continue;
    const cmd = (await readFile(`/proc/${pid}/cmdline`, "utf8").catch(() => "")).split("\0").join(" ");
    if (cmd.includes(dir)) found.push(`${pid}: ${cmd.slice(0, 200)}`);
  }
  return found;
}
