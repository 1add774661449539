import { createHash } from "node:crypto";
import assert from "node:assert/strict";
import { test } from "node:test";
import { isRepoId, revisionCommit, SyntheticRepos } from "./synthetic.js";

const MiB = 2 ** 20;

void test("the hub serves any org/name the Hub could have, the same bytes for the same name", async () => {
  const repos = new SyntheticRepos(2 * MiB);
  for (const id of [
    "synthetic/a",
    "meta/llama-3.1-8b-instruct",
    "meta-llama/Llama-3.1-8B-Instruct",
    "facebook/opt-125m",
  ]) {
    const r = await repos.get(id);
    assert.ok(r, id);
    assert.ok(
      r.files.some((f) => f.path.endsWith(".safetensors")),
      `${id} has weights`,
    );
    assert.deepEqual(
      (await new SyntheticRepos(2 * MiB).get(id))?.files,
      r.files,
      `${id}: same bytes every time`,
    );
  }
  assert.notEqual((await repos.get("meta/a"))?.sha, (await repos.get("meta/b"))?.sha);
  for (const bad of ["noslash", "a/b/c", "a--b/c", "a/b..c", "-a/b", `a/${"x".repeat(100)}`])
    assert.equal(isRepoId(bad), false, bad);
});

void test("revisions: main and its commit are the repository; another name or commit is a revision of its own", async () => {
  const repos = new SyntheticRepos(2 * MiB);
  const id = "meta/llama-3.1-8b-instruct";
  const main = (await repos.get(id))!;
  assert.deepEqual((await repos.get(id, main.sha))?.files, main.files);
  const tp2 = (await repos.get(id, "vllm-bf16-tp2"))!;
  assert.equal(tp2.sha, revisionCommit(id, "vllm-bf16-tp2"));
  assert.notEqual(tp2.sha, main.sha);
  const weights = (r: typeof main): string[] => r.files.filter((f) => f.lfs).map((f) => f.oid);
  assert.notDeepEqual(weights(tp2), weights(main), "other weights");
  assert.deepEqual(
    (await repos.get(id, tp2.sha))?.files,
    tp2.files,
    "a named revision's commit is that revision",
  );
  const pinned = "0123456789abcdef0123456789abcdef01234567";
  assert.equal((await repos.get(id, pinned))?.sha, pinned, "a pinned commit resolves to itself");
  assert.equal(await repos.get(id, "refs/pr/1"), undefined);
});

void test("digesting new names never stalls the hub's event loop", async () => {
  const repos = new SyntheticRepos(96 * MiB);
  // CPU time per turn of the loop, not wall time: on a loaded machine the process may wait for a
  // core between two turns, which is no stall of ours. The digests run on this thread.
  let longest = 0;
  let last = process.cpuUsage();
  let ticking = true;
  const tick = (): void => {
    const used = process.cpuUsage(last);
    last = process.cpuUsage();
    longest = Math.max(longest, (used.user + used.system) / 1000);
    if (ticking) setImmediate(tick);
  };
  setImmediate(tick);
  const [a, b, again] = await Promise.all([repos.get("stall/a"), repos.get("stall/b"), repos.get("stall/a")]);
  // One more turn: a loop blocked until now shows as one long wait in the tick that follows.
  await new Promise<void>((resolve) => setImmediate(resolve));
  ticking = false;
  assert.ok(a && b && again);
  assert.equal(again.sha, a.sha, "one build per name, shared");
  assert.ok(longest < 250, `one turn of the event loop took ${longest.toFixed(0)} ms of CPU at most`);
});

void test("a real repository is served as its files are: main only, weights as LFS files", async () => {
  const files = new Map([
    ["config.json", Buffer.from('{"model_type":"llama"}')],
    ["model.safetensors", Buffer.from("weights")],
  ]);
  const repos = new SyntheticRepos(2 * MiB, new Map([["warmstart/tiny-llama", files]]));
  const repo = await repos.get("warmstart/tiny-llama");
  assert.deepEqual(
    repo?.files.map((f) => [f.path, f.size, Boolean(f.lfs)]),
    [
      ["config.json", 22, false],
      ["model.safetensors", 7, true],
    ],
  );
  assert.equal(repo?.files[1]?.lfs?.sha256, createHash("sha256").update("weights").digest("hex"));
  assert.equal(await repos.get("warmstart/tiny-llama", "v2"), undefined, "no other revision");
  assert.equal((await repos.get("warmstart/other"))?.files.length, 9, "any other name stays synthetic");
});
