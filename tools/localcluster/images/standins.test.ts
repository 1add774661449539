import assert from "node:assert/strict";
import { test } from "node:test";
import { REAL_IMAGES, nimModelOf, qualifiedImageName, standInConfig, standInFiles } from "./standins.js";

void test("image names are qualified as containerd stores them", () => {
  assert.equal(qualifiedImageName("vllm/vllm-openai:latest"), "docker.io/vllm/vllm-openai:latest");
  assert.equal(qualifiedImageName("vllm/vllm-openai"), "docker.io/vllm/vllm-openai:latest");
  assert.equal(qualifiedImageName("ubuntu"), "docker.io/library/ubuntu:latest");
  assert.equal(qualifiedImageName("ghcr.io/llm-d/llm-d-cuda:v0.9.0"), "ghcr.io/llm-d/llm-d-cuda:v0.9.0");
  assert.equal(qualifiedImageName("localhost:5000/x"), "localhost:5000/x:latest");
  assert.equal(
    qualifiedImageName("nvcr.io/nim/meta/llama-3.1-8b-instruct:1.3.3"),
    "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.3.3",
  );
});

void test("the real names: tagged, unique, each with its source, an entry point the stand-in has", () => {
  const names = REAL_IMAGES.map((i) => qualifiedImageName(i.name));
  assert.equal(new Set(names).size, names.length, "no name twice");
  const files = new Set(standInFiles().map((f) => f.path));
  for (const i of REAL_IMAGES) {
    assert.match(i.name, /:[A-Za-z0-9._-]+$/, `${i.name} names its tag`);
    assert.ok(i.source.length > 0, `${i.name} says where its tag comes from`);
    const c = standInConfig(i) as { Entrypoint?: string[]; Cmd?: string[]; Env: string[] };
    const exe = (c.Entrypoint ?? c.Cmd ?? [])[0]!;
    const found =
      files.has(exe) || files.has(`/usr/local/bin/${exe}`) || ["python3", "/bin/bash"].includes(exe);
    assert.ok(found, `${i.name}: ${exe} is in the image`);
    assert.ok(c.Env.some((e) => e.startsWith("PYTHONPATH=")));
  }
  for (const kind of [
    "vllm",
    "sglang",
    "tgi",
    "nim",
    "kserve-huggingfaceserver",
    "kserve-storage-initializer",
  ])
    assert.ok(
      REAL_IMAGES.some((i) => i.kind === kind),
      `a name for ${kind}`,
    );
});

void test("a NIM image names its model; the hub serves it as org/name", () => {
  assert.equal(nimModelOf("nvcr.io/nim/meta/llama-3.1-8b-instruct:1.3.3"), "meta/llama-3.1-8b-instruct");
  assert.equal(nimModelOf("nvcr.io/nim/meta/llama3-8b-instruct"), "meta/llama3-8b-instruct");
  const nim = REAL_IMAGES.find((i) => i.kind === "nim")!;
  const env = (standInConfig(nim) as { Env: string[] }).Env;
  assert.ok(env.includes("NIM_CACHE_PATH=/opt/nim/.cache"));
  assert.ok(env.includes(`WARMSTART_STANDIN_NIM_MODEL=${nimModelOf(nim.name)}`));
});
