import { describe, test } from "node:test";
import assert from "node:assert/strict";
import type { V1Pod } from "@kubernetes/client-node";
import { isStampKey, stripStamps } from "./stamps.js";

const forged = (): V1Pod => ({
  metadata: {
    name: "evil",
    labels: {
      app: "x",
      "warmstart.dev/capture": "true",
      "warmstart.dev/hash": "0123456789abcdef",
      "warmstart.dev/gated": "true",
      "warmstart.dev/admission-id": "feedfeedfeedfeed",
      "sim.warmstart.dev/ready": "true",
    },
    annotations: {
      note: "kept",
      "warmstart.dev/hash": "01".repeat(32),
      "warmstart.dev/role": "leader",
      "warmstart.dev/election-id": "stolen",
      "warmstart.dev/tree": "../../etc",
      "warmstart.dev/injected-env": "HF_ENDPOINT",
      "warmstart.dev/restore-from": "0123456789abcdef",
      "warmstart.dev/skip": "false",
      "warmstart.dev/cache-size-limit": "300Gi",
    },
  },
  spec: {
    schedulingGates: [{ name: "warmstart.dev/cache-ready" }, { name: "other.io/gate" }],
    containers: [{ name: "c", image: "i" }],
  },
});

void describe("stripStamps", () => {
  void test("every warmstart.dev stamp the author set goes; user annotations and foreign keys stay", () => {
    const input = forged();
    const before = structuredClone(input);
    const { pod, removed } = stripStamps(input);
    assert.deepEqual(pod.metadata?.labels, { app: "x", "sim.warmstart.dev/ready": "true" });
    assert.deepEqual(pod.metadata?.annotations, {
      note: "kept",
      "warmstart.dev/restore-from": "0123456789abcdef",
      "warmstart.dev/skip": "false",
      "warmstart.dev/cache-size-limit": "300Gi",
    });
    assert.deepEqual(pod.spec?.schedulingGates, [{ name: "other.io/gate" }]);
    assert.equal(removed.length, 10);
    assert.ok(removed.includes("label:warmstart.dev/capture"));
    assert.ok(removed.includes("annotation:warmstart.dev/tree"));
    assert.ok(removed.includes("schedulingGate:warmstart.dev/cache-ready"));
    assert.deepEqual(input, before, "the input is not changed");
  });

  void test("a pod with nothing to strip comes back as is", () => {
    const p: V1Pod = { metadata: { name: "a", labels: { app: "a" } }, spec: { containers: [] } };
    const { pod, removed } = stripStamps(p);
    assert.equal(pod, p);
    assert.deepEqual(removed, []);
  });

  void test("only our gate goes; the last one leaves no empty list", () => {
    const p: V1Pod = {
      metadata: {},
      spec: { containers: [], schedulingGates: [{ name: "warmstart.dev/cache-ready" }] },
    };
    assert.ok(!("schedulingGates" in (stripStamps(p).pod.spec ?? {})));
  });

  void test("malformed maps are left as they are, without a crash", () => {
    for (const p of [
      { metadata: { labels: "nope", annotations: ["a"] }, spec: { schedulingGates: "x" } },
      { metadata: null },
      { spec: {} },
      { metadata: { labels: { "warmstart.dev/capture": 1 } }, spec: { schedulingGates: [null, 3] } },
    ] as unknown as V1Pod[]) {
      assert.doesNotThrow(() => stripStamps(p));
    }
    const odd = stripStamps({ metadata: { labels: { "warmstart.dev/capture": 1 } } } as unknown as V1Pod);
    assert.deepEqual(odd.pod.metadata?.labels, {});
  });

  void test("isStampKey: the user annotations are the author's only as annotations", () => {
    assert.equal(isStampKey("warmstart.dev/restore-from", "annotation"), false);
    assert.equal(isStampKey("warmstart.dev/restore-from", "label"), true);
    assert.equal(isStampKey("warmstart.dev/skip", "annotation"), false);
    assert.equal(isStampKey("warmstart.dev/cache-size-limit", "annotation"), false);
    assert.equal(isStampKey("warmstart.dev/capture-size-limit", "annotation"), true);
    assert.equal(isStampKey("xwarmstart.dev/role", "annotation"), false);
    assert.equal(isStampKey("sim.warmstart.dev/ready", "annotation"), false);
  });
});
