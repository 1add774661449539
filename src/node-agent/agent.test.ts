/**
 * The agent's store budget against an API server that knows nothing (no pods, no records): what
 * making room counts as held, and what it may remove.
 */
import assert from "node:assert/strict";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import * as k8s from "@kubernetes/client-node";
import { createLogger, type Logger } from "../common/log.js";
import { shortHash } from "../core/contract.js";
import { capture } from "../datapath/capture.js";
import { NodeAgent } from "./agent.js";
import { NodeAgentConfig } from "./config.js";

const X = "a1".repeat(32);
const Y = "b2".repeat(32);
const BYTES = 4096;

/** An API server with no pods, and nothing else (404 for everything but the pod list). */
async function emptyCluster(t: TestContext): Promise<k8s.KubeConfig> {
  const server: Server = createServer((req, res) => {
    res.setHeader("Content-Type", "application/json");
    if (req.method === "GET" && req.url?.startsWith("/api/v1/pods")) {
      res.end(JSON.stringify({ apiVersion: "v1", kind: "PodList", metadata: {}, items: [] }));
      return;
    }
    res.statusCode = 404;
    res.end(
      JSON.stringify({ apiVersion: "v1", kind: "Status", status: "Failure", reason: "NotFound", code: 404 }),
    );
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  t.after(() => new Promise<void>((resolve) => server.close(() => resolve())));
  const kc = new k8s.KubeConfig();
  kc.loadFromOptions({
    clusters: [
      {
        name: "c",
        server: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
        skipTLSVerify: true,
      },
    ],
    users: [{ name: "u" }],
    contexts: [{ name: "x", cluster: "c", user: "u" }],
    currentContext: "x",
  });
  return kc;
}

/** The private parts of the agent these tests drive. */
interface Room {
  reserved: Map<string, number>;
  doMakeRoom(short: string, needed: number, log: Logger): Promise<void>;
}

/** An agent whose store holds the committed tree of X (BYTES of file data), its capture's
 * pipeline still running: committed, reserved, not yet promoting. */
async function agentWithCommittedTree(
  t: TestContext,
  budget: number,
): Promise<{ agent: NodeAgent; room: Room; log: Logger }> {
  const dir = await mkdtemp(join(tmpdir(), "ws-agent-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const src = join(dir, "src");
  await mkdir(join(src, "cache"), { recursive: true });
  await writeFile(join(src, "cache/k"), Buffer.alloc(BYTES, 7));
  const log = createLogger("node-agent", "silent");
  const cfg = NodeAgentConfig.parse({
    node: "n1",
    kubeletRoot: join(dir, "kubelet"),
    store: join(dir, "store"),
    storeBudget: budget,
  });
  const agent = new NodeAgent({ cfg, kc: await emptyCluster(t), log });
  await agent.store.init();
  await capture({ src, dest: agent.store.treeDir(X), hash: X, progress: false, durable: false });
  const room = agent as unknown as Room;
  room.reserved.set(shortHash(X), BYTES);
  return { agent, room, log };
}

void test("making room never removes a tree its capture just committed and has yet to promote", async (t) => {
  // Room for Y only by removing X, which its pipeline still holds.
  const { agent, room, log } = await agentWithCommittedTree(t, BYTES + BYTES / 2);
  await assert.rejects(room.doMakeRoom(shortHash(Y), BYTES, log), /store budget/);
  assert.ok(await agent.store.committed(X), "the tree about to be promoted is still there");
  assert.equal(room.reserved.has(shortHash(Y)), false, "no room was granted");
});

void test("a committed tree whose capture still holds its reservation counts once against the budget", async (t) => {
  // X and Y fit side by side, exactly.
  const { agent, room, log } = await agentWithCommittedTree(t, 2 * BYTES);
  await room.doMakeRoom(shortHash(Y), BYTES, log);
  assert.equal(room.reserved.get(shortHash(Y)), BYTES, "room granted");
  assert.ok(await agent.store.committed(X));
});
