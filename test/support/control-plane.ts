/** Shared set-up for the control plane's in-process tests: a real server on a temp database. */
import type { TestContext } from "node:test";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ControlPlaneClient } from "../../src/control-plane/client.js";
import {
  startControlPlane,
  type ControlPlane,
  type ControlPlaneOptions,
} from "../../src/control-plane/server.js";
import { pino } from "pino";
import type { Inventory, RegisterResponse } from "../../src/control-plane/api.js";

/** The registration token of each cluster the in-process tests register. */
export const clusterToken = (clusterId: string): string => `cluster-token-for-tests-${clusterId}`;
export const TEST_CLUSTERS = ["alpha", "beta", "gamma", "gpu-east", "empty", "c"] as const;
/** Cluster alpha's token. */
export const CLUSTER_TOKEN = clusterToken("alpha");
export const OPERATOR_TOKEN = "operator-token-for-tests-0001";

export interface Harness {
  cp: ControlPlane;
  dir: string;
  dbPath: string;
  operator: ControlPlaneClient;
  /** Starts another server on the same database (after `cp.close()`), for restart tests. */
  restart(): Promise<ControlPlane>;
}

export async function startHarness(
  t: TestContext,
  opts: Partial<ControlPlaneOptions> = {},
): Promise<Harness> {
  const dir = await mkdtemp(join(tmpdir(), "warmstart-cp-"));
  const dbPath = join(dir, "control-plane.db");
  const servers: ControlPlane[] = [];
  const launch = async (): Promise<ControlPlane> => {
    const cp = await startControlPlane({
      dbPath,
      port: 0,
      host: "127.0.0.1",
      clusterTokens: TEST_CLUSTERS.map((id) => ({ clusterId: id, token: clusterToken(id) })),
      operatorToken: OPERATOR_TOKEN,
      allowedNamespaces: ["default", "serving"],
      logger: pino({ level: "silent" }),
      ...opts,
    });
    servers.push(cp);
    return cp;
  };
  const cp = await launch();
  t.after(async () => {
    for (const s of servers) await s.close();
    await rm(dir, { recursive: true, force: true });
  });
  return {
    cp,
    dir,
    dbPath,
    operator: new ControlPlaneClient({ baseUrl: cp.url, token: OPERATOR_TOKEN }),
    restart: launch,
  };
}

/** A registered cluster: a client that uses its cluster token to register, then its credential. */
export interface Agent {
  clusterId: string;
  client: ControlPlaneClient;
  registration: RegisterResponse;
  credential: string;
}

export async function registerAgent(url: string, clusterId: string, inventory: Inventory): Promise<Agent> {
  const state = { credential: "" };
  const client = new ControlPlaneClient({
    baseUrl: url,
    token: (kind) => (kind === "cluster" ? clusterToken(clusterId) : state.credential),
  });
  const registration = await client.register({ clusterId, inventory, agentVersion: "test" });
  state.credential = registration.credentials.token;
  return {
    clusterId,
    client,
    registration,
    get credential() {
      return state.credential;
    },
  };
}

/** A raw call, for what the typed client would refuse to send. */
export async function call(
  url: string,
  method: string,
  path: string,
  opts: { token?: string; body?: unknown; raw?: string | Buffer; contentType?: string } = {},
): Promise<{ status: number; body: Record<string, unknown>; headers: Headers }> {
  const headers: Record<string, string> = {};
  if (opts.token) headers.authorization = `Bearer ${opts.token}`;
  let body: string | Buffer | undefined;
  if (opts.raw !== undefined) body = opts.raw;
  else if (opts.body !== undefined) body = JSON.stringify(opts.body);
  if (body !== undefined) headers["content-type"] = opts.contentType ?? "application/json";
  const res = await fetch(`${url}${path}`, { method, headers, ...(body === undefined ? {} : { body }) });
  const text = await res.text();
  let parsed: Record<string, unknown> = {};
  try {
    parsed = JSON.parse(text) as Record<string, unknown>;
  } catch {
    parsed = { text };
  }
  return { status: res.status, body: parsed, headers: res.headers };
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
