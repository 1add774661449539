import { randomBytes } from "node:crypto";
import { appendFile, mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import * as k8s from "@kubernetes/client-node";
import Table from "cli-table3";
import { up, type ClusterState } from "../localcluster/cluster.js";
import { isNotFound, makeApiClient } from "../common/kube.js";
import { ANN_ROLE, CACHE_VOLUME, LABEL_HASH, MODELCACHE, SCHEDULING_GATE } from "../core/contract.js";
import { podRow } from "../server/views.js";

const NS = "warmstart-demo";
const MODEL = "Qwen/Qwen2.5-7B-Instruct";
const DOWNLOAD_MIB_S = 64;
const jsonPatch = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.JsonPatch);

interface Out {
  step(n: number, total: number, title: string): void;
  line(text: string): void;
}

const out: Out = {
  step: (n, total, title) => process.stdout.write(`\n[${n}/${total}] ${title}\n`),
  line: (text) => process.stdout.write(`      ${text}\n`),
};

async function until<T>(
  what: string,
  check: () => Promise<T | undefined | false>,
  timeoutMs = 120_000,
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await check().catch(() => undefined);
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`demo: timed out waiting for ${what}`);
    await sleep(200);
  }
}

function podTable(pods: k8s.V1Pod[]): string {
  const t = new Table({
    head: ["POD", "ROLE", "GATED", "NODE", "PHASE", "READY IN"],
    style: { head: [], border: [] },
  });
  for (const p of pods.sort((a, b) => a.metadata!.name!.localeCompare(b.metadata!.name!))) {
    const r = podRow(p);
    const gated = (p.spec?.schedulingGates ?? []).some((g) => g.name === SCHEDULING_GATE);
    t.push([
      r.name,
      p.metadata?.annotations?.[ANN_ROLE] ?? "-",
      gated ? "yes" : "no",
      r.node || "-",
      r.phase,
      r.readySeconds === null ? "-" : `${r.readySeconds.toFixed(1)}s`,
    ]);
  }
  return t.toString().split("\n").join("\n      ");
}

/**
 * The whole story on the local cluster: a chart of 4 identical vLLM workers, one download, the
 * capture, the release of the waiting pods, and a scale-up that starts warm. Simulated nodes run
 * no containers, so the demo plays the engine: it writes the leader's download into the pod's
 * cache volume on the node and marks pods ready (`sim.warmstart.dev/ready`).
 */
export async function runDemo(opts: { shardMiB: number }): Promise<void> {
  const total = 6;
  out.step(
    1,
    total,
    "a real local Kubernetes control plane with simulated GPU nodes, and every Warmstart role",
  );
  const state: ClusterState = await up({
    nodes: 2,
    gpusPerNode: 4,
    realNodes: 1,
    hubModelMiB: 256,
    hubMiBs: 64,
    bare: false,
    progress: (l) => out.line(l),
  });
  const kc = new k8s.KubeConfig();
  kc.loadFromFile(state.kubeconfig);
  const core = makeApiClient(kc, k8s.CoreV1Api);
  const apps = makeApiClient(kc, k8s.AppsV1Api);
  const custom = makeApiClient(kc, k8s.CustomObjectsApi);

  await core.deleteNamespace({ name: NS }).catch((err: unknown) => {
    if (!isNotFound(err)) throw err;
  });
  await until("the previous demo namespace to go", async () =>
    core.readNamespace({ name: NS }).then(
      () => false,
      (e: unknown) => isNotFound(e),
    ),
  );
  await core.createNamespace({ body: { metadata: { name: NS } } });
  await until("the default ServiceAccount", () =>
    core.readNamespacedServiceAccount({ name: "default", namespace: NS }),
  );

  out.step(2, total, `a chart: 3 vLLM workers serving ${MODEL} (no Warmstart labels) and a frontend`);
  const labels = { app: "vllm-worker" };
  await apps.createNamespacedDeployment({
    namespace: NS,
    body: {
      metadata: { name: "vllm-worker" },
      spec: {
        replicas: 3,
        selector: { matchLabels: labels },
        template: {
          metadata: { labels, annotations: { "sim.warmstart.dev/manual-ready": "true" } },
          spec: {
            containers: [
              {
                name: "vllm",
                image: "vllm/vllm-openai:v0.8.5",
                args: ["--model", MODEL, "--tensor-parallel-size", "1", "--max-model-len", "8192"],
                resources: { limits: { "nvidia.com/gpu": "1" } },
              },
            ],
          },
        },
      },
    },
  });
  await apps.createNamespacedDeployment({
    namespace: NS,
    body: {
      metadata: { name: "frontend" },
      spec: {
        replicas: 1,
        selector: { matchLabels: { app: "frontend" } },
        template: {
          metadata: { labels: { app: "frontend" } },
          spec: { containers: [{ name: "frontend", image: "nginx:1.27", args: ["--model", MODEL] }] },
        },
      },
    },
  });
  const workers = (): Promise<k8s.V1Pod[]> =>
    core
      .listNamespacedPod({ namespace: NS, labelSelector: "app=vllm-worker" })
      .then((l) => l.items.filter((p) => !p.metadata?.deletionTimestamp));
  let pods = await until("3 workers", async () => ((await workers()).length === 3 ? workers() : undefined));
  const leader = pods.find((p) => p.metadata?.annotations?.[ANN_ROLE] === "leader");
  if (!leader) throw new Error("demo: no leader was elected (is the webhook running with election on?)");
  const short = leader.metadata!.labels![LABEL_HASH]!;
  out.line(
    `admission elected one leader for cache ${short}; the other 2 wait gated, holding no node and no GPU:`,
  );
  out.line(podTable(pods));
  const frontend = (await core.listNamespacedPod({ namespace: NS, labelSelector: "app=frontend" })).items[0];
  out.line(
    `the frontend has no GPU: ${frontend?.metadata?.annotations?.[ANN_ROLE] ? "decorated (unexpected)" : "left alone"}`,
  );

  out.step(
    3,
    total,
    "the leader downloads the model and compiles (played by the demo: files written into its cache volume)",
  );
  const running = await until("the leader to run", async () => {
    const p = await core.readNamespacedPod({ name: leader.metadata!.name!, namespace: NS });
    return p.status?.phase === "Running" ? p : undefined;
  });
  const node = state.nodes.find((n) => n.name === running.spec?.nodeName);
  if (!node)
    throw new Error(
      `demo: the leader runs on ${running.spec?.nodeName}, which is not a local simulated node`,
    );
  const root = join(
    node.kubeletRoot,
    "pods",
    running.metadata!.uid!,
    "volumes",
    "kubernetes.io~empty-dir",
    CACHE_VOLUME,
  );
  const started = Date.now();
  const bytes = await writeModelTree(root, opts.shardMiB);
  out.line(
    `wrote ${(bytes / 2 ** 20).toFixed(0)} MiB (4 weight shards, tokenizer, 400 compile-cache files) in ${((Date.now() - started) / 1000).toFixed(1)}s`,
  );
  await markReady(core, leader.metadata!.name!);
  out.line("the leader is Ready");

  out.step(4, total, "the node agent captures the warmed cache; promote makes it a read-only claim");
  let last = "";
  const ready = await until(
    "the cache to be Ready",
    async () => {
      const mc = (await custom.getClusterCustomObject({
        group: MODELCACHE.group,
        version: MODELCACHE.version,
        plural: MODELCACHE.plural,
        name: short,
      })) as {
        status?: {
          phase?: string;
          reason?: string;
          message?: string;
          sizeBytes?: number;
          files?: number;
          captureSeconds?: number;
        };
      };
      const phase = mc.status?.phase ?? "Electing";
      if (phase !== last) {
        out.line(`ModelCache ${short}: ${phase}${mc.status?.reason ? ` (${mc.status.reason})` : ""}`);
        last = phase;
      }
      if (phase === "Failed") throw new Error(`demo: capture failed: ${mc.status?.message ?? ""}`);
      return phase === "Ready" ? mc : undefined;
    },
    180_000,
  ).catch((err: unknown) => {
    throw err instanceof Error && err.message.startsWith("demo: capture failed")
      ? err
      : new Error(`${(err as Error).message} (see ${state.stateDir}/logs)`);
  });
  out.line(
    `${ready.status?.files ?? "?"} files, ${((ready.status?.sizeBytes ?? 0) / 2 ** 20).toFixed(0)} MiB captured in ${(ready.status?.captureSeconds ?? 0).toFixed(1)}s`,
  );

  out.step(5, total, "the waiting pods are released and start from the cache (seed + prewarm, no download)");
  await until("followers to run", async () => {
    const ps = (await workers()).filter((p) => p.metadata?.annotations?.[ANN_ROLE] === "follower");
    return ps.length === 2 && ps.every((p) => p.status?.phase === "Running") ? ps : undefined;
  });
  for (const p of (await workers()).filter((x) => x.metadata?.annotations?.[ANN_ROLE] === "follower"))
    await markReady(core, p.metadata!.name!);
  pods = await until("all 3 Ready", async () => {
    const ps = await workers();
    return ps.every((p) => podRow(p).ready) ? ps : undefined;
  });
  out.line(podTable(pods));

  out.step(6, total, "scale to 4: a new replica restores directly (the host-path cache lives on one node)");
  await apps.patchNamespacedDeploymentScale(
    { name: "vllm-worker", namespace: NS, body: [{ op: "replace", path: "/spec/replicas", value: 4 }] },
    jsonPatch,
  );
  const fresh = await until("the new pod running", async () => {
    const ps = (await workers()).filter((p) => p.metadata?.annotations?.[ANN_ROLE] === "restore");
    return ps.length === 1 && ps.every((p) => p.status?.phase === "Running") ? ps : undefined;
  });
  for (const p of fresh) await markReady(core, p.metadata!.name!);
  pods = await until("all 4 Ready", async () => {
    const ps = await workers();
    return ps.length === 4 && ps.every((p) => podRow(p).ready) ? ps : undefined;
  });
  out.line(podTable(pods));
  out.line("");
  out.line(`dashboard:  ${state.roles.server ?? "(server not running)"}`);
  out.line(`try:        KUBECONFIG=${state.kubeconfig} bin/warmstart caches   (and: pods, elections)`);
  out.line("stop with:  bin/warmstart cluster down");
}

async function markReady(core: k8s.CoreV1Api, name: string): Promise<void> {
  await core.patchNamespacedPod(
    {
      name,
      namespace: NS,
      body: [{ op: "add", path: "/metadata/annotations/sim.warmstart.dev~1ready", value: "true" }],
    },
    jsonPatch,
  );
}

/** A model as the hub lays it out, plus compile caches; returns the bytes written. */
async function writeModelTree(root: string, shardMiB: number): Promise<number> {
  const snap = join(
    root,
    "model",
    "hub",
    "models--Qwen--Qwen2.5-7B-Instruct",
    "snapshots",
    "a09a35458c702b33eeacc393d103063234e8bc28",
  );
  await mkdir(snap, { recursive: true });
  let bytes = 0;
  const shard = Buffer.alloc(shardMiB * 2 ** 20);
  // Paced like a fast mirror (DOWNLOAD_MIB_S), so the leader's time to ready means something.
  const chunk = 4 * 2 ** 20;
  for (let i = 1; i <= 4; i++) {
    randomBytes(4096).copy(shard); // distinct content per shard
    const file = join(snap, `model-0000${i}-of-00004.safetensors`);
    await writeFile(file, "");
    for (let off = 0; off < shard.length; off += chunk) {
      await appendFile(file, shard.subarray(off, off + chunk));
      await sleep((chunk / 2 ** 20 / DOWNLOAD_MIB_S) * 1000);
      if (process.stdout.isTTY)
        process.stdout.write(
          `      downloading shard ${i}/4: ${((off + chunk) / 2 ** 20).toFixed(0)}/${shardMiB} MiB\r`,
        );
    }
    if (!process.stdout.isTTY) process.stdout.write(`      downloaded shard ${i}/4 (${shardMiB} MiB)\n`);
    bytes += shard.length;
  }
  process.stdout.write(
    `${process.stdout.isTTY ? "\n" : ""}      compiling (torch.compile, CUDA graphs)...\n`,
  );
  for (const f of ["config.json", "tokenizer.json", "generation_config.json"]) {
    const text = JSON.stringify({ file: f, model: MODEL });
    await writeFile(join(snap, f), text);
    bytes += text.length;
  }
  for (let d = 0; d < 20; d++) {
    const dir = join(root, "cache", "torchinductor", `fx-${d}`);
    await mkdir(dir, { recursive: true });
    for (let f = 0; f < 20; f++) {
      const blob = randomBytes(2048);
      await writeFile(join(dir, `kernel-${f}.so`), blob);
      bytes += blob.length;
    }
    await sleep(75);
  }
  return bytes;
}
