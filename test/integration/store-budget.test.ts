/**
 * The node agent's store budget, on the real API server: what making room counts as held, and
 * what it may remove. The hashes are this file's own, so no pod mounts them and no record exists.
 */
import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { isNotFound, SYSTEM_NAMESPACE } from "../../src/common/kube.js";
import { createLogger, type Logger } from "../../src/common/log.js";
import { ANN_HASH, ANN_ROLE, claimName, RO_VOLUME, shortHash } from "../../src/core/contract.js";
import { capture } from "../../src/datapath/capture.js";
import { NodeAgent } from "../../src/node-agent/agent.js";
import type { StoreBudget } from "../../src/node-agent/budget.js";
import { NodeAgentConfig } from "../../src/node-agent/config.js";
import { kube, tempNamespace, uniqueName } from "../harness.js";

const X = randomBytes(32).toString("hex");
const Y = randomBytes(32).toString("hex");
const BYTES = 4096;

/** An agent whose store holds the committed tree of X (BYTES of file data), its capture's
 * pipeline still running: committed, reserved, not yet promoting. */
async function agentWithCommittedTree(
  t: TestContext,
  budget: number,
  node = "n1",
): Promise<{ agent: NodeAgent; room: StoreBudget; log: Logger }> {
  const dir = await mkdtemp(join(tmpdir(), "ws-agent-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const src = join(dir, "src");
  await mkdir(join(src, "cache"), { recursive: true });
  await writeFile(join(src, "cache/k"), Buffer.alloc(BYTES, 7));
  const log = createLogger("node-agent", "silent");
  const cfg = NodeAgentConfig.parse({
    node,
    kubeletRoot: join(dir, "kubelet"),
    store: join(dir, "store"),
    storeBudget: budget,
  });
  const agent = new NodeAgent({ cfg, kc: (await kube()).kc, log });
  await agent.store.init();
  await capture({ src, dest: agent.store.treeDir(X), hash: X, progress: false, durable: false });
  const room = agent.budget;
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

void test("a pod that mounts a cache's claim by hand, with or without Warmstart's stamps written on it, does not keep its tree from eviction", async (t) => {
  const { core, coordination } = await kube();
  // A node of this test's own (no kubelet): the pods wait there, bound, and never run.
  const node = uniqueName("ws-nokubelet");
  const { agent, room, log } = await agentWithCommittedTree(t, BYTES + BYTES / 2, node);
  room.release(shortHash(X));
  // Making room publishes the store's use on the node's Lease, which no Node owns here.
  t.after(() =>
    coordination
      .deleteNamespacedLease({ name: `warmstart-store-${node}`, namespace: SYSTEM_NAMESPACE })
      .then(() => undefined)
      .catch((err: unknown) => {
        if (!isNotFound(err)) throw err;
      }),
  );
  const ns = await tempNamespace(t, "pin");
  const byHand = (name: string, stamps: Record<string, string>): k8s.V1Pod => ({
    metadata: { name, annotations: stamps },
    spec: {
      nodeName: node,
      containers: [{ name: "c", image: "busybox", command: ["sleep", "3600"] }],
      volumes: [{ name: RO_VOLUME, persistentVolumeClaim: { claimName: claimName(X), readOnly: true } }],
    },
  });
  await core.createNamespacedPod({ namespace: ns, body: byHand("plain", {}) });
  const forged = await core.createNamespacedPod({
    namespace: ns,
    body: byHand("forged", { [ANN_ROLE]: "restore", [ANN_HASH]: X }),
  });
  // Admission owns the stamps: the forged ones are gone before anything reads them.
  assert.equal(forged.metadata?.annotations?.[ANN_ROLE], undefined, "the webhook removed the forged role");

  await room.doMakeRoom(shortHash(Y), BYTES, log);
  assert.equal(await agent.store.committed(X), undefined, "the tree the pods mount by hand was evicted");
  assert.equal(room.reserved.get(shortHash(Y)), BYTES, "room granted");
});
