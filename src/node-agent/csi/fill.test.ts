import assert from "node:assert/strict";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { status } from "@grpc/grpc-js";
import { createLogger } from "../../common/log.js";
import type { ModelCacheObject } from "../../common/modelcache.js";
import { ScopeOverShareError, StoreFullError } from "../budget.js";
import { createNodeAgentMetrics } from "../metrics.js";
import type { AgentParts } from "../parts.js";
import { CsiError } from "./request.js";
import { fetchTree } from "./fill.js";

const HASH = "89abcdef01234567".repeat(4);
const SHORT = HASH.slice(0, 16);

async function harness(t: { after: (fn: () => Promise<void>) => void }) {
  const dir = await mkdtemp(join(tmpdir(), "fill-"));
  t.after(() => rm(dir, { recursive: true, force: true }));
  for (const f of ["cert", "key", "ca"]) await writeFile(join(dir, f), "pem");
  const cache: ModelCacheObject = {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: SHORT },
    spec: { hash: HASH },
    status: {
      phase: "Ready",
      sizeBytes: 5_000_000,
      manifestDigest: "d".repeat(64),
      // A source nobody listens at: the fill fails at once.
      replicas: { "gpu-0": { url: "https://127.0.0.1:1", at: "2026-12-01T00:00:00Z" } },
    },
  };
  const finalizers: string[] = [];
  const parts = {
    cfg: {
      node: "gpu-1",
      store: join(dir, "store"),
      durable: false,
      peerCert: join(dir, "cert"),
      peerKey: join(dir, "key"),
      peerCa: join(dir, "ca"),
    },
    log: createLogger("test", { level: "silent" }),
    metrics: createNodeAgentMetrics(),
    finalizer: "warmstart.dev/store-gpu-1",
    record: () => cache,
    store: { committed: () => Promise.resolve(undefined) },
    records: {
      addFinalizer: (short: string) => (finalizers.push(`+${short}`), Promise.resolve()),
      removeFinalizer: (hash: string) => (finalizers.push(`-${hash}`), Promise.resolve()),
    },
  } as unknown as AgentParts;
  return { parts, finalizers };
}

void test("a fill the store budget cannot make room for is refused before anything is fetched, and holds no room", async (t) => {
  const { parts, finalizers } = await harness(t);
  const asked: Array<[string, number]> = [];
  const released: string[] = [];
  const budget = {
    makeRoom: (short: string, needed: number) => {
      asked.push([short, needed]);
      return Promise.reject(new StoreFullError("the store budget is 1 MB: 900 kB held"));
    },
    release: (short: string) => void released.push(short),
  };
  const err = await fetchTree(parts, HASH, new AbortController().signal, {
    budget,
    fetched: () => assert.fail("nothing was fetched"),
  }).catch((e: unknown) => e);
  assert.ok(err instanceof CsiError, String(err));
  assert.equal(err.code, status.RESOURCE_EXHAUSTED);
  assert.match(err.message, /no room for cache 89abcdef01234567.*budget is 1 MB/);
  assert.deepEqual(asked, [[SHORT, 5_000_000]], "room asked for the tree's size");
  assert.deepEqual(finalizers, [], "no fill started");
  assert.deepEqual(released, [], "nothing was held");
});

void test("the room a fill holds is given back when the fill fails, and so is the store's finalizer", async (t) => {
  const { parts, finalizers } = await harness(t);
  const released: string[] = [];
  const budget = { makeRoom: () => Promise.resolve(), release: (short: string) => void released.push(short) };
  await assert.rejects(
    fetchTree(parts, HASH, new AbortController().signal, {
      budget,
      fetched: () => assert.fail("nothing was fetched"),
    }),
  );
  assert.deepEqual(released, [SHORT]);
  assert.deepEqual(finalizers, [`+${SHORT}`, `-${HASH}`]);
});

void test("a fill refused because its sharing scope holds its fair share says so, and carries why for a waiting follower", async (t) => {
  const { parts } = await harness(t);
  const over = new ScopeOverShareError(
    "namespace:a",
    "sharing scope namespace:a holds 70.0 MB of this node's store",
  );
  const budget = { makeRoom: () => Promise.reject(over), release: () => undefined };
  const err = await fetchTree(parts, HASH, new AbortController().signal, {
    budget,
    fetched: () => assert.fail("nothing was fetched"),
  }).catch((e: unknown) => e);
  assert.ok(err instanceof CsiError, String(err));
  assert.equal(err.code, status.RESOURCE_EXHAUSTED);
  assert.match(
    err.message,
    /no room for cache 89abcdef01234567 in this node's store: sharing scope namespace:a holds/,
  );
  assert.equal(err.cause, over);
});
