import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { parseCacheEnvTemplate, templateEntryError, templateFromJson } from "./cacheenv.js";

void describe("cache-env template", () => {
  void test("a ConfigMap's data becomes a template sorted by name", () => {
    const { template, errors } = parseCacheEnvTemplate({
      TRITON_CACHE_DIR: "{root}/cache/triton",
      HF_HOME: "{root}/model/hf",
      XDG_CACHE_HOME: "{root}",
    });
    assert.deepEqual(errors, []);
    assert.deepEqual(
      template.map((e) => e.name),
      ["HF_HOME", "TRITON_CACHE_DIR", "XDG_CACHE_HOME"],
    );
  });

  void test("entries that would point outside the root, or set what is never injected, are refused", () => {
    const bad: Record<string, string> = {
      "NOT A NAME": "{root}/x",
      HF_HUB_OFFLINE: "{root}/x",
      WARMSTART_PREWARM: "{root}/x",
      WARMSTART_CACHE_TREE: "{root}/x",
      HOME: "/home/user",
      TMPDIR: "{root}/../../tmp",
      A: "{root}/a/../../b",
      B: "{root}x",
      C: "{root}/{root}",
    };
    for (const [k, v] of Object.entries(bad)) assert.ok(templateEntryError(k, v), `${k}=${v} refused`);
    const parsed = parseCacheEnvTemplate({ ...bad, HF_HOME: "{root}/model/hf" });
    assert.equal(parsed.errors.length, Object.keys(bad).length);
    assert.ok(templateEntryError("HF_HOME", "{root}/a/./b") === undefined);
  });

  void test("an empty ConfigMap is an error, not a template that injects nothing", () => {
    assert.equal(parseCacheEnvTemplate({}).errors.length, 1);
    assert.equal(parseCacheEnvTemplate(undefined).errors.length, 1);
  });

  void test("a recorded template is read back only when every entry is valid", () => {
    const t = [{ name: "HF_HOME", value: "{root}/model/hf" }];
    assert.deepEqual(templateFromJson(JSON.stringify(t)), t);
    assert.equal(templateFromJson(JSON.stringify([{ name: "HF_HOME", value: "/etc" }])), undefined);
    assert.equal(templateFromJson("not json"), undefined);
    assert.equal(templateFromJson("[]"), undefined);
    assert.equal(templateFromJson(undefined), undefined);
  });
});
