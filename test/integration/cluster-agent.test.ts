/**
 * The cluster agent against the real local cluster and the real control plane (in-process, on a
 * temp database). Every test counts only its own simulated GPU nodes (a unique pool label and a
 * unique GPU type), so it never touches the shared gpu-0/gpu-1 and never sees other tests' nodes.
 * Each test's cluster has its own registration token, and its agent deploys only into the
 * namespaces the test names.
 */
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { createServer, request, type IncomingHttpHeaders } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { pino } from "pino";
import * as k8s from "@kubernetes/client-node";
import { isPodReady, kube, listPods, localCluster, tempNamespace, uniqueName, waitFor } from "../harness.js";

// These tests are about the agent's workloads, not the model cache: keep the admission webhook
// (election on in the local cluster) out of their namespaces, or followers would stay gated.
const SKIP_CACHE = { "warmstart.dev/skip": "true" };
import { isNotFound } from "../../src/common/kube.js";
import { setNodeGpus, simulatedNode } from "../../tools/localcluster/nodes.js";
import { parseAllDocuments } from "yaml";
import { ControlPlaneClient } from "../../src/control-plane/client.js";
import { startControlPlane, type ControlPlane } from "../../src/control-plane/server.js";
import type { RequestStatus } from "../../src/control-plane/api.js";
import { ClusterAgent, type AgentHooks } from "../../src/cluster-agent/agent.js";
import { loadConfig, type AgentConfigInput } from "../../src/cluster-agent/config.js";
import { LABEL_REQUEST_ID, recordName } from "../../src/cluster-agent/workloads.js";
import { deferred, memoryLogger, type LogEntry } from "../support/testing.js";
import { createCA, issueCert } from "../../src/common/certs.js";

const OPERATOR_TOKEN = "agent-it-operator-token-0001";
/** Each test cluster's registration token (the control plane binds it to that cluster id). */
const tokenOf = (clusterId: string): string => `agent-it-token-${clusterId}`;
const POOL_LABEL = "test.warmstart.dev/agent-pool";
const SECRET = "warmstart-cluster-agent-credentials";

// --- the control plane, in-process on a temp database, restartable on the same port ----------

interface Cp {
  url: string;
  operator: ControlPlaneClient;
  /** Gives `clusterId` its registration token (`tokenOf(clusterId)`) in the token file. */
  allow(clusterId: string): Promise<string>;
  /** With TLS: the CA file that signed the serving certificate. */
  caFile: string | undefined;
  stop(): Promise<void>;
  start(): Promise<void>;
}

async function controlPlane(
  t: TestContext,
  opts: { credentialTtlSeconds?: number; visibilityTimeoutSeconds?: number; tls?: boolean } = {},
): Promise<Cp> {
  const dir = await mkdtemp(join(tmpdir(), "warmstart-agent-cp-"));
  const tokenFile = join(dir, "cluster-tokens");
  let server: ControlPlane | undefined;
  let port = 0;
  const { tls, ...settings } = opts;
  let caFile: string | undefined;
  let ca: string | undefined;
  const tlsFiles: { tlsCertFile?: string; tlsKeyFile?: string } = {};
  if (tls) {
    const authority = await createCA("agent test CA");
    const leaf = await issueCert(authority, {
      commonName: "control-plane",
      ips: ["127.0.0.1"],
      usage: "server",
    });
    ca = authority.cert;
    caFile = join(dir, "ca.crt");
    tlsFiles.tlsCertFile = join(dir, "tls.crt");
    tlsFiles.tlsKeyFile = join(dir, "tls.key");
    await writeFile(caFile, authority.cert);
    await writeFile(tlsFiles.tlsCertFile, leaf.cert);
    await writeFile(tlsFiles.tlsKeyFile, leaf.key, { mode: 0o600 });
  }
  const start = async (): Promise<void> => {
    server = await startControlPlane({
      dbPath: join(dir, "cp.db"),
      port,
      host: "127.0.0.1",
      clusterTokenFile: tokenFile,
      operatorToken: OPERATOR_TOKEN,
      // The tests' namespaces are made up as they go; the agents' own lists confine them.
      allowedNamespaces: ["*"],
      heartbeatIntervalSeconds: 1,
      logger: pino({ level: "silent" }),
      ...tlsFiles,
      ...settings,
    });
    port = server.port;
  };
  await start();
  const url = `${tls ? "https" : "http"}://127.0.0.1:${port}`;
  t.after(async () => {
    await server?.close();
    await rm(dir, { recursive: true, force: true });
  });
  return {
    url,
    operator: new ControlPlaneClient({ baseUrl: url, token: OPERATOR_TOKEN, ...(ca ? { ca } : {}) }),
    caFile,
    allow: async (clusterId) => {
      const text =
        (await readFile(tokenFile, "utf8").catch(() => "")) + `${clusterId}=${tokenOf(clusterId)}\n`;
      await writeFile(tokenFile, text, { mode: 0o600 });
      return tokenOf(clusterId);
    },
    start,
    stop: async () => {
      await server?.close();
      server = undefined;
    },
  };
}

// --- a tiny HTTP proxy in front of the control plane: delays, blocks and records calls --------

interface CredentialCall {
  seq: number;
  path: string;
  startedAt: number;
  endedAt: number;
  token?: string;
}

interface Proxy {
  url: string;
  delays: Map<RegExp, number>;
  blocked: Set<RegExp>;
  /** Rewrites request bodies on their way to the control plane (plays a control plane that ignores a field). */
  rewrite: ((path: string, body: Buffer) => Buffer) | undefined;
  credentialCalls: CredentialCall[];
  maxConcurrentCredentialCalls: number;
}

async function proxy(t: TestContext, target: string): Promise<Proxy> {
  const p: Proxy = {
    url: "",
    delays: new Map(),
    blocked: new Set(),
    rewrite: undefined,
    credentialCalls: [],
    maxConcurrentCredentialCalls: 0,
  };
  const to = new URL(target);
  let seq = 0;
  let credentialInFlight = 0;
  const server = createServer((req, res) => {
    const path = req.url ?? "/";
    const isCredential = /\/register$|\/credentials\/renew$/.test(path);
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      void (async () => {
        const call: CredentialCall = { seq: ++seq, path, startedAt: Date.now(), endedAt: 0 };
        if (isCredential) {
          credentialInFlight++;
          p.maxConcurrentCredentialCalls = Math.max(p.maxConcurrentCredentialCalls, credentialInFlight);
        }
        try {
          if ([...p.blocked].some((r) => r.test(path))) {
            res
              .writeHead(503, { "content-type": "application/json" })
              .end(JSON.stringify({ error: "blocked by test" }));
            return;
          }
          const delay = [...p.delays].find(([r]) => r.test(path))?.[1] ?? 0;
          if (delay) await sleep(delay);
          const raw = Buffer.concat(chunks);
          const body = p.rewrite ? p.rewrite(path, raw) : raw;
          const { "content-length": _length, ...headers } = req.headers;
          const answer = await forward(
            to,
            req.method ?? "GET",
            path,
            { ...headers, "content-length": String(body.length) },
            body,
          );
          if (isCredential && answer.status === 200) {
            call.token = (
              JSON.parse(answer.body.toString()) as { credentials: { token: string } }
            ).credentials.token;
          }
          res.writeHead(answer.status, answer.headers).end(answer.body);
        } catch {
          res
            .writeHead(502, { "content-type": "application/json" })
            .end(JSON.stringify({ error: "upstream down" }));
        } finally {
          if (isCredential) {
            credentialInFlight--;
            call.endedAt = Date.now();
            p.credentialCalls.push(call);
          }
        }
      })();
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  p.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  t.after(async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });
  return p;
}

function forward(
  to: URL,
  method: string,
  path: string,
  headers: IncomingHttpHeaders,
  body: Buffer,
): Promise<{ status: number; headers: IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const r = request(
      {
        host: to.hostname,
        port: to.port,
        method,
        path,
        headers: { ...headers, host: to.host, connection: "close" },
      },
      (res) => {
        const out: Buffer[] = [];
        res.on("data", (c: Buffer) => out.push(c));
        res.on("end", () => {
          const h = { ...res.headers };
          delete h["transfer-encoding"];
          delete h.connection;
          resolve({ status: res.statusCode ?? 502, headers: h, body: Buffer.concat(out) });
        });
        res.on("error", reject);
      },
    );
    r.on("error", reject);
    r.end(body);
  });
}

// --- simulated GPU nodes of this test's own pool ----------------------------------------------

interface Pool {
  label: string;
  gpuType: string;
  nodes: Set<string>;
  add(gpus?: number): Promise<string>;
  remove(name: string): Promise<void>;
}

async function pool(t: TestContext): Promise<Pool> {
  const { core } = await kube();
  const id = uniqueName("p");
  const p: Pool = {
    label: `${POOL_LABEL}=${id}`,
    gpuType: `TEST-GPU-${id}`,
    nodes: new Set(),
    async add(gpus = 4) {
      const name = uniqueName("agent-gpu");
      const node = simulatedNode({ name, gpus, product: p.gpuType });
      node.metadata!.labels![POOL_LABEL] = id;
      await core.createNode({ body: node });
      p.nodes.add(name);
      await setNodeGpus(core, name, gpus);
      return name;
    },
    async remove(name) {
      await core.deleteNode({ name }).catch((err: unknown) => {
        if (!isNotFound(err)) throw err;
      });
      p.nodes.delete(name);
    },
  };
  t.after(async () => {
    for (const n of [...p.nodes]) await p.remove(n);
  });
  return p;
}

// --- the agent --------------------------------------------------------------------------------

/** Short intervals so a whole GPU cycle takes seconds. */
function agentConfig(
  cpUrl: string,
  clusterId: string,
  namespace: string,
  nodeSelector: string,
  extra: Partial<AgentConfigInput> = {},
) {
  return loadConfig(
    {
      controlPlaneUrl: cpUrl,
      clusterToken: tokenOf(clusterId),
      clusterId,
      namespace,
      nodeSelector,
      gpuPollInterval: "1s",
      debounce: "500ms",
      backoffCap: "4s",
      heartbeatInterval: "1s",
      queueWait: "1s",
      statusInterval: "1s",
      listenHost: "127.0.0.1",
      port: 0,
      ...extra,
    },
    {},
  );
}

async function startAgent(
  t: TestContext,
  cfg: ReturnType<typeof agentConfig>,
  more: { hooks?: AgentHooks; kubeConfig?: k8s.KubeConfig } = {},
): Promise<{ agent: ClusterAgent; entries: LogEntry[] }> {
  const kc = more.kubeConfig ?? (await kube()).kc;
  const logs = memoryLogger();
  const agent = new ClusterAgent({
    config: cfg,
    kubeConfig: kc,
    log: logs.log,
    ...(more.hooks ? { hooks: more.hooks } : {}),
  });
  await agent.start();
  t.after(() => agent.stop());
  return { agent, entries: logs.entries };
}

async function get(url: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(url);
  const text = await res.text();
  return {
    status: res.status,
    body: (res.headers.get("content-type")?.includes("json") ? JSON.parse(text) : { text }) as Record<
      string,
      unknown
    >,
  };
}

async function requestStatus(cp: Cp, id: string): Promise<RequestStatus> {
  return (await cp.operator.getRequest(id)).status;
}

async function clusterCapacity(cp: Cp, clusterId: string): Promise<number | undefined> {
  return (await cp.operator.listClusters()).find((c) => c.clusterId === clusterId)?.capacity;
}

async function readSecretToken(namespace: string): Promise<string | undefined> {
  const { core } = await kube();
  const s = await core.readNamespacedSecret({ name: SECRET, namespace }).catch(() => undefined);
  const b64 = s?.data?.token;
  return b64 ? Buffer.from(b64, "base64").toString("utf8") : undefined;
}

async function deploymentsOf(namespace: string, requestId: string): Promise<k8s.V1Deployment[]> {
  const { apps } = await kube();
  return (
    await apps.listNamespacedDeployment({ namespace, labelSelector: `${LABEL_REQUEST_ID}=${requestId}` })
  ).items;
}

// --- the tests --------------------------------------------------------------------------------

void test("no GPUs: alive, not ready, nothing consumed; a GPU node appears: registered, ready, and a request runs on it", async (t) => {
  const cp = await controlPlane(t);
  const gpus = await pool(t);
  const agentNs = await tempNamespace(t, "agent");
  const workNs = await tempNamespace(t, "work", SKIP_CACHE);
  const clusterId = uniqueName("ca");
  await cp.allow(clusterId);
  const kubeconfig = process.env.KUBECONFIG ?? (await localCluster())?.kubeconfig;
  assert.ok(kubeconfig, "a kubeconfig for the child process");

  // A request waiting for this GPU type before any cluster has it.
  const { id } = await cp.operator.submit({
    name: "llm",
    namespace: workNs,
    model: "org/model-7b",
    image: "vllm/vllm-openai:v0.6.3",
    gpus: 2,
    gpuType: gpus.gpuType,
    replicas: 2,
  });

  // The real command, as a child process: it must not crash-loop with no GPUs.
  const child = spawn(
    process.execPath,
    [
      "bin/warmstart",
      "cluster-agent",
      "--kubeconfig",
      kubeconfig,
      "--namespace",
      agentNs,
      "--namespaces",
      workNs,
      "--node-selector",
      gpus.label,
      "--port",
      "0",
      "--listen-host",
      "127.0.0.1",
      "--gpu-poll-interval",
      "1s",
      "--debounce",
      "500ms",
      "--backoff-cap",
      "4s",
      "--queue-wait",
      "1s",
      "--status-interval",
      "1s",
    ],
    {
      env: {
        ...process.env,
        WARMSTART_CONTROL_PLANE_URL: cp.url,
        WARMSTART_CLUSTER_TOKEN: tokenOf(clusterId),
        WARMSTART_CLUSTER_ID: clusterId,
        WARMSTART_LOG_FORMAT: "json",
      },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
  t.after(() => {
    if (child.exitCode === null) child.kill("SIGKILL");
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  const url = await waitFor(
    "the agent's URL",
    () => {
      if (child.exitCode !== null)
        throw new Error(`the agent exited ${child.exitCode}: ${stderr.slice(-2000)}`);
      return /listening on (http:\/\/\S+)/.exec(stdout)?.[1];
    },
    20_000,
  );

  await sleep(3000); // several poll periods with no GPUs
  assert.equal(child.exitCode, null, "still running");
  assert.equal((await get(`${url}/livez`)).status, 200);
  assert.equal((await get(`${url}/version`)).status, 200);
  const notReady = await get(`${url}/healthz`);
  assert.equal(notReady.status, 503);
  assert.equal(notReady.body.ready, false);
  assert.equal(notReady.body.reason, "no GPUs in the cluster");
  assert.equal(notReady.body.paused, true);
  assert.equal(await requestStatus(cp, id), "Pending", "nothing consumed");
  assert.equal(await readSecretToken(agentNs), undefined, "no registration without GPUs");
  assert.equal(await clusterCapacity(cp, clusterId), undefined);

  // GPUs arrive.
  const appeared = Date.now();
  const node = await gpus.add(4);
  await waitFor("/healthz 200", async () => (await get(`${url}/healthz`)).status === 200, 30_000);
  const timeToReady = Date.now() - appeared;
  t.diagnostic(`time to ready after the GPU node appeared: ${timeToReady} ms (debounce 500 ms)`);
  assert.equal(await clusterCapacity(cp, clusterId), 4);
  await waitFor("credentials saved in the Secret", () => readSecretToken(agentNs), 10_000);
  const ready = await get(`${url}/healthz`);
  assert.equal(ready.body.paused, false);
  assert.deepEqual(ready.body.gpuTypes, [{ gpuType: gpus.gpuType, count: 4 }]);

  // The waiting request becomes a Deployment whose pods run on this pool's node.
  const pods = await waitFor(
    "2 Ready pods of the request",
    async () => {
      const items = await listPods(workNs, `${LABEL_REQUEST_ID}=${id}`);
      return items.length === 2 && items.every(isPodReady) ? items : undefined;
    },
    60_000,
  );
  for (const p of pods) assert.equal(p.spec?.nodeName, node, "placed on the pool's GPU node");
  const [dep] = await deploymentsOf(workNs, id);
  assert.equal(dep?.metadata?.name, "llm");
  assert.deepEqual(dep?.spec?.template.spec?.containers[0]?.args, ["--model", "org/model-7b"]);
  assert.equal(dep?.spec?.template.spec?.containers[0]?.resources?.limits?.["nvidia.com/gpu"], "2");
  const { core } = await kube();
  // The Service is applied after the Deployment, whose pods may be Ready first.
  await waitFor(
    "the request's Service",
    () => core.readNamespacedService({ name: "llm", namespace: workNs }),
    10_000,
  );
  const view = await waitFor("status Running at the control plane", async () => {
    const r = await cp.operator.getRequest(id);
    return r.status === "Running" ? r : undefined;
  });
  assert.deepEqual(
    view.instances.map((i) => i.ready),
    [true, true],
  );
  const metrics = (await get(`${url}/metrics`)).body.text as string;
  assert.match(metrics, /warmstart_cluster_agent_ready 1/);
  assert.match(metrics, new RegExp(`warmstart_cluster_agent_gpus\\{gpu_type="${gpus.gpuType}"\\} 4`));
  assert.match(metrics, /warmstart_cluster_agent_messages_total\{queue="deploy",outcome="accepted"\} 1/);

  // SIGTERM: a clean exit 0.
  child.kill("SIGTERM");
  assert.equal(await exited, 0, `exit 0 on SIGTERM; stderr tail:\n${stderr.slice(-2000)}`);
  const lines = stderr
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l) as LogEntry);
  assert.equal(lines.filter((l) => l.level >= 50).length, 0, "no error-level lines");
  assert.ok(lines.some((l) => l.msg === "stopped"));
});

void test("with --graceful-no-gpu false and no GPUs the agent exits 1 instead of waiting", async (t) => {
  const cp = await controlPlane(t);
  const gpus = await pool(t);
  const agentNs = await tempNamespace(t, "agent");
  const kubeconfig = process.env.KUBECONFIG ?? (await localCluster())?.kubeconfig;
  assert.ok(kubeconfig);
  const child = spawn(
    process.execPath,
    [
      "bin/warmstart",
      "cluster-agent",
      "--kubeconfig",
      kubeconfig,
      "--namespace",
      agentNs,
      "--node-selector",
      gpus.label,
      "--port",
      "0",
      "--listen-host",
      "127.0.0.1",
      "--graceful-no-gpu",
      "false",
    ],
    {
      env: {
        ...process.env,
        WARMSTART_CONTROL_PLANE_URL: cp.url,
        WARMSTART_CLUSTER_TOKEN: tokenOf("never-registers"),
        WARMSTART_CLUSTER_ID: "never-registers",
        WARMSTART_LOG_FORMAT: "json",
      },
      stdio: ["ignore", "ignore", "pipe"],
    },
  );
  t.after(() => {
    if (child.exitCode === null) child.kill("SIGKILL");
  });
  let stderr = "";
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  const code = await new Promise<number | null>((r) => child.once("exit", (c) => r(c)));
  assert.equal(code, 1);
  assert.match(stderr, /no GPUs in the cluster and --graceful-no-gpu is off/);
});

void test("heartbeat instructions: cordon stops new work, drain removes the workloads, none resumes", async (t) => {
  const cp = await controlPlane(t);
  const gpus = await pool(t);
  const agentNs = await tempNamespace(t, "agent");
  const workNs = await tempNamespace(t, "work", SKIP_CACHE);
  const clusterId = uniqueName("ca");
  await cp.allow(clusterId);
  await gpus.add(4);
  const { agent } = await startAgent(
    t,
    agentConfig(cp.url, clusterId, agentNs, gpus.label, { namespaces: workNs }),
  );
  await waitFor("ready", async () => (await get(`${agent.url}/healthz`)).status === 200, 30_000);
  const first = await cp.operator.submit({
    name: "before-drain",
    namespace: workNs,
    model: "m",
    image: "img:1",
    gpuType: gpus.gpuType,
  });
  await waitFor("Running", async () => (await requestStatus(cp, first.id)) === "Running", 30_000);

  await cp.operator.setInstruction(clusterId, "drain");
  await waitFor(
    "workload removed by the drain",
    async () => (await deploymentsOf(workNs, first.id)).length === 0,
    15_000,
  );
  const drained = await waitFor("reported", async () => {
    const r = await cp.operator.getRequest(first.id);
    return r.status === "Failed" ? r : undefined;
  });
  assert.equal(drained.message, "removed: the cluster was drained");
  const h = await get(`${agent.url}/healthz`);
  assert.equal(h.body.cordoned, true);
  assert.equal(h.body.instruction, "drain");

  await cp.operator.setInstruction(clusterId, "none");
  await waitFor("cordon lifted", async () => (await get(`${agent.url}/healthz`)).body.cordoned === false);
  const second = await cp.operator.submit({
    name: "after-drain",
    namespace: workNs,
    model: "m",
    image: "img:1",
    gpuType: gpus.gpuType,
  });
  await waitFor(
    "new work taken again",
    async () => (await requestStatus(cp, second.id)) === "Running",
    30_000,
  );
});

void test("control plane down while GPUs arrive: not ready, retries with growing gaps as warnings, ready once it is back", async (t) => {
  const cp = await controlPlane(t);
  const gpus = await pool(t);
  const agentNs = await tempNamespace(t, "agent");
  const clusterId = uniqueName("ca");
  await cp.allow(clusterId);
  const { agent, entries } = await startAgent(t, agentConfig(cp.url, clusterId, agentNs, gpus.label));
  await waitFor("GPU state known", () => agent.monitor.current !== undefined);

  await cp.stop();
  await gpus.add(4);
  const failures = (): LogEntry[] => entries.filter((e) => e.msg === "registration failed; will retry");
  await waitFor("four failed registrations", () => failures().length >= 4, 30_000);
  const h = await get(`${agent.url}/healthz`);
  assert.equal(h.status, 503);
  assert.match(String(h.body.reason), /registration failing/);
  assert.equal(h.body.paused, true);
  assert.deepEqual(
    failures()
      .slice(0, 4)
      .map((e) => e.retryInMs),
    [1000, 2000, 4000, 4000],
    "first wait = poll interval, doubling, capped",
  );
  const times = failures().map((e) => e.time as number);
  const gaps = times.slice(1, 4).map((tm, i) => tm - times[i]!);
  t.diagnostic(`gaps between failed attempts: ${gaps.join(", ")} ms`);
  assert.ok(gaps[1]! > gaps[0]! + 500, `gaps grow: ${gaps.join(", ")}`);
  assert.ok(
    failures().every((e) => e.level === 40),
    "warnings",
  );
  assert.equal(entries.filter((e) => e.level >= 50).length, 0, "never an error");

  const back = Date.now();
  await cp.start();
  await waitFor(
    "/healthz 200 after the control plane is back",
    async () => (await get(`${agent.url}/healthz`)).status === 200,
    15_000,
  );
  t.diagnostic(`ready ${Date.now() - back} ms after the control plane came back (cap 4 s)`);
  assert.equal(await clusterCapacity(cp, clusterId), 4);
});

void test("last GPU node removed: not ready, paused, capacity 0 reported; three 0 → GPUs → 0 cycles without a restart", async (t) => {
  const cp = await controlPlane(t);
  const gpus = await pool(t);
  const agentNs = await tempNamespace(t, "agent");
  const clusterId = uniqueName("ca");
  await cp.allow(clusterId);
  const { agent, entries } = await startAgent(t, agentConfig(cp.url, clusterId, agentNs, gpus.label));
  const health = async (): Promise<{ status: number; body: Record<string, unknown> }> =>
    get(`${agent.url}/healthz`);
  await waitFor(
    "not ready with no GPUs",
    async () => (await health()).body.reason === "no GPUs in the cluster",
  );

  const cycleTimes: number[] = [];
  for (let cycle = 0; cycle < 3; cycle++) {
    const t0 = Date.now();
    const a = await gpus.add(4);
    const b = await gpus.add(2);
    await waitFor(`cycle ${cycle}: ready`, async () => (await health()).status === 200, 30_000);
    cycleTimes.push(Date.now() - t0);
    await waitFor(
      `cycle ${cycle}: capacity 6 at the control plane`,
      async () => (await clusterCapacity(cp, clusterId)) === 6,
    );
    await gpus.remove(a);
    await waitFor(
      `cycle ${cycle}: capacity 2`,
      async () => (await clusterCapacity(cp, clusterId)) === 2,
      30_000,
    );
    assert.equal((await health()).status, 200, "still ready with one node left");
    await gpus.remove(b);
    const h = await waitFor(
      `cycle ${cycle}: not ready`,
      async () => {
        const r = await health();
        return r.status === 503 ? r : undefined;
      },
      30_000,
    );
    assert.equal(h.body.reason, "no GPUs in the cluster");
    assert.equal(h.body.paused, true);
    await waitFor(
      `cycle ${cycle}: capacity 0 at the control plane`,
      async () => (await clusterCapacity(cp, clusterId)) === 0,
    );
    const view = (await cp.operator.listClusters()).find((c) => c.clusterId === clusterId);
    assert.equal(view?.schedulable, false);
  }
  t.diagnostic(`time to ready per cycle: ${cycleTimes.join(", ")} ms`);
  assert.equal(entries.filter((e) => e.level >= 50).length, 0);
  const metrics = (await get(`${agent.url}/metrics`)).body.text as string;
  assert.match(metrics, /warmstart_cluster_agent_ready 0/);
});

void test("renewal racing re-registration through a slow control plane never leaves older credentials installed", async (t) => {
  const cp = await controlPlane(t, { credentialTtlSeconds: 2 });
  const px = await proxy(t, cp.url);
  // Both calls slow, renewal slower: unserialized, a renewal started first would answer last.
  px.delays.set(/\/register$/, 400);
  px.delays.set(/\/credentials\/renew$/, 900);
  const gpus = await pool(t);
  const agentNs = await tempNamespace(t, "agent");
  const clusterId = uniqueName("ca");
  await cp.allow(clusterId);
  // Renewal falls due 1 s after each install (half the lifetime, the most renew-before may be),
  // and so does the periodic re-registration.
  const { agent, entries } = await startAgent(
    t,
    agentConfig(px.url, clusterId, agentNs, gpus.label, { renewBefore: "1s", refreshInterval: "1s" }),
  );
  await gpus.add(4);
  await waitFor("ready", async () => (await get(`${agent.url}/healthz`)).status === 200, 30_000);

  // Watch what is installed while the two keep racing; add an inventory change for good measure.
  const installed: { token: string; generation: number }[] = [];
  const deadline = Date.now() + 12_000;
  let changed = false;
  while (Date.now() < deadline) {
    const c = agent.registration.installed;
    if (c && installed.at(-1)?.token !== c.token)
      installed.push({ token: c.token, generation: c.generation });
    if (!changed && Date.now() > deadline - 5000) {
      changed = true;
      await gpus.add(2);
    }
    await sleep(20);
  }
  await agent.stop();
  const kinds = px.credentialCalls.map((c) => (c.path.endsWith("/renew") ? "renew" : "register"));
  t.diagnostic(`credential calls: ${kinds.join(" ")}`);
  assert.ok(kinds.filter((k) => k === "renew").length >= 3, "several renewals");
  assert.ok(kinds.filter((k) => k === "register").length >= 3, "several re-registrations");
  assert.equal(px.maxConcurrentCredentialCalls, 1, "registration and renewal never overlap");

  // Every installed token came from a call started later than the one before it.
  const seqOf = new Map(px.credentialCalls.filter((c) => c.token).map((c) => [c.token!, c.seq]));
  const seqs = installed.map((i) => seqOf.get(i.token) ?? 0).filter((s) => s > 0);
  assert.deepEqual(
    seqs,
    [...seqs].sort((a, b) => a - b),
    "installed in the order the calls started",
  );
  assert.deepEqual(
    installed.map((i) => i.generation),
    [...installed.map((i) => i.generation)].sort((a, b) => a - b),
  );
  // What stays installed (memory and Secret) is the newest credential the control plane issued.
  const newest = px.credentialCalls.filter((c) => c.token).sort((a, b) => b.seq - a.seq)[0];
  assert.equal(agent.registration.installed?.token, newest?.token);
  assert.equal(await readSecretToken(agentNs), newest?.token);
  assert.ok(
    !entries.some((e) => e.msg === "ignoring credentials older than the installed ones"),
    "the gate kept them ordered",
  );
});

void test("a redelivered request creates no second workload, across an agent restart; a termination removes it", async (t) => {
  const cp = await controlPlane(t, { visibilityTimeoutSeconds: 2 });
  const px = await proxy(t, cp.url);
  const gpus = await pool(t);
  const agentNs = await tempNamespace(t, "agent");
  const workNs = await tempNamespace(t, "work", SKIP_CACHE);
  const clusterId = uniqueName("ca");
  await cp.allow(clusterId);
  const cfg = agentConfig(px.url, clusterId, agentNs, gpus.label, {
    visibilityTimeout: "2s",
    namespaces: workNs,
  });
  await gpus.add(4);
  const first = await startAgent(t, cfg);
  await waitFor("ready", async () => (await get(`${first.agent.url}/healthz`)).status === 200, 30_000);

  // Acknowledgements and releases fail: the request is applied but its message comes back.
  px.blocked.add(/\/queues\/ack$/);
  px.blocked.add(/\/queues\/release$/);
  const { id } = await cp.operator.submit({
    name: "redelivered",
    namespace: workNs,
    model: "m",
    image: "img:1",
    gpuType: gpus.gpuType,
    replicas: 1,
  });
  const [dep] = await waitFor("the Deployment", async () => {
    const d = await deploymentsOf(workNs, id);
    return d.length ? d : undefined;
  });
  await waitFor(
    "a redelivery, recognised",
    () =>
      first.entries.some(
        (e) =>
          e.msg === "redelivered message already handled; acknowledging it again" ||
          e.msg === "request already handled; acknowledging without creating it again",
      ),
    10_000,
  );
  await first.agent.stop();
  const registrationsBefore = px.credentialCalls.filter((c) => c.path.endsWith("/register")).length;

  // A new agent (empty memory) takes over with the saved credentials; deliveries resume.
  const second = await startAgent(t, cfg);
  px.blocked.clear();
  const dup = await waitFor(
    "the redelivery, recognised from the record in the cluster",
    () =>
      second.entries.find(
        (e) => e.msg === "request already handled; acknowledging without creating it again",
      ),
    15_000,
  );
  assert.ok(
    (dup.receiveCount as number) >= 2,
    `a real redelivery (receiveCount ${String(dup.receiveCount)})`,
  );
  assert.equal(
    px.credentialCalls.filter((c) => c.path.endsWith("/register")).length,
    registrationsBefore,
    "resumed from the Secret without registering first",
  );
  await waitFor("the queue drained at the control plane", async () => {
    const c = (await cp.operator.listClusters()).find((x) => x.clusterId === clusterId);
    return c?.queueDepth.deploy === 0;
  });
  const after = await deploymentsOf(workNs, id);
  assert.equal(after.length, 1, "one Deployment");
  assert.equal(after[0]?.metadata?.uid, dep?.metadata?.uid, "the same one, never recreated");
  assert.equal(after[0]?.metadata?.generation, 1, "never re-applied with changes");
  const { apps, core } = await kube();
  const rs = await apps.listNamespacedReplicaSet({
    namespace: workNs,
    labelSelector: `${LABEL_REQUEST_ID}=${id}`,
  });
  assert.equal(rs.items.length, 1);
  await waitFor("status Running", async () => (await requestStatus(cp, id)) === "Running", 30_000);

  // Termination (processed even while cordoned).
  await cp.operator.setInstruction(clusterId, "cordon");
  await waitFor("cordoned", async () => (await get(`${second.agent.url}/healthz`)).body.cordoned === true);
  await cp.operator.terminate(id);
  await waitFor(
    "Terminated at the control plane",
    async () => (await requestStatus(cp, id)) === "Terminated",
    30_000,
  );
  assert.equal((await deploymentsOf(workNs, id)).length, 0, "Deployment gone");
  await assert.rejects(core.readNamespacedService({ name: "redelivered", namespace: workNs }), (e) =>
    isNotFound(e),
  );
  const rec = await core.readNamespacedConfigMap({ name: recordName(id), namespace: agentNs });
  assert.equal(rec.data?.state, "terminated", "a tombstone keeps late redeliveries out");
});

void test("control plane restarted on the same database: registration, queues and unacknowledged requests survive", async (t) => {
  const cp = await controlPlane(t, { visibilityTimeoutSeconds: 2 });
  const px = await proxy(t, cp.url);
  const gpus = await pool(t);
  const agentNs = await tempNamespace(t, "agent");
  const workNs = await tempNamespace(t, "work", SKIP_CACHE);
  const clusterId = uniqueName("ca");
  await cp.allow(clusterId);
  await gpus.add(4);
  const { agent, entries } = await startAgent(
    t,
    agentConfig(px.url, clusterId, agentNs, gpus.label, { visibilityTimeout: "2s", namespaces: workNs }),
  );
  await waitFor("ready", async () => (await get(`${agent.url}/healthz`)).status === 200, 30_000);
  const registrations = (): number => px.credentialCalls.filter((c) => c.path.endsWith("/register")).length;

  // A: delivered and applied, never acknowledged.
  px.blocked.add(/\/queues\/ack$/);
  const a = await cp.operator.submit({
    name: "unacked",
    namespace: workNs,
    model: "m",
    image: "img:1",
    gpuType: gpus.gpuType,
  });
  await waitFor("A applied", async () => (await deploymentsOf(workNs, a.id)).length === 1);
  // B: queued, never delivered.
  px.blocked.add(/\/queues\/receive$/);
  await sleep(1500); // let a long poll in flight finish
  const b = await cp.operator.submit({
    name: "queued",
    namespace: workNs,
    model: "m",
    image: "img:1",
    gpuType: gpus.gpuType,
  });
  assert.equal(b.status, "Queued");
  const before = registrations();

  await cp.stop();
  await sleep(1500);
  await cp.start();
  const view = (await cp.operator.listClusters()).find((c) => c.clusterId === clusterId);
  assert.equal(view?.capacity, 4, "the registration survived");
  assert.ok((view?.queueDepth.deploy ?? 0) >= 2, "both messages are still on the queue");
  assert.equal(await requestStatus(cp, b.id), "Queued");

  px.blocked.clear();
  await waitFor("B deployed", async () => (await deploymentsOf(workNs, b.id)).length === 1, 30_000);
  await waitFor(
    "both Running",
    async () =>
      (await requestStatus(cp, a.id)) === "Running" && (await requestStatus(cp, b.id)) === "Running",
    30_000,
  );
  await waitFor(
    "the queue drained",
    async () =>
      (await cp.operator.listClusters()).find((c) => c.clusterId === clusterId)?.queueDepth.deploy === 0,
  );
  assert.equal((await deploymentsOf(workNs, a.id)).length, 1, "A was not created twice");
  assert.equal(
    registrations(),
    before,
    "the agent carried on with its credentials; no new registration needed",
  );
  assert.equal((await get(`${agent.url}/healthz`)).status, 200);
  assert.equal(entries.filter((e) => e.level >= 50).length, 0);
});

void test("a deploy and a termination of the same request at once: the termination wins, nothing comes back", async (t) => {
  const cp = await controlPlane(t);
  const gpus = await pool(t);
  const agentNs = await tempNamespace(t, "agent");
  const workNs = await tempNamespace(t, "work", SKIP_CACHE);
  const clusterId = uniqueName("ca");
  await cp.allow(clusterId);
  await gpus.add(4);

  // The deploy stops between recording the request and creating its workload; the termination
  // then runs (or, with the per-request lock, queues behind it); only then does the deploy go on.
  const deployPaused = deferred();
  const resumeDeploy = deferred();
  const terminationRanOrQueued = deferred();
  const deployDone = deferred<string>();
  const terminationDone = deferred<string>();
  let paused = false;
  const hooks: AgentHooks = {
    beforeApply: async () => {
      if (paused) return;
      paused = true;
      deployPaused.resolve();
      await resumeDeploy.promise;
    },
    requestLockWait: () => terminationRanOrQueued.resolve(),
    handled: (queue, _msg, outcome) => {
      if (queue === "termination") {
        terminationRanOrQueued.resolve();
        terminationDone.resolve(outcome);
      } else deployDone.resolve(outcome);
    },
  };
  const { agent } = await startAgent(
    t,
    agentConfig(cp.url, clusterId, agentNs, gpus.label, { namespaces: workNs }),
    { hooks },
  );
  await waitFor("ready", async () => (await get(`${agent.url}/healthz`)).status === 200, 30_000);

  const { id } = await cp.operator.submit({
    name: "cancelled",
    namespace: workNs,
    model: "m",
    image: "img:1",
    gpuType: gpus.gpuType,
  });
  await deployPaused.promise;
  const { core } = await kube();
  const rec = await core.readNamespacedConfigMap({ name: recordName(id), namespace: agentNs });
  assert.equal(rec.data?.state, "accepted", "paused after the record, before the workload");
  assert.equal((await cp.operator.terminate(id)).status, "Terminating");
  await terminationRanOrQueued.promise;
  resumeDeploy.resolve();
  t.diagnostic(`deploy: ${await deployDone.promise}, termination: ${await terminationDone.promise}`);

  await waitFor(
    "Terminated at the control plane",
    async () => (await requestStatus(cp, id)) === "Terminated",
  );
  assert.deepEqual(await deploymentsOf(workNs, id), [], "the cancelled workload did not come back");
  await assert.rejects(core.readNamespacedService({ name: "cancelled", namespace: workNs }), (e) =>
    isNotFound(e),
  );
  const after = await core.readNamespacedConfigMap({ name: recordName(id), namespace: agentNs });
  assert.equal(after.data?.state, "terminated");
});

void test("a request outside the agent's namespaces is refused even when the control plane sends it", async (t) => {
  const cp = await controlPlane(t);
  const px = await proxy(t, cp.url);
  // Play a control plane that ignores which namespaces the agent deploys into.
  px.rewrite = (path, body) => {
    if (!path.endsWith("/register")) return body;
    const { namespaces: _dropped, ...rest } = JSON.parse(body.toString()) as Record<string, unknown>;
    return Buffer.from(JSON.stringify(rest));
  };
  const gpus = await pool(t);
  const agentNs = await tempNamespace(t, "agent");
  const workNs = await tempNamespace(t, "work", SKIP_CACHE);
  const otherNs = await tempNamespace(t, "other", SKIP_CACHE);
  const clusterId = uniqueName("ca");
  await cp.allow(clusterId);
  await gpus.add(4);
  const { agent, entries } = await startAgent(
    t,
    agentConfig(px.url, clusterId, agentNs, gpus.label, { namespaces: workNs }),
  );
  await waitFor("ready", async () => (await get(`${agent.url}/healthz`)).status === 200, 30_000);
  assert.equal((await cp.operator.listClusters())[0]?.namespaces, null, "the control plane was not told");

  const { id } = await cp.operator.submit({
    name: "elsewhere",
    namespace: otherNs,
    model: "m",
    image: "img:1",
    gpuType: gpus.gpuType,
  });
  const failed = await waitFor("reported Failed", async () => {
    const r = await cp.operator.getRequest(id);
    return r.status === "Failed" ? r : undefined;
  });
  assert.match(
    failed.message ?? "",
    new RegExp(`namespace ${otherNs} is not one this cluster agent deploys into`),
  );
  const { apps } = await kube();
  assert.deepEqual((await apps.listNamespacedDeployment({ namespace: otherNs })).items, []);
  assert.ok(
    entries.some((e) => e.msg === "request refused: its namespace is not one this agent deploys into"),
  );

  // Its own namespace still works.
  const ok = await cp.operator.submit({
    name: "inside",
    namespace: workNs,
    model: "m",
    image: "img:1",
    gpuType: gpus.gpuType,
  });
  await waitFor("Running", async () => (await requestStatus(cp, ok.id)) === "Running", 30_000);
});

/** The objects of deploy/cluster-agent.yaml, moved into this test's namespaces and names. */
async function manifestRbac(
  agentNs: string,
  workNs: string,
  suffix: string,
): Promise<k8s.KubernetesObject[]> {
  const text = await readFile(new URL("../../../deploy/cluster-agent.yaml", import.meta.url), "utf8");
  const docs = parseAllDocuments(text).map((d) => d.toJSON() as k8s.KubernetesObject);
  const kinds = new Set(["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]);
  const moved = JSON.stringify(docs.filter((d) => kinds.has(d.kind ?? "")))
    .replaceAll('"warmstart-system"', JSON.stringify(agentNs))
    .replaceAll('"model-serving"', JSON.stringify(workNs));
  return (JSON.parse(moved) as (k8s.KubernetesObject & { roleRef?: { kind: string; name: string } })[]).map(
    (o) => {
      // Cluster-scoped names are shared by every test run: make them this test's own.
      if (o.kind === "ClusterRole" || o.kind === "ClusterRoleBinding") o.metadata!.name += `-${suffix}`;
      if (o.kind === "ClusterRoleBinding") o.roleRef!.name += `-${suffix}`;
      return o;
    },
  );
}

void test("with only the RBAC of deploy/cluster-agent.yaml the agent runs its namespace's workloads over TLS, and can write nowhere else", async (t) => {
  const cp = await controlPlane(t, { tls: true });
  const gpus = await pool(t);
  const agentNs = await tempNamespace(t, "agent");
  const workNs = await tempNamespace(t, "work", SKIP_CACHE);
  const otherNs = await tempNamespace(t, "other", SKIP_CACHE);
  const clusterId = uniqueName("ca");
  await cp.allow(clusterId);
  await gpus.add(4);

  const { kc, core } = await kube();
  const objects = k8s.KubernetesObjectApi.makeApiClient(kc);
  const rbac = await manifestRbac(agentNs, workNs, clusterId);
  assert.deepEqual(
    rbac.filter((o) => o.kind === "ClusterRole").map((o) => (o as k8s.V1ClusterRole).rules),
    [[{ apiGroups: [""], resources: ["nodes"], verbs: ["list", "watch"] }]],
    "nothing but reading nodes is granted cluster-wide",
  );
  for (const o of rbac) await objects.create(o);
  t.after(async () => {
    for (const o of rbac.filter((x) => !x.metadata?.namespace))
      await objects.delete(o).catch((err: unknown) => {
        if (!isNotFound(err)) throw err;
      });
  });

  // The agent's own identity: a ServiceAccount token, nothing of the admin kubeconfig but the CA.
  const token = await core.createNamespacedServiceAccountToken({
    name: "warmstart-cluster-agent",
    namespace: agentNs,
    body: { spec: { audiences: [], expirationSeconds: 3600 } },
  });
  const cluster = kc.getCurrentCluster()!;
  const asAgent = new k8s.KubeConfig();
  asAgent.loadFromOptions({
    clusters: [{ ...cluster, name: "c" }],
    users: [{ name: "agent", token: token.status!.token }],
    contexts: [{ name: "agent", cluster: "c", user: "agent" }],
    currentContext: "agent",
  });

  const { agent, entries } = await startAgent(
    t,
    agentConfig(cp.url, clusterId, agentNs, gpus.label, {
      namespaces: workNs,
      controlPlaneCaFile: cp.caFile!,
    }),
    { kubeConfig: asAgent },
  );
  await waitFor("ready", async () => (await get(`${agent.url}/healthz`)).status === 200, 30_000);
  assert.deepEqual((await cp.operator.listClusters())[0]?.namespaces, [workNs]);

  const secret = "hf_s3cretT0ken";
  const model = `https://user:${secret}@hub.example.com/org/model-7b`;
  const { id } = await cp.operator.submit({
    name: "llm",
    namespace: workNs,
    model,
    image: "img:1",
    gpuType: gpus.gpuType,
  });
  await waitFor("Running", async () => (await requestStatus(cp, id)) === "Running", 30_000);
  const [dep] = await deploymentsOf(workNs, id);
  assert.equal(
    dep?.metadata?.annotations?.["warmstart.dev/model"],
    "https://<redacted>@hub.example.com/org/model-7b",
  );
  assert.deepEqual(
    dep?.spec?.template.spec?.containers[0]?.args,
    ["--model", model],
    "the user's args as given",
  );
  assert.ok(!JSON.stringify(entries).includes(secret), "the agent never logs the credential");

  // The agent's identity, played as an attacker: no write outside its namespace, no reading secrets.
  const apps = asAgent.makeApiClient(k8s.AppsV1Api);
  const coreAsAgent = asAgent.makeApiClient(k8s.CoreV1Api);
  const forbidden = (err: unknown): boolean => (err as { code?: number }).code === 403;
  await assert.rejects(
    apps.createNamespacedDeployment({
      namespace: otherNs,
      body: {
        metadata: { name: "x" },
        spec: {
          selector: { matchLabels: { a: "b" } },
          template: { metadata: { labels: { a: "b" } }, spec: { containers: [{ name: "c", image: "i" }] } },
        },
      },
    }),
    forbidden,
  );
  await assert.rejects(coreAsAgent.listSecretForAllNamespaces(), forbidden);
  await assert.rejects(coreAsAgent.listPodForAllNamespaces(), forbidden);
  await assert.rejects(coreAsAgent.listNamespacedSecret({ namespace: workNs }), forbidden);

  await cp.operator.terminate(id);
  await waitFor("Terminated", async () => (await requestStatus(cp, id)) === "Terminated", 30_000);
  assert.deepEqual(await deploymentsOf(workNs, id), []);
});
