/**
 * The classes of failure found on real charts, one rule each (the corpus test runs them on
 * rendered upstream pods; these pin each rule on the smallest pod that shows it).
 */
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import type { V1Container, V1Pod, V1Volume } from "@kubernetes/client-node";
import { REASON_PERSISTENT_MODEL, classifyPod } from "./classify.js";
import { CACHE_VOLUME, SHADOW_VOLUME } from "./contract.js";
import { decorateLeader, decorateRestore } from "./decorate.js";
import { isCredentialFlag } from "./env.js";
import { cacheHash } from "./hash.js";

const GPU = { limits: { "nvidia.com/gpu": "1" } };
const main = (c: Partial<V1Container>): V1Container => ({
  name: "vllm",
  image: "vllm/vllm-openai:v0.10.0",
  resources: GPU,
  ...c,
});
const pod = (c: Partial<V1Container>, spec: Partial<NonNullable<V1Pod["spec"]>> = {}): V1Pod => ({
  metadata: { generateName: "w-" },
  spec: { containers: [main(c)], ...spec },
});
const hashOf = (p: V1Pod): string => cacheHash(p, classifyPod(p)).hash;

void describe("GPUs: MIG slices and DRA claims count, and their kind and count are in the hash", () => {
  test("a MIG slice is a GPU", () => {
    const c = classifyPod(
      pod({ args: ["--model", "org/m"], resources: { limits: { "nvidia.com/mig-1g.10gb": "1" } } }),
    );
    assert.equal(c.downloader, true);
    assert.deepEqual(c.gpus, { "nvidia.com/mig-1g.10gb": "1" });
  });

  test("a DRA claim counts by its device class when the cluster says, by its names offline", () => {
    const p = pod(
      { args: ["--model", "org/m"], resources: { claims: [{ name: "accel" }] } },
      { resourceClaims: [{ name: "accel", resourceClaimTemplateName: "single" }] },
    );
    assert.equal(classifyPod(p, { deviceClasses: () => ["gpu.nvidia.com"] }).downloader, true);
    assert.equal(classifyPod(p, { deviceClasses: () => ["example.com/fpga"] }).downloader, false);
    assert.equal(classifyPod(p).downloader, false, "offline, a claim whose names say nothing is not a GPU");
    const named = pod(
      { args: ["--model", "org/m"], resources: { claims: [{ name: "gpu" }] } },
      { resourceClaims: [{ name: "gpu", resourceClaimTemplateName: "one-gpu" }] },
    );
    assert.deepEqual(classifyPod(named).gpus, { "claim:template/one-gpu": "1" });
  });

  test("NIM on 1 and on 2 GPUs downloads different profiles: different hashes", () => {
    const nim = (n: string): V1Pod =>
      pod({
        image: "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8",
        resources: { limits: { "nvidia.com/gpu": n } },
      });
    assert.notEqual(hashOf(nim("1")), hashOf(nim("2")));
  });
});

void describe("argv and flags", () => {
  test('eval "exec vllm serve ..." names its model', () => {
    const c = classifyPod(
      pod({ command: ["/bin/bash", "-c"], args: [`eval "exec vllm serve org/q --port 8000"`] }),
    );
    assert.equal(c.model, "org/q");
  });

  test("the same argv split differently between command and args hashes equal", () => {
    const a = pod({ command: ["python3", "-m", "dynamo.vllm", "--model", "org/m"] });
    const b = pod({ command: ["python3"], args: ["-m", "dynamo.vllm", "--model", "org/m"] });
    const c = pod({ command: ["/bin/sh", "-c", "exec python3 -m dynamo.vllm --model org/m"] });
    assert.equal(hashOf(a), hashOf(b));
    assert.equal(hashOf(a), hashOf(c), "a one-command sh -c wrapper is the command itself");
  });

  test("--max-num-batched-token is an engine flag: a hash input, never redacted", () => {
    const k = (v: string): V1Pod => pod({ args: ["--model=org/m", `--max-num-batched-token=${v}`] });
    assert.notEqual(hashOf(k("8192")), hashOf(k("4096")));
    assert.equal(isCredentialFlag("--max-num-batched-tokens"), false);
    for (const f of [
      "--hf-token",
      "--token",
      "--api-key",
      "--openai-api-key",
      "--db-password",
      "--client-secret",
    ])
      assert.equal(isCredentialFlag(f), true, f);
  });

  test("endpoint flags, multi-valued served names and role flags inside *_ARGS env are stripped", () => {
    const a = pod({
      args: ["--model", "org/m", "--port", "8000", "--served-model-name", "a", "b"],
      env: [
        {
          name: "VLLM_ADDITIONAL_ARGS",
          value: `--kv_transfer_config '{"kv_role":"kv_producer"}' --max-model-len 4096`,
        },
      ],
    });
    const b = pod({
      args: ["--model", "org/m", "--host=0.0.0.0", "--port=8001"],
      env: [{ name: "VLLM_ADDITIONAL_ARGS", value: "--max-model-len 4096" }],
    });
    assert.equal(hashOf(a), hashOf(b));
  });

  test("per-replica wiring env of LWS and AIBrix is out; LWS_GROUP_SIZE stays in", () => {
    const w = (addr: string, size: string, roleset: string): V1Pod =>
      pod({
        args: ["--model", "org/m"],
        env: [
          { name: "LWS_LEADER_ADDRESS", value: addr },
          { name: "LWS_GROUP_SIZE", value: size },
          { name: "ROLESET_NAME", value: roleset },
          { name: "ROLE_TEMPLATE_HASH", value: roleset },
        ],
      });
    assert.equal(hashOf(w("g-0.svc", "2", "rs-abc12")), hashOf(w("g-1.svc", "2", "rs-xyz89")));
    assert.notEqual(hashOf(w("g-0.svc", "2", "r")), hashOf(w("g-0.svc", "4", "r")));
  });
});

// KServe's vLLM runtime: the model comes from the storage initializer, the engine sees /mnt/models.
const kserve = (uri: string, service: string): V1Pod => ({
  metadata: { generateName: `${service}-predictor-` },
  spec: {
    initContainers: [
      {
        name: "storage-initializer",
        image: "kserve/storage-initializer:v0.15.0",
        args: [uri, "/mnt/models"],
        volumeMounts: [{ name: "kserve-provision-location", mountPath: "/mnt/models" }],
      },
    ],
    containers: [
      main({
        name: "kserve-container",
        args: ["--model=/mnt/models", "--port=8080"],
        env: [{ name: "INFERENCE_SERVICE_NAME", value: service }],
        volumeMounts: [{ name: "kserve-provision-location", mountPath: "/mnt/models", readOnly: true }],
      }),
    ],
    volumes: [{ name: "kserve-provision-location", emptyDir: {} }],
  },
});

void describe("model identity from storage sources", () => {
  test("two InferenceServices at /mnt/models with different models never share a hash", () => {
    const a = classifyPod(kserve("hf://org/a", "svc-a"));
    assert.equal(a.model, "hf://org/a");
    assert.notEqual(hashOf(kserve("hf://org/a", "svc-a")), hashOf(kserve("hf://org/b", "svc-a")));
    assert.equal(
      hashOf(kserve("hf://org/a", "svc-a")),
      hashOf(kserve("hf://org/a", "svc-b")),
      "the service name is wiring",
    );
  });

  test("a restore's storage initializer sees the shadow at /mnt/models and the read-only tree its links point into", () => {
    const p = kserve("hf://org/a", "svc");
    const c = classifyPod(p);
    const restore = decorateRestore(p, {
      hash: "ab".repeat(32),
      containerIndex: c.containerIndex,
      locations: c.locations?.locations ?? [],
      image: "warmstart:t",
      prewarm: false,
      prewarmParallelism: 1,
    });
    const init = restore.spec?.initContainers?.find((x) => x.name === "storage-initializer");
    assert.deepEqual(
      (init?.volumeMounts ?? []).map((m) => [m.name, m.mountPath]),
      [
        [SHADOW_VOLUME, "/mnt/models"],
        ["warmstart-ro", "/warmstart/ro"],
      ],
    );
  });

  test("a pvc:// source, or a model folder on a claim, is admitted cold with the reason", () => {
    assert.equal(classifyPod(kserve("pvc://models/llama", "s")).cold, REASON_PERSISTENT_MODEL);
    const onClaim = pod(
      { args: ["--model", "/models/llama"], volumeMounts: [{ name: "m", mountPath: "/models" }] },
      { volumes: [{ name: "m", persistentVolumeClaim: { claimName: "llama" } }] },
    );
    const c = classifyPod(onClaim);
    assert.equal(c.downloader, true);
    assert.equal(c.cold, REASON_PERSISTENT_MODEL);
  });
});

void describe("capture where the engine really writes", () => {
  const mountsOf = (p: V1Pod, container = 0): Array<[string, string, string | undefined]> =>
    (p.spec?.containers[container]?.volumeMounts ?? []).map((m) => [m.name, m.mountPath, m.subPath]);
  const place = (p: V1Pod) => {
    const c = classifyPod(p);
    return {
      hash: "ab".repeat(32),
      containerIndex: c.containerIndex,
      locations: c.locations?.locations ?? [],
    };
  };
  const restoreOpts = { image: "warmstart:t", prewarm: false, prewarmParallelism: 1 };

  test("HF_HOME=/tmp (production-stack): the capture volume is mounted at its hub cache, and a restore's shadow the same", () => {
    const p = pod({ args: ["--model", "org/m"], env: [{ name: "HF_HOME", value: "/tmp" }] });
    const leader = decorateLeader(p, { ...place(p), electionId: "e", sizeLimit: "1Gi" });
    assert.deepEqual(
      mountsOf(leader).find(([, path]) => path.startsWith("/tmp")),
      [CACHE_VOLUME, "/tmp/hub", "model/at/tmp/hub"],
      "the hub cache, not the rest of /tmp (readiness files, metrics databases)",
    );
    assert.equal(
      leader.spec?.containers[0]?.env?.find((e) => e.name === "HF_HOME")?.value,
      "/tmp",
      "the pod's env is kept",
    );
    const restore = decorateRestore(p, { ...place(p), ...restoreOpts });
    assert.deepEqual(
      mountsOf(restore).find(([, path]) => path.startsWith("/tmp")),
      [SHADOW_VOLUME, "/tmp/hub", "model/at/tmp/hub"],
    );
  });

  test("HF_HOME on the pod's own emptyDir (llm-d): every mount of that emptyDir is taken over", () => {
    const vols: V1Volume[] = [{ name: "model-cache", emptyDir: { sizeLimit: "20Gi" } }];
    const p = pod(
      {
        args: ["vllm", "serve", "org/m"],
        env: [{ name: "HF_HOME", value: "/model-cache" }],
        volumeMounts: [{ name: "model-cache", mountPath: "/model-cache" }],
      },
      {
        volumes: vols,
        initContainers: [
          {
            name: "warm",
            image: "x",
            volumeMounts: [{ name: "model-cache", mountPath: "/c", subPath: "hub" }],
          },
        ],
      },
    );
    const leader = decorateLeader(p, { ...place(p), electionId: "e", sizeLimit: "1Gi" });
    assert.deepEqual(
      mountsOf(leader).find(([, path]) => path === "/model-cache"),
      [CACHE_VOLUME, "/model-cache", "model/at/model-cache"],
    );
    assert.deepEqual(
      (leader.spec?.initContainers?.[0]?.volumeMounts ?? []).map((m) => [m.name, m.subPath]),
      [[CACHE_VOLUME, "model/at/model-cache/hub"]],
    );
  });

  test("XDG_CACHE_HOME=/tmp: the engines' folders below it are captured, never the whole of /tmp", () => {
    const p = pod({ args: ["--model", "org/m"], env: [{ name: "XDG_CACHE_HOME", value: "/tmp" }] });
    assert.deepEqual(
      classifyPod(p).locations?.locations.map((l) => [l.path, l.kind]),
      [
        ["/tmp/huggingface/hub", "model"],
        ["/tmp/vllm", "cache"],
        ["/tmp/torch", "cache"],
        ["/tmp/outlines", "cache"],
      ],
      "not /tmp itself: the hub client's token, pip's cache, the pod's scratch",
    );
    const leader = decorateLeader(p, { ...place(p), electionId: "e", sizeLimit: "1Gi" });
    assert.ok(!mountsOf(leader).some(([, path]) => path === "/tmp"));
    assert.deepEqual(
      mountsOf(leader).find(([, path]) => path === "/tmp/vllm"),
      [CACHE_VOLUME, "/tmp/vllm", "cache/at/tmp/vllm"],
    );
    const own = pod({
      args: ["--model", "org/m"],
      env: [
        { name: "XDG_CACHE_HOME", value: "/tmp" },
        { name: "VLLM_CACHE_ROOT", value: "/vllm-cache" },
        { name: "HF_HUB_CACHE", value: "/hub" },
      ],
    });
    assert.deepEqual(
      classifyPod(own).locations?.locations.map((l) => l.path),
      ["/hub", "/vllm-cache", "/tmp/torch", "/tmp/outlines"],
      "an engine the pod points elsewhere is captured there alone",
    );
  });

  test("on the pod's own /tmp emptyDir, the engines' folders are captured and the rest stays the pod's", () => {
    const tmp = (env: Array<{ name: string; value: string }>, init = false): V1Pod =>
      pod(
        { args: ["--model", "org/m"], env, volumeMounts: [{ name: "tmp", mountPath: "/tmp" }] },
        {
          volumes: [{ name: "tmp", emptyDir: {} }],
          ...(init
            ? {
                initContainers: [
                  { name: "i", image: "x", volumeMounts: [{ name: "tmp", mountPath: "/tmp" }] },
                ],
              }
            : {}),
        },
      );
    for (const [p, path, tree] of [
      [tmp([{ name: "XDG_CACHE_HOME", value: "/tmp" }]), "/tmp/vllm", "cache/at/tmp/vllm"],
      [tmp([{ name: "HF_HOME", value: "/tmp" }]), "/tmp/hub", "model/at/tmp/hub"],
    ] as const) {
      const leader = decorateLeader(p, { ...place(p), electionId: "e", sizeLimit: "1Gi" });
      assert.deepEqual(
        mountsOf(leader).find(([, at]) => at === "/tmp"),
        ["tmp", "/tmp", undefined],
        "the emptyDir is not taken over",
      );
      assert.deepEqual(
        mountsOf(leader).find(([, at]) => at === path),
        [CACHE_VOLUME, path, tree],
      );
      const restore = decorateRestore(p, { ...place(p), ...restoreOpts });
      assert.deepEqual(
        mountsOf(restore).find(([, at]) => at === path),
        [SHADOW_VOLUME, path, tree],
      );
    }
    // Another container fills it too: taken over whole, so both keep seeing the same files.
    const p = tmp([{ name: "HF_HOME", value: "/tmp" }], true);
    assert.deepEqual(
      classifyPod(p).locations?.locations.map((l) => [l.path, l.volume]),
      [["/tmp", "tmp"]],
    );
  });

  test("a system folder, or Warmstart's own, is never mounted over", () => {
    for (const v of ["/", "/etc", "/usr/lib/x", "/warmstart/ro"]) {
      const c = classifyPod(pod({ args: ["--model", "org/m"], env: [{ name: "HF_HUB_CACHE", value: v }] }));
      assert.deepEqual(c.locations?.locations, [], v);
      assert.ok(
        c.locations?.skipped.some((s) => s.path === v || v === "/"),
        v,
      );
    }
  });
});

void describe("what a pod's author controls cannot rename or relocate a model", () => {
  test("KServe's announced source names only its own folder: an annotation cannot rename a model elsewhere", () => {
    const p = pod(
      { args: ["--model", "/data/mine"], volumeMounts: [{ name: "d", mountPath: "/data" }] },
      { volumes: [{ name: "d", emptyDir: {} }] },
    );
    p.metadata = {
      annotations: { "internal.serving.kserve.io/storage-initializer-sourceuri": "hf://org/victim" },
    };
    const c = classifyPod(p);
    assert.equal(c.model, "/data/mine", "the annotation does not speak for /data");
    assert.equal(c.source, undefined);
  });

  test("a location reaching through `..` into a system folder is refused like the folder itself", () => {
    const c = classifyPod(
      pod({ args: ["--model", "org/m"], env: [{ name: "VLLM_CACHE_ROOT", value: "/tmp/../etc/x" }] }),
    );
    assert.deepEqual(c.locations?.locations, []);
    assert.ok(c.locations?.skipped.some((s) => s.path === "/etc/x"));
  });
});
