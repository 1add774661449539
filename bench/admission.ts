/**
 * Admission latency and throughput: pass-through pods and downloader pods through the real
 * webhook, beside a do-nothing webhook on the same server stack. Each server runs in a child
 * process; requests go over HTTPS keep-alive on loopback, at a fixed rate, then closed-loop.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { Agent, request } from "node:https";
import { join } from "node:path";
import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import * as k8s from "@kubernetes/client-node";
import { PACKAGE_ROOT } from "../tools/localcluster/versions.js";
import { status as clusterStatus } from "../tools/localcluster/cluster.js";
import { SYSTEM_NAMESPACE } from "../src/common/kube.js";

const RATE = Number(process.env.BENCH_ADMISSION_RATE ?? 500); // requests/s in the fixed-rate phase
// Downloader admissions each make API calls (cache lookup, Lease create); they come a few per rollout.
const DOWNLOADER_RATE = Number(process.env.BENCH_ADMISSION_DOWNLOADER_RATE ?? 50);
const SECONDS = Number(process.env.BENCH_ADMISSION_SECONDS ?? 5);
const CONCURRENCY = Number(process.env.BENCH_ADMISSION_CONCURRENCY ?? 32);

const passPod = {
  metadata: { generateName: "web-" },
  spec: { containers: [{ name: "web", image: "nginx:1.27" }] },
};
const benchModel = `bench/model-${randomUUID().slice(0, 8)}`;
const gpuPod = {
  metadata: { generateName: "worker-" },
  spec: {
    containers: [
      {
        name: "vllm",
        image: "vllm/vllm-openai:v0.6.3",
        args: ["--model", benchModel, "--tensor-parallel-size", "1"],
        resources: { limits: { "nvidia.com/gpu": "1" } },
      },
    ],
  },
};

function review(object: unknown): string {
  return JSON.stringify({
    apiVersion: "admission.k8s.io/v1",
    kind: "AdmissionReview",
    request: {
      uid: randomUUID(),
      operation: "CREATE",
      namespace: "bench",
      resource: { group: "", version: "v1", resource: "pods" },
      kind: { group: "", version: "v1", kind: "Pod" },
      object,
    },
  });
}

async function startServer(
  mode: "noop" | "webhook",
  kubeconfig?: string,
): Promise<{ url: string; child: ChildProcess }> {
  const child = spawn(process.execPath, [join(PACKAGE_ROOT, "dist/bench/admission-server.js"), mode], {
    env: { ...process.env, ...(kubeconfig ? { KUBECONFIG: kubeconfig } : {}), LOG_LEVEL: "warn" },
    stdio: ["ignore", "pipe", "inherit"],
  });
  const url = await new Promise<string>((resolve, reject) => {
    let out = "";
    child.stdout.on("data", (d: Buffer) => {
      out += d.toString();
      // The server prints its URL on a line of its own; the webhook's log lines may come first.
      const url = /^https:\/\/\S+$/m.exec(out)?.[0];
      if (url) resolve(url);
    });
    child.once("exit", (code) => reject(new Error(`${mode} server exited (${code})`)));
  });
  return { url, child };
}

function post(agent: Agent, url: string, body: string): Promise<number> {
  const started = process.hrtime.bigint();
  return new Promise((resolve, reject) => {
    const req = request(
      `${url}/mutate`,
      { method: "POST", agent, rejectUnauthorized: false, headers: { "content-type": "application/json" } },
      (res) => {
        res.resume();
        res.on("end", () => {
          if (res.statusCode !== 200) reject(new Error(`status ${res.statusCode}`));
          else resolve(Number(process.hrtime.bigint() - started) / 1e6);
        });
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

interface Result {
  p50: number;
  p99: number;
  rate: number;
  max: number;
}

const pct = (sorted: number[], p: number): number =>
  sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * p))]!;

async function measure(url: string, pod: unknown, rate = RATE): Promise<Result> {
  const agent = new Agent({ keepAlive: true, maxSockets: CONCURRENCY });
  for (let i = 0; i < 200; i++) await post(agent, url, review(pod)); // warm-up (JIT, TLS sessions)
  // Fixed rate: latency as a client sending RATE req/s sees it.
  const latencies: number[] = [];
  const inflight: Promise<void>[] = [];
  const total = rate * SECONDS;
  const t0 = performance.now();
  for (let i = 0; i < total; i++) {
    const due = t0 + (i * 1000) / rate;
    const wait = due - performance.now();
    if (wait > 1) await sleep(wait);
    inflight.push(post(agent, url, review(pod)).then((ms) => void latencies.push(ms)));
  }
  await Promise.all(inflight);
  const sent = total / ((performance.now() - t0) / 1000);
  // Closed loop: the most this server answers per second.
  let done = 0;
  const t1 = performance.now();
  const until = t1 + SECONDS * 1000;
  await Promise.all(
    Array.from({ length: CONCURRENCY }, async () => {
      while (performance.now() < until) {
        await post(agent, url, review(pod));
        done++;
      }
    }),
  );
  const max = done / ((performance.now() - t1) / 1000);
  agent.destroy();
  latencies.sort((a, b) => a - b);
  return { p50: pct(latencies, 0.5), p99: pct(latencies, 0.99), rate: sent, max };
}

export async function runAdmissionBench(): Promise<void> {
  const st = await clusterStatus();
  const kubeconfig = process.env.KUBECONFIG ?? (st.running ? st.kubeconfig : undefined);
  if (!kubeconfig)
    throw new Error("the admission benchmark needs a cluster: run `bin/warmstart cluster up` first");
  console.log(
    `fixed rate ${RATE}/s (downloaders ${DOWNLOADER_RATE}/s) for ${SECONDS}s, then closed loop with ${CONCURRENCY} connections, for ${SECONDS}s`,
  );
  const rows: [string, Result][] = [];
  const noop = await startServer("noop");
  try {
    rows.push(["baseline: do-nothing webhook", await measure(noop.url, passPod)]);
  } finally {
    noop.child.kill();
  }
  const real = await startServer("webhook", kubeconfig);
  try {
    rows.push(["webhook, pass-through pods", await measure(real.url, passPod)]);
    rows.push(["webhook, downloader pods (election)", await measure(real.url, gpuPod, DOWNLOADER_RATE)]);
  } finally {
    real.child.kill();
    const kc = new k8s.KubeConfig();
    kc.loadFromFile(kubeconfig);
    const coordination = kc.makeApiClient(k8s.CoordinationV1Api);
    const leases = await coordination.listNamespacedLease({ namespace: SYSTEM_NAMESPACE });
    const custom = kc.makeApiClient(k8s.CustomObjectsApi);
    for (const l of leases.items) {
      const short = l.metadata?.labels?.["warmstart.dev/hash"];
      if (!short || l.metadata?.annotations?.["warmstart.dev/leader-namespace"] !== "bench") continue;
      await coordination.deleteNamespacedLease({ name: l.metadata.name!, namespace: SYSTEM_NAMESPACE });
      await custom
        .deleteClusterCustomObject({
          group: "warmstart.dev",
          version: "v1alpha1",
          plural: "modelcaches",
          name: short,
        })
        .catch(() => undefined);
    }
  }
  const base = rows[0]![1];
  const f = (n: number): string => n.toFixed(2).padStart(8);
  console.log(`\n${"".padEnd(38)}   p50 ms   p99 ms  sent/s   max/s  p99 vs baseline`);
  for (const [name, r] of rows) {
    console.log(
      `${name.padEnd(38)} ${f(r.p50)} ${f(r.p99)} ${r.rate.toFixed(0).padStart(7)} ${r.max.toFixed(0).padStart(7)}  ${(r.p99 / base.p99).toFixed(2)}x`,
    );
  }
}
