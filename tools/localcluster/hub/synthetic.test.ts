import assert from "node:assert/strict";
import { test } from "node:test";
import { isRepoId, revisionCommit, SyntheticRepos } from "./synthetic.js";

const MiB = 2 ** 20;

void test("the hub serves any org/name the Hub could have, the same bytes for the same name", () => {
  const repos = new SyntheticRepos(2 * MiB);
  for (const id of [
    "synthetic/a",
    "meta/llama-3.1-8b-instruct",
    "meta-llama/Llama-3.1-8B-Instruct",
    "facebook/opt-125m",
  ]) {
    const r = repos.get(id);
    assert.ok(r, id);
    assert.ok(
      r.files.some((f) => f.path.endsWith(".safetensors")),
      `${id} has weights`,
    );
    assert.deepEqual(new SyntheticRepos(2 * MiB).get(id)?.files, r.files, `${id}: same bytes every time`);
  }
  assert.notEqual(repos.get("meta/a")?.sha, repos.get("meta/b")?.sha);
  for (const bad of ["noslash", "a/b/c", "a--b/c", "a/b..c", "-a/b", `a/${"x".repeat(100)}`])
    assert.equal(isRepoId(bad), false, bad);
});

void test("revisions: main and its commit are the repository; another name or commit is a revision of its own", () => {
  const repos = new SyntheticRepos(2 * MiB);
  const id = "meta/llama-3.1-8b-instruct";
  const main = repos.get(id)!;
  assert.deepEqual(repos.get(id, main.sha)?.files, main.files);
  const tp2 = repos.get(id, "vllm-bf16-tp2")!;
  assert.equal(tp2.sha, revisionCommit(id, "vllm-bf16-tp2"));
  assert.notEqual(tp2.sha, main.sha);
  const weights = (r: typeof main): string[] => r.files.filter((f) => f.lfs).map((f) => f.oid);
  assert.notDeepEqual(weights(tp2), weights(main), "other weights");
  assert.deepEqual(repos.get(id, tp2.sha)?.files, tp2.files, "a named revision's commit is that revision");
  const pinned = "0123456789abcdef0123456789abcdef01234567";
  assert.equal(repos.get(id, pinned)?.sha, pinned, "a pinned commit resolves to itself");
  assert.equal(repos.get(id, "refs/pr/1"), undefined);
});
