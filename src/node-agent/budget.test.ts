import assert from "node:assert/strict";
import { test } from "node:test";
import type { V1Pod } from "@kubernetes/client-node";
import { createLogger } from "../common/log.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import { ScopeOverShareError, StoreBudget, StoreFullError } from "./budget.js";
import { createNodeAgentMetrics } from "./metrics.js";
import type { AgentParts } from "./parts.js";

const NODE = "gpu-1";
const MB = 1_000_000;
const log = createLogger("test", { level: "silent" });

/** A tree in the store: its scope, size, when last restored (minutes after an epoch), and where its live copy is. */
interface Tree {
  scope: string;
  bytes: number;
  at: number;
  live?: string;
}

const hashOf = (name: string): string =>
  Buffer.from(name.padEnd(32, "0")).toString("hex").slice(0, 64).padEnd(64, "0");
const shortOf = (name: string): string => hashOf(name).slice(0, 16);

/** A restore or follower as the webhook decorates it: role, hash, and the claim as volume `warmstart-ro`. */
function engine(
  name: string,
  o: { role?: string; namespace?: string; node?: string; volume?: string; hash?: string } = {},
): V1Pod {
  return {
    metadata: {
      name: `pod-${name}`,
      namespace: o.namespace ?? "a",
      annotations: {
        ...(o.role !== "" ? { "warmstart.dev/role": o.role ?? "restore" } : {}),
        "warmstart.dev/hash": o.hash ?? hashOf(name),
      },
    },
    spec: {
      ...(o.node !== "" ? { nodeName: o.node ?? NODE } : {}),
      containers: [{ name: "e", image: "i" }],
      volumes: [
        {
          name: o.volume ?? "warmstart-ro",
          persistentVolumeClaim: { claimName: `rox-${shortOf(name)}`, readOnly: true },
        },
      ],
    },
  };
}

/** A StoreBudget over a store of these trees (records in the informer), and the cluster's live pods. */
function harness(trees: Record<string, Tree>, pods: V1Pod[] = [], budget = 100 * MB) {
  const stored = new Map(Object.entries(trees).map(([name, t]) => [shortOf(name), { name, ...t }]));
  const epoch = Date.parse("2026-12-01T00:00:00Z");
  // Every cache asked for or stored has a record, as the informer holds it.
  const all = new Map(stored);
  const record = (short: string): ModelCacheObject | undefined => {
    const t = all.get(short);
    if (!t) return undefined;
    return {
      apiVersion: "warmstart.dev/v1alpha1",
      kind: "ModelCache",
      metadata: { name: short },
      spec: { hash: hashOf(t.name), inputs: { scope: t.scope } },
      status: {
        phase: "Ready",
        node: t.live ?? "gpu-0",
        lastRestoredAt: new Date(epoch + t.at * 60_000).toISOString(),
      },
    };
  };
  const metrics = createNodeAgentMetrics();
  const removed: string[] = [];
  const parts = {
    cfg: { node: NODE, storeBudget: budget },
    log,
    metrics,
    record,
    store: {
      list: () =>
        Promise.resolve(
          [...stored].map(([short, t]) => ({
            short,
            manifest: { totalBytes: t.bytes, createdAt: new Date(epoch).toISOString() },
          })),
        ),
    },
    core: { listPodForAllNamespaces: () => Promise.resolve({ items: pods }) },
    records: { get: (short: string) => Promise.resolve(record(short)) },
  } as unknown as AgentParts;
  const room = new StoreBudget(parts, {
    busy: () => false,
    removeTree: (short) => {
      removed.push(stored.get(short)!.name);
      stored.delete(short);
      return Promise.resolve();
    },
  });
  /** Asks for room for a new cache `name` of `scope` (its record known, as a fill's is). */
  const ask = (name: string, scope: string, bytes: number): Promise<void> => {
    all.set(shortOf(name), { name, scope, bytes, at: 0 });
    return room.doMakeRoom(shortOf(name), bytes, log);
  };
  const refusals = async (): Promise<string> =>
    (await metrics.registry.metrics())
      .split("\n")
      .filter((l) => l.startsWith("warmstart_node_agent_store_refusals_total{"))
      .join("\n");
  return { room, removed, ask, refusals, stored };
}

void test("a fill of a scope over its fair share evicts its own unused tree, not an older one of another scope", async () => {
  const { removed, ask } = harness(
    {
      a1: { scope: "namespace:a", bytes: 30 * MB, at: 20 },
      a2: { scope: "namespace:a", bytes: 30 * MB, at: 30 },
      b1: { scope: "namespace:b", bytes: 30 * MB, at: 10 },
    },
    [engine("a2")],
  );
  await ask("a3", "namespace:a", 30 * MB);
  assert.deepEqual(removed, ["a1"]);
});

void test("a fill of a scope over its fair share is refused, naming the scope, when only others' unused trees could make room", async () => {
  const { removed, ask, refusals } = harness(
    {
      a1: { scope: "namespace:a", bytes: 40 * MB, at: 20 },
      a2: { scope: "namespace:a", bytes: 30 * MB, at: 30 },
      b1: { scope: "namespace:b", bytes: 30 * MB, at: 10 },
    },
    [engine("a1"), engine("a2")],
  );
  const err = await ask("a3", "namespace:a", 30 * MB).catch((e: unknown) => e);
  assert.ok(err instanceof ScopeOverShareError, String(err));
  assert.ok(err instanceof StoreFullError, "a capture's no-room path still takes it");
  assert.equal(err.scope, "namespace:a");
  assert.match(
    err.message,
    /sharing scope namespace:a holds 70\.0 MB .*fair share \(50% of the 100\.0 MB budget/,
  );
  assert.deepEqual(removed, [], "nothing evicted, the other scope's tree least of all");
  assert.match(await refusals(), /reason="scope-over-share",scope="namespace:a"} 1/);
});

void test("a fill of a scope within its share evicts the over-share scope's unused tree before an older one of a third scope", async () => {
  const { removed, ask } = harness(
    {
      a1: { scope: "namespace:a", bytes: 30 * MB, at: 20 },
      a2: { scope: "namespace:a", bytes: 30 * MB, at: 30 },
      b1: { scope: "namespace:b", bytes: 20 * MB, at: 10 },
    },
    [engine("a2")],
  );
  await ask("c1", "namespace:c", 40 * MB);
  assert.deepEqual(removed, ["a1"]);
});

void test("a single scope in the store may use all of it, its own unused trees making room", async () => {
  const { removed, ask } = harness(
    {
      a1: { scope: "namespace:a", bytes: 40 * MB, at: 20 },
      a2: { scope: "namespace:a", bytes: 40 * MB, at: 30 },
    },
    [engine("a1")],
  );
  await ask("a3", "namespace:a", 55 * MB);
  assert.deepEqual(removed, ["a2"]);
});

void test("a tree a plain pod mounts by hand, or a pod with a forged role in an unadmitted namespace, is not pinned", async () => {
  const { removed, ask } = harness(
    {
      b1: { scope: "cluster", bytes: 60 * MB, at: 10 },
      b2: { scope: "cluster", bytes: 30 * MB, at: 20 },
    },
    [
      engine("b1", { role: "", volume: "mine" }),
      engine("b1", { role: "", volume: "warmstart-ro" }),
      engine("b2", { namespace: "kube-system" }),
    ],
  );
  await ask("b3", "cluster", 100 * MB);
  assert.deepEqual(removed, ["b1", "b2"]);
});

void test("an engine pins its tree on its own node, and on the node of the cache's live tree wherever it runs", async () => {
  const h = harness(
    {
      b1: { scope: "cluster", bytes: 50 * MB, at: 10 },
      b2: { scope: "cluster", bytes: 40 * MB, at: 20, live: NODE },
    },
    [engine("b1", { node: "gpu-2" }), engine("b2", { node: "" })],
  );
  await h.ask("b3", "cluster", 50 * MB);
  assert.deepEqual(h.removed, ["b1"], "a copy no engine on this node uses goes");

  const pinned = harness({ b1: { scope: "cluster", bytes: 90 * MB, at: 10 } }, [engine("b1")]);
  await assert.rejects(pinned.ask("b3", "cluster", 50 * MB), (e) => e instanceof StoreFullError);
  assert.deepEqual(pinned.removed, []);
  assert.match(await pinned.refusals(), /reason="store-full",scope="cluster"} 1/);
});
