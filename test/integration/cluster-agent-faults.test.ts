/**
 * The cluster agent and the control plane killed (SIGKILL) at chosen points, then started again:
 * the real `warmstart cluster-agent` and `warmstart control-plane` processes, the real API server.
 * Kills are injected deterministically: a proxy in front of the control plane kills the agent when
 * its registration arrives or is answered; the fault proxy in front of the API server kills it
 * when it writes its credentials Secret; test/sqlite-crash.ts kills the control plane inside a
 * chosen transaction. Each test states its expected end and asserts it.
 */
import { test, type TestContext } from "node:test";
import assert from "node:assert/strict";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer, request, type IncomingHttpHeaders } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";
import { kube, localCluster, tempNamespace, uniqueName, waitFor } from "../harness.js";
import { FaultProxy } from "../fault-proxy.js";
import { ControlPlaneProcess, clusterTokenOf } from "../control-plane-process.js";
import type { CrashPoint } from "../sqlite-crash.js";
import { Seen, consume } from "../queue-consumer.js";
import { deferred } from "../support/testing.js";
import { isNotFound } from "../../src/common/kube.js";
import { setNodeGpus, simulatedNode } from "../../tools/localcluster/nodes.js";
import { ControlPlaneClient } from "../../src/control-plane/client.js";
import type { SubmitRequest } from "../../src/control-plane/api.js";
import { LABEL_REQUEST_ID } from "../../src/cluster-agent/workloads.js";

const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
const SECRET = "warmstart-cluster-agent-credentials";
const POOL_LABEL = "test.warmstart.dev/agent-pool";
// The agent's workloads, not the model cache: the admission webhook stays out of these namespaces.
const SKIP_CACHE = { "warmstart.dev/skip": "true" };

// --- a proxy in front of the control plane: sees every call, can act before and after it -------

interface Call {
  path: string;
  status: number;
  /** The credential a register or renew answered with. */
  token?: string;
}

type Before = (path: string) => Promise<"forward" | "drop"> | "forward" | "drop";
type After = (path: string, status: number) => Promise<"pass" | "drop"> | "pass" | "drop";

interface CpProxy {
  url: string;
  calls: Call[];
  before: Before | undefined;
  after: After | undefined;
  count(path: RegExp): number;
}

async function cpProxy(t: TestContext, target: () => string): Promise<CpProxy> {
  const p: CpProxy = {
    url: "",
    calls: [],
    before: undefined,
    after: undefined,
    count: (path) => p.calls.filter((c) => path.test(c.path) && c.status === 200).length,
  };
  const server = createServer((req, res) => {
    const path = req.url ?? "/";
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      void (async () => {
        if ((await p.before?.(path)) === "drop") {
          res.destroy();
          return;
        }
        let answer: { status: number; headers: IncomingHttpHeaders; body: Buffer };
        try {
          const body = Buffer.concat(chunks);
          const { "content-length": _length, ...headers } = req.headers;
          answer = await forward(new URL(target()), req.method ?? "GET", path, headers, body);
        } catch {
          // The control plane is down: the caller sees what it would see without the proxy.
          res.destroy();
          return;
        }
        const call: Call = { path, status: answer.status };
        if (/\/register$|\/credentials\/renew$/.test(path) && answer.status === 200)
          call.token = (
            JSON.parse(answer.body.toString()) as { credentials: { token: string } }
          ).credentials.token;
        p.calls.push(call);
        if ((await p.after?.(path, answer.status)) === "drop") {
          res.destroy();
          return;
        }
        res.writeHead(answer.status, answer.headers).end(answer.body);
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
        headers: { ...headers, "content-length": String(body.length), host: to.host, connection: "close" },
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

// --- simulated GPU nodes of the test's own pool ------------------------------------------------

interface Pool {
  selector: string;
  gpuType: string;
  add(gpus: number): Promise<string>;
}

async function pool(t: TestContext): Promise<Pool> {
  const { core } = await kube();
  const id = uniqueName("p");
  const nodes: string[] = [];
  t.after(async () => {
    for (const name of nodes)
      await core.deleteNode({ name }).catch((err: unknown) => {
        if (!isNotFound(err)) throw err;
      });
  });
  const gpuType = `FAULT-GPU-${id}`;
  return {
    selector: `${POOL_LABEL}=${id}`,
    gpuType,
    async add(gpus) {
      const name = uniqueName("fault-gpu");
      const node = simulatedNode({ name, gpus, product: gpuType });
      node.metadata!.labels![POOL_LABEL] = id;
      await core.createNode({ body: node });
      nodes.push(name);
      await setNodeGpus(core, name, gpus);
      return name;
    },
  };
}

// --- the agent as its real command --------------------------------------------------------------

interface AgentSetup {
  clusterId: string;
  controlPlaneUrl: string;
  kubeconfig: string;
  namespace: string;
  workNamespace: string;
  selector: string;
  extra?: string[];
}

interface AgentProcess {
  child: ChildProcess;
  /** Its URL, once it listens (rejects if it ends first). */
  listening: Promise<string>;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  logs(): { level: number; msg: string; [k: string]: unknown }[];
  kill(): void;
}

/** Starts the agent; returns at once, so a test can arm a kill before its first call. */
function spawnAgent(t: TestContext, s: AgentSetup): AgentProcess {
  const child = spawn(
    process.execPath,
    [
      join(ROOT, "bin/warmstart"),
      "cluster-agent",
      "--kubeconfig",
      s.kubeconfig,
      "--namespace",
      s.namespace,
      "--namespaces",
      s.workNamespace,
      "--node-selector",
      s.selector,
      "--listen-host",
      "127.0.0.1",
      "--port",
      "0",
      "--gpu-poll-interval",
      "1s",
      "--debounce",
      "300ms",
      "--backoff-cap",
      "2s",
      "--heartbeat-interval",
      "1s",
      "--queue-wait",
      "1s",
      "--status-interval",
      "1s",
      "--visibility-timeout",
      "3s",
      ...(s.extra ?? []),
    ],
    {
      cwd: ROOT,
      env: {
        ...process.env,
        WARMSTART_CONTROL_PLANE_URL: s.controlPlaneUrl,
        WARMSTART_CLUSTER_TOKEN: clusterTokenOf(s.clusterId),
        WARMSTART_CLUSTER_ID: s.clusterId,
        WARMSTART_LOG_FORMAT: "json",
      },
      stdio: ["ignore", "pipe", "pipe"],
    },
  );
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => resolve({ code, signal })),
  );
  t.after(async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited;
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  const listening = waitFor(
    "the agent's URL",
    () => {
      const url = /listening on (http:\/\/\S+)/.exec(stdout)?.[1];
      if (url) return url;
      if (child.exitCode !== null || child.signalCode !== null)
        throw new Error(`the agent ended (${child.exitCode ?? child.signalCode}): ${stderr.slice(-2000)}`);
      return undefined;
    },
    20_000,
  );
  listening.catch(() => undefined); // a victim may die before it listens
  return {
    child,
    listening,
    exited,
    logs: () =>
      stderr
        .split("\n")
        .filter((l) => l.startsWith("{"))
        .map((l) => JSON.parse(l) as { level: number; msg: string }),
    kill: () => child.kill("SIGKILL"),
  };
}

async function health(url: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const res = await fetch(`${url}/healthz`);
  return { status: res.status, body: (await res.json()) as Record<string, unknown> };
}

async function readSecret(namespace: string): Promise<Record<string, string> | undefined> {
  const { core } = await kube();
  try {
    const s = await core.readNamespacedSecret({ name: SECRET, namespace });
    return Object.fromEntries(
      Object.entries(s.data ?? {}).map(([k, v]) => [k, Buffer.from(v, "base64").toString("utf8")]),
    );
  } catch (err) {
    if (isNotFound(err)) return undefined;
    throw err;
  }
}

async function deploymentsOf(namespace: string, requestId: string): Promise<number> {
  const { apps } = await kube();
  return (
    await apps.listNamespacedDeployment({ namespace, labelSelector: `${LABEL_REQUEST_ID}=${requestId}` })
  ).items.length;
}

/** The same view of one cluster, from the database: how many records it has. */
function clusterRecords(cp: ControlPlaneProcess, clusterId: string): number {
  return cp.read(
    (db) => (db.prepare("SELECT COUNT(*) AS n FROM clusters WHERE id = ?").get(clusterId) as { n: number }).n,
  );
}

/** The real local cluster's kubeconfig (the tests run against it, or against $KUBECONFIG). */
async function kubeconfigFile(): Promise<string> {
  const file = process.env.KUBECONFIG ?? (await localCluster())?.kubeconfig;
  assert.ok(file, "a kubeconfig for the agent process");
  return file;
}

interface World {
  cp: ControlPlaneProcess;
  px: CpProxy;
  gpus: Pool;
  setup: AgentSetup;
  workNs: string;
}

async function world(
  t: TestContext,
  opts: {
    credentialTtlSeconds?: number;
    visibilityTimeoutSeconds?: number;
    kubeconfig?: string;
    /** Starts the control plane with this crash point. */
    crash?: Omit<CrashPoint, "marker">;
  } = {},
): Promise<World> {
  const cp = await ControlPlaneProcess.create(t, {
    visibilityTimeoutSeconds: opts.visibilityTimeoutSeconds ?? 3,
    ...(opts.credentialTtlSeconds ? { credentialTtlSeconds: opts.credentialTtlSeconds } : {}),
  });
  await cp.start(opts.crash);
  const px = await cpProxy(t, () => cp.url);
  const gpus = await pool(t);
  const agentNs = await tempNamespace(t, "agent");
  const workNs = await tempNamespace(t, "work", SKIP_CACHE);
  const clusterId = uniqueName("fa");
  await cp.allow(clusterId);
  return {
    cp,
    px,
    gpus,
    workNs,
    setup: {
      clusterId,
      controlPlaneUrl: px.url,
      kubeconfig: opts.kubeconfig ?? (await kubeconfigFile()),
      namespace: agentNs,
      workNamespace: workNs,
      selector: gpus.selector,
    },
  };
}

const submission = (w: World, name: string, more: Partial<SubmitRequest> = {}): SubmitRequest => ({
  name,
  namespace: w.workNs,
  model: "org/model-7b",
  image: "img:1",
  gpus: 1,
  replicas: 1,
  gpuType: w.gpus.gpuType,
  ...more,
});

/**
 * The expected end of every agent restart: ready and consuming, one cluster record with the
 * capacity it has, the credentials in its Secret the ones the control plane last gave it and
 * accepted by it, the request deployed exactly once, and the process still up (no crash loop).
 */
async function assertRecovered(
  w: World,
  agent: AgentProcess,
  capacity: number,
  requestId: string,
): Promise<void> {
  const url = await agent.listening;
  await waitFor("ready", async () => (await health(url)).status === 200, 30_000);
  // Ready once the credentials are installed; the queue resumes once they are saved too.
  await waitFor("the queue running", async () => (await health(url)).body.paused === false, 10_000);
  assert.equal(clusterRecords(w.cp, w.setup.clusterId), 1, "one cluster record");
  const view = (await w.cp.operator().listClusters()).filter((c) => c.clusterId === w.setup.clusterId);
  assert.equal(view.length, 1);
  assert.equal(view[0]?.capacity, capacity, "the capacity it has");
  // What the control plane issued last is what the agent saved (a re-registration may still run).
  const secret = await waitFor(
    "the Secret to hold the credential the control plane gave last",
    async () => {
      const saved = await readSecret(w.setup.namespace);
      return saved?.token === w.px.calls.filter((c) => c.token).at(-1)?.token ? saved : undefined;
    },
    10_000,
  );
  assert.ok(Number(secret.expiresAt) > Date.now(), "unexpired");
  // The control plane takes them (a refused credential throws 401/403).
  const queue = new ControlPlaneClient({ baseUrl: w.cp.url, token: secret.token! });
  await queue.receive(w.setup.clusterId, { queue: "termination", maxMessages: 1, waitSeconds: 0 });
  await waitFor(
    "the request Running",
    async () => (await w.cp.operator().getRequest(requestId)).status === "Running",
    20_000,
  ).catch(async (err: unknown) => {
    const view = await w.cp.operator().getRequest(requestId);
    const tail = agent
      .logs()
      .slice(-20)
      .map((l) => JSON.stringify(l));
    throw new Error(
      `${(err as Error).message}; request: ${JSON.stringify(view)}; agent log:\n${tail.join("\n")}`,
    );
  });
  assert.equal(await deploymentsOf(w.workNs, requestId), 1, "deployed exactly once");
  await sleep(2000); // several poll, heartbeat and status periods
  assert.equal(agent.child.exitCode, null, "still running");
  assert.equal(agent.child.signalCode, null);
  assert.equal((await health(url)).status, 200, "still ready");
  assert.deepEqual(
    agent.logs().filter((l) => l.level >= 50),
    [],
    "no error-level log lines",
  );
}

async function killedBy(agent: AgentProcess): Promise<void> {
  const end = await agent.exited;
  assert.equal(end.signal, "SIGKILL", `the agent was killed (ended with ${end.code ?? end.signal})`);
}

// --- 1. the agent killed mid-registration --------------------------------------------------------

void test("agent killed as its registration arrives, before the control plane sees it: the restarted agent registers once and consumes", async (t) => {
  const w = await world(t);
  const { id } = await w.cp.operator().submit(submission(w, "before-register"));
  await w.gpus.add(4);
  const victim = spawnAgent(t, w.setup);
  w.px.before = (path) => {
    if (!path.endsWith("/register")) return "forward";
    victim.kill();
    return "drop";
  };
  await killedBy(victim);
  assert.equal(clusterRecords(w.cp, w.setup.clusterId), 0, "the control plane never heard of it");
  assert.equal(await readSecret(w.setup.namespace), undefined);

  w.px.before = undefined;
  const agent = spawnAgent(t, w.setup);
  await assertRecovered(w, agent, 4, id);
  assert.equal(w.px.count(/\/register$/), 1, "one registration, by the restarted agent");
});

void test("agent killed after the control plane committed its registration, before the answer reached it: still one cluster record", async (t) => {
  const w = await world(t);
  const { id } = await w.cp.operator().submit(submission(w, "answer-lost"));
  await w.gpus.add(4);
  const victim = spawnAgent(t, w.setup);
  w.px.after = (path, status) => {
    if (!path.endsWith("/register") || status !== 200) return "pass";
    victim.kill();
    return "drop";
  };
  await killedBy(victim);
  assert.equal(clusterRecords(w.cp, w.setup.clusterId), 1, "the registration committed");
  assert.equal(await readSecret(w.setup.namespace), undefined, "the agent never had the credentials");

  w.px.after = undefined;
  const agent = spawnAgent(t, w.setup);
  await assertRecovered(w, agent, 4, id);
  assert.equal(w.px.count(/\/register$/), 2, "registered again: the first answer was lost with the agent");
});

void test("agent killed after it installed its credentials, while it writes them to the Secret: the restart registers again", async (t) => {
  const { kc } = await kube();
  const fp = await FaultProxy.start(kc);
  t.after(() => fp.close());
  const dir = await mkdtemp(join(tmpdir(), "warmstart-agent-faults-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const w = await world(t, { kubeconfig: await fp.kubeconfigFile(dir) });
  const { id } = await w.cp.operator().submit(submission(w, "secret-unwritten"));
  await w.gpus.add(4);
  const rule = fp.inject({
    method: "POST",
    path: new RegExp(`^/api/v1/namespaces/${w.setup.namespace}/secrets$`),
    times: 1,
    status: [503],
    onMatch: () => victim.kill(),
  });
  const victim = spawnAgent(t, w.setup);
  await killedBy(victim);
  assert.equal(rule.hits, 1, "killed on its Secret write");
  assert.equal(w.px.count(/\/register$/), 1, "after the control plane answered it");
  assert.equal(await readSecret(w.setup.namespace), undefined, "the Secret was never written");

  const agent = spawnAgent(t, w.setup);
  await assertRecovered(w, agent, 4, id);
  assert.equal(w.px.count(/\/register$/), 2);
});

void test("agent killed while re-registering a larger inventory, as it replaces the Secret: the restart resumes on the saved credentials and registers the new capacity", async (t) => {
  const { kc } = await kube();
  const fp = await FaultProxy.start(kc);
  t.after(() => fp.close());
  const dir = await mkdtemp(join(tmpdir(), "warmstart-agent-faults-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const w = await world(t, { kubeconfig: await fp.kubeconfigFile(dir) });
  await w.gpus.add(4);
  const victim = spawnAgent(t, w.setup);
  const victimUrl = await victim.listening;
  await waitFor("ready", async () => (await health(victimUrl)).status === 200, 30_000);
  const saved = await waitFor("the first credentials saved", () => readSecret(w.setup.namespace), 10_000);

  const rule = fp.inject({
    method: "PUT",
    path: new RegExp(`^/api/v1/namespaces/${w.setup.namespace}/secrets/${SECRET}$`),
    times: 1,
    status: [503],
    onMatch: () => victim.kill(),
  });
  // A heartbeat carries the capacity the agent last registered: one that left before this
  // re-registration but lands after it must not take the control plane back to 4.
  const beats = (): number => w.px.calls.filter((c) => c.path.endsWith("/heartbeat")).length;
  const landedBefore = beats();
  let held = 0;
  w.px.before = async (path) => {
    if (path.endsWith("/heartbeat")) {
      held++;
      await sleep(500);
    }
    return "forward" as const;
  };
  await w.gpus.add(4);
  await killedBy(victim);
  assert.equal(rule.hits, 1);
  await waitFor("every heartbeat held above answered", () => beats() - landedBefore >= held);
  assert.equal(
    (await w.cp.operator().listClusters()).find((c) => c.clusterId === w.setup.clusterId)?.capacity,
    8,
    "the control plane took the new capacity",
  );
  assert.deepEqual(
    await readSecret(w.setup.namespace),
    saved,
    "the Secret kept the earlier credentials, whole",
  );

  // Needs both nodes: only the new capacity can hold it.
  const { id } = await w.cp.operator().submit(submission(w, "larger", { gpus: 4, replicas: 2 }));
  const agent = spawnAgent(t, w.setup);
  await assertRecovered(w, agent, 8, id);
  assert.ok(
    agent.logs().some((l) => l.msg === "resuming with saved credentials"),
    "resumed from the Secret",
  );
  const now = await readSecret(w.setup.namespace);
  assert.ok(Number(now?.generation) > Number(saved.generation), "a newer generation replaced the saved one");
  assert.deepEqual(JSON.parse(now?.capacity ?? "[]"), [{ gpuType: w.gpus.gpuType, count: 8 }]);
});

// --- 2. the control plane killed mid-commit --------------------------------------------------------

void test("control plane killed inside an acknowledgement, amid concurrent submits and acknowledgements: restarted on its database, nothing lost or half written, the agent deploys each request once", async (t) => {
  const w = await world(t, {
    // The 12th acknowledgement (the agent's or the other cluster's) dies between deleting its
    // message and marking its request Accepted.
    crash: { statement: "UPDATE requests SET status = 'Accepted'", nth: 12, at: "in-transaction" },
  });
  await w.gpus.add(64);
  // Another cluster, consuming with several polls and acknowledgements at once.
  const otherId = uniqueName("fo");
  const otherType = `OTHER-${otherId}`;
  await w.cp.allow(otherId);
  const other = await new ControlPlaneClient({ baseUrl: w.cp.url, token: clusterTokenOf(otherId) }).register({
    clusterId: otherId,
    inventory: [{ gpuType: otherType, count: 10_000 }],
  });
  const seen = new Seen();
  const consumer = consume(w.cp.url, otherId, other.credentials.token, otherType, seen, 3);
  t.after(() => consumer.stop());
  const agent = spawnAgent(t, w.setup);
  const url = await agent.listening;
  await waitFor("ready", async () => (await health(url)).status === 200, 30_000);
  const registrations = w.px.count(/\/register$/);

  // Waves of concurrent submits, half for the agent, half for the other cluster, until the crash.
  const operator = w.cp.operator();
  const accepted = new Map<string, string>();
  const unanswered = new Set<string>();
  const crashed = w.cp.crashed(90_000);
  let over = false;
  void crashed.finally(() => (over = true)).catch(() => undefined);
  for (let wave = 0; wave < 10 && !over; wave++) {
    await Promise.allSettled(
      Array.from({ length: 16 }, async (_, i) => {
        const name = `w${wave}-${i}`;
        const gpuType = i % 2 === 0 ? w.gpus.gpuType : otherType;
        try {
          accepted.set(name, (await operator.submit(submission(w, name, { gpuType }))).id);
        } catch {
          unanswered.add(name);
        }
      }),
    );
    await sleep(300);
  }
  const marker = await crashed;
  const cutShort = (marker.params as string[])[1]!;
  assert.deepEqual(w.cp.consistencyProblems(), [], "nothing half written");
  const row = w.cp.read(
    (db) => db.prepare("SELECT status FROM requests WHERE id = ?").get(cutShort) as { status: string },
  );
  assert.equal(row.status, "Queued", "the acknowledgement that was cut short is undone: its message is back");

  await w.cp.start();
  const mine = (id: string): boolean => id !== "" && !seen.deliveredTo.has(id);
  await waitFor(
    "every request settled and both queues empty",
    async () => {
      const requests = await operator.listRequests();
      const messages = w.cp.read(
        (db) => (db.prepare("SELECT COUNT(*) AS n FROM messages").get() as { n: number }).n,
      );
      const open = requests.filter((r) =>
        r.assignedGpuType === w.gpus.gpuType
          ? r.status !== "Running"
          : r.status !== "Running" && r.status !== "Accepted",
      );
      return open.length === 0 && messages === 0;
    },
    90_000,
  );
  await consumer.stop();

  assert.deepEqual(w.cp.consistencyProblems(), [], "consistent after the restart");
  const requests = await operator.listRequests();
  for (const [name, id] of accepted)
    assert.deepEqual(
      requests.filter((r) => r.name === name).map((r) => r.id),
      [id],
      `${name}: answered 201, there exactly once`,
    );
  for (const name of unanswered)
    assert.ok(requests.filter((r) => r.name === name).length <= 1, `${name}: there at most once`);
  for (const id of seen.acked)
    assert.ok(
      ["Accepted", "Running"].includes(requests.find((r) => r.id === id)?.status ?? ""),
      "acknowledged stays acknowledged",
    );
  assert.deepEqual(seen.afterAck, [], "no acknowledged message came back");

  // The agent's requests: each deployed exactly once, by the one agent that ran throughout.
  const agents = requests.filter((r) => r.assignedGpuType === w.gpus.gpuType);
  assert.ok(agents.length >= 8 && agents.every((r) => mine(r.id)));
  const applied = agent.logs().filter((l) => l.msg === "workload applied");
  const { apps } = await kube();
  for (const r of agents) {
    assert.equal(applied.filter((l) => l.requestId === r.id).length, 1, `${r.name}: applied once`);
    const rs = await apps.listNamespacedReplicaSet({
      namespace: w.workNs,
      labelSelector: `${LABEL_REQUEST_ID}=${r.id}`,
    });
    assert.equal(await deploymentsOf(w.workNs, r.id), 1, `${r.name}: one Deployment`);
    assert.equal(rs.items.length, 1, `${r.name}: one ReplicaSet`);
  }
  assert.equal(agent.child.exitCode, null, "the agent ran throughout");
  assert.equal((await health(url)).status, 200);
  assert.equal(w.px.count(/\/register$/), registrations, "it needed no new registration");
  assert.deepEqual(
    agent.logs().filter((l) => l.level >= 50),
    [],
    "no error-level log lines",
  );
  t.diagnostic(
    `${accepted.size} submits answered, ${unanswered.size} not; crash in the acknowledgement of ${mine(cutShort) ? "the agent" : "the other cluster"}; ${agents.length} requests deployed by the agent`,
  );
});

void test("control plane killed inside the agent's acknowledgement and back before the agent gives the message up: the request stays the agent's (a cordon does not hand it to another cluster; its termination reaches the agent)", async (t) => {
  const w = await world(t, {
    crash: { statement: "UPDATE requests SET status = 'Accepted'", nth: 1, at: "in-transaction" },
  });
  await w.gpus.add(4);
  // Another cluster with the same GPU type, smaller (so the request goes to the agent first).
  const otherId = uniqueName("fo");
  await w.cp.allow(otherId);
  const otherCp = new ControlPlaneClient({ baseUrl: w.cp.url, token: clusterTokenOf(otherId) });
  const other = await otherCp.register({
    clusterId: otherId,
    inventory: [{ gpuType: w.gpus.gpuType, count: 2 }],
  });
  // Whatever the agent sends to release a message waits until the control plane is back; its
  // status reports (which would move the request past Queued) wait until the operator has acted.
  const back = deferred();
  const reports = deferred();
  w.px.before = async (path) => {
    if (path.endsWith("/queues/release")) await back.promise;
    if (/^\/v1\/requests\/[^/]+\/status$/.test(path)) await reports.promise;
    return "forward" as const;
  };
  const agent = spawnAgent(t, w.setup);
  const url = await agent.listening;
  await waitFor("ready", async () => (await health(url)).status === 200, 30_000);

  const operator = w.cp.operator();
  const { id } = await operator.submit(submission(w, "kept"));
  assert.equal((await operator.getRequest(id)).clusterId, w.setup.clusterId);
  const marker = await w.cp.crashed();
  assert.equal((marker.params as string[])[1], id, "killed inside the agent's acknowledgement of it");
  assert.equal(await deploymentsOf(w.workNs, id), 1, "applied before the acknowledgement");
  await w.cp.start();
  back.resolve();
  await sleep(1000);

  // The operator cordons the agent's cluster: what it has not taken may go elsewhere, this may not.
  await operator.setInstruction(w.setup.clusterId, "cordon");
  const queue = new ControlPlaneClient({ baseUrl: w.cp.url, token: other.credentials.token });
  const offered = await queue.receive(otherId, {
    queue: "deploy",
    gpuTypes: [w.gpus.gpuType],
    maxMessages: 10,
    waitSeconds: 3,
  });
  assert.deepEqual(
    offered.messages.map((m) => m.body.requestId),
    [],
    "the other cluster is never given a request the agent has deployed",
  );
  const view = await operator.getRequest(id);
  assert.equal(view.clusterId, w.setup.clusterId, `still the agent's (${view.status}: ${view.message})`);

  // Terminated while the control plane still counts it Queued: it must tell the agent.
  await operator.terminate(id);
  reports.resolve();
  await waitFor("Terminated", async () => (await operator.getRequest(id)).status === "Terminated", 30_000);
  assert.equal(
    await deploymentsOf(w.workNs, id),
    0,
    "the termination reached the agent: its Deployment is gone",
  );
});

// --- 3. a credential renewal interrupted by the control plane's death ---------------------------------

for (const at of ["in-transaction", "after-commit"] as const) {
  void test(`control plane killed ${at === "in-transaction" ? "inside a credential renewal" : "after committing a renewal, before answering it"}: the agent renews after the restart without registering again and never goes back to older credentials`, async (t) => {
    // Credential 1 is the registration's; the 2nd is the first renewal (due 4 s after it).
    const w = await world(t, {
      credentialTtlSeconds: 8,
      crash: { statement: "INSERT INTO credentials", nth: 2, at },
    });
    w.setup.extra = ["--renew-before", "4s"];
    await w.gpus.add(4);
    const agent = spawnAgent(t, w.setup);
    const url = await agent.listening;
    await waitFor("ready", async () => (await health(url)).status === 200, 30_000);

    // Watch readiness and the saved credentials all along.
    const samples: { generation: number; expiresAt: number; token: string }[] = [];
    const notReady: string[] = [];
    const watching = new AbortController();
    const watch = (async () => {
      while (!watching.signal.aborted) {
        const s = await readSecret(w.setup.namespace);
        if (s?.token && s.token !== samples.at(-1)?.token)
          samples.push({ token: s.token, generation: Number(s.generation), expiresAt: Number(s.expiresAt) });
        const h = await health(url);
        if (h.status !== 200) notReady.push(String(h.body.reason));
        await sleep(100);
      }
    })();

    const marker = await w.cp.crashed();
    assert.match(marker.statement, /INSERT INTO credentials/);
    await sleep(1000); // the agent's renewal fails and is retried meanwhile
    await w.cp.start();
    await waitFor(
      "a renewal answered after the restart, its credential saved",
      () => {
        const renewed = w.px.calls.filter((c) => c.path.endsWith("/credentials/renew") && c.token).at(-1);
        return renewed && samples.at(-1)?.token === renewed.token;
      },
      15_000,
    );
    watching.abort();
    await watch;

    assert.equal(w.px.count(/\/register$/), 1, "never registered again");
    assert.deepEqual(notReady, [], "ready throughout: the credentials in hand stayed valid");
    assert.ok(samples.length >= 2, "renewed credentials replaced the first ones");
    for (let i = 1; i < samples.length; i++) {
      assert.ok(samples[i]!.generation > samples[i - 1]!.generation, "each saved set newer than the last");
      assert.ok(samples[i]!.expiresAt >= samples[i - 1]!.expiresAt, "never older credentials");
    }
    const last = samples.at(-1)!;
    const queue = new ControlPlaneClient({ baseUrl: w.cp.url, token: last.token });
    await queue.receive(w.setup.clusterId, { queue: "termination", maxMessages: 1, waitSeconds: 0 });
    // The queue runs on them: a request is deployed.
    const { id } = await w.cp.operator().submit(submission(w, "after-renewal"));
    await waitFor("deployed", async () => (await deploymentsOf(w.workNs, id)) === 1, 30_000);
    assert.equal(agent.child.exitCode, null);
    assert.deepEqual(
      agent.logs().filter((l) => l.level >= 50),
      [],
      "no error-level log lines",
    );
  });
}
