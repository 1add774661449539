import { describe, test } from "node:test";
import assert from "node:assert/strict";
import type { V1Container, V1Pod } from "@kubernetes/client-node";
import { REASON_NO_CONTAINERS, REASON_NO_GPU, REASON_NO_MODEL, classifyPod, gpuCount } from "./classify.js";

const GPU = { limits: { "nvidia.com/gpu": "1" } };

function pod(...containers: V1Container[]): V1Pod {
  return { apiVersion: "v1", kind: "Pod", metadata: { name: "p" }, spec: { containers } };
}
const gpu = (c: Partial<V1Container>): V1Container => ({
  name: "main",
  image: "vllm/vllm-openai:v0.9.0",
  resources: GPU,
  ...c,
});
const model = (c: Partial<V1Container>): string | undefined => classifyPod(pod(gpu(c))).model;

void describe("classifyPod: model flags in every form", () => {
  for (const flag of ["--model", "--model-path", "--model-id", "--model_id"]) {
    void test(`${flag} as separate list items`, () => {
      const c = classifyPod(
        pod(gpu({ command: ["python3", "-m", "dynamo.vllm"], args: [flag, "org/m1", "--port", "8000"] })),
      );
      assert.equal(c.downloader, true);
      assert.equal(c.model, "org/m1");
      assert.equal(c.reason, `model from ${flag} flag`);
      assert.equal(c.containerIndex, 0);
    });
    void test(`${flag}=X`, () => {
      assert.equal(model({ args: [`${flag}=org/m2`] }), "org/m2");
    });
    void test(`"${flag} X" as one item`, () => {
      assert.equal(model({ args: [`${flag} org/m3`, "--port 8000"] }), "org/m3");
    });
    void test(`${flag} inside sh -c`, () => {
      assert.equal(model({ command: ["sh", "-c", `python3 -m server ${flag} org/m4 --tp 2`] }), "org/m4");
    });
  }

  void test("inside bash -lc, after cd && exec, with quotes", () => {
    assert.equal(
      model({
        command: ["/bin/bash", "-lc"],
        args: [`cd /app && exec python3 -m sglang.launch_server --model-path "org/my model" --tp 4`],
      }),
      "org/my model",
    );
  });

  void test("inside a script after ; with env assignments in front", () => {
    assert.equal(
      model({ args: ["-c", "set -e; A=1 B=2 python3 -m vllm.entrypoints.openai.api_server --model=org/x"] }),
      "org/x",
    );
  });

  void test("a script nested in a script", () => {
    assert.equal(model({ command: ["bash", "-c", `sh -c "vllm serve --model org/nested"`] }), "org/nested");
  });

  void test("similar flags are not model flags", () => {
    const c = classifyPod(
      pod(
        gpu({
          args: ["--served-model-name", "x", "--model-impl", "vllm", "--model-loader-extra-config", "{}"],
        }),
      ),
    );
    assert.equal(c.downloader, false);
    assert.equal(c.reason, REASON_NO_MODEL);
    assert.equal(c.containerIndex, 0);
  });

  void test("a flag with no value (dangling, or followed by another flag) names no model", () => {
    assert.equal(classifyPod(pod(gpu({ args: ["--model"] }))).downloader, false);
    assert.equal(classifyPod(pod(gpu({ args: ["--model", "--port", "8000"] }))).downloader, false);
    assert.equal(classifyPod(pod(gpu({ args: ["--model="] }))).downloader, false);
    assert.equal(classifyPod(pod(gpu({ command: ["sh", "-c", "serve --model && echo"] }))).downloader, false);
  });

  void test("Kubernetes $(VAR) and shell $VAR in the model resolve from literal env", () => {
    const env = [{ name: "MODEL", value: "org/from-env" }];
    assert.equal(model({ args: ["--model", "$(MODEL)"], env }), "org/from-env");
    assert.equal(model({ command: ["sh", "-c", "vllm serve --model ${MODEL}"], env }), "org/from-env");
    assert.equal(model({ command: ["sh", "-c", "vllm serve $MODEL --port 1"], env }), "org/from-env");
  });
});

void describe("classifyPod: launcher positionals", () => {
  void test("vllm serve X", () => {
    const c = classifyPod(pod(gpu({ command: ["vllm", "serve", "Qwen/Qwen3-0.6B", "--port", "8000"] })));
    assert.equal(c.model, "Qwen/Qwen3-0.6B");
    assert.equal(c.reason, "model from vllm serve positional");
  });

  void test("vllm by path, serve in args", () => {
    assert.equal(model({ command: ["/usr/local/bin/vllm"], args: ["serve", "org/a"] }), "org/a");
  });

  void test("vllm serve with flags before the model, skipping flag values and boolean flags", () => {
    assert.equal(
      model({ args: ["vllm", "serve", "--port", "8000", "--trust-remote-code", "org/b", "--tp", "2"] }),
      "org/b",
    );
    assert.equal(model({ args: ["vllm", "serve", "--port=8000", "org/c"] }), "org/c");
  });

  void test("vllm serve inside a shell string", () => {
    assert.equal(
      model({ command: ["sh", "-c", "exec vllm serve org/d --gpu-memory-utilization 0.9"] }),
      "org/d",
    );
    assert.equal(
      model({ command: ["bash", "-lc", "pip list; vllm serve 'org/e' 2>&1 | tee /tmp/log"] }),
      "org/e",
    );
  });

  void test("trtllm-serve X and trtllm-serve serve X", () => {
    const c = classifyPod(
      pod(gpu({ command: ["trtllm-serve", "nvidia/Llama-3.1-8B-FP8", "--tp_size", "1"] })),
    );
    assert.equal(c.model, "nvidia/Llama-3.1-8B-FP8");
    assert.equal(c.reason, "model from trtllm-serve positional");
    assert.equal(model({ command: ["sh", "-c", "trtllm-serve serve org/f --port 8000"] }), "org/f");
  });

  void test("trtllm-serve disaggregated names no model", () => {
    assert.equal(
      classifyPod(pod(gpu({ command: ["trtllm-serve", "disaggregated", "-c", "cfg.yaml"] }))).downloader,
      false,
    );
  });

  void test("vllm without serve, or serve followed by an operator, names no model", () => {
    assert.equal(classifyPod(pod(gpu({ command: ["vllm", "--version"] }))).downloader, false);
    assert.equal(classifyPod(pod(gpu({ command: ["sh", "-c", "vllm serve && true"] }))).downloader, false);
  });

  void test("a model flag wins over the positional", () => {
    assert.equal(model({ command: ["vllm", "serve", "org/pos", "--model", "org/flag"] }), "org/flag");
  });
});

void describe("classifyPod: env and NIM image", () => {
  for (const name of ["HF_MODEL_ID", "MODEL_ID", "NIM_MODEL_NAME"]) {
    void test(`env ${name}`, () => {
      const c = classifyPod(
        pod(
          gpu({
            image: "ghcr.io/huggingface/text-generation-inference:3.0",
            env: [{ name, value: "org/env" }],
          }),
        ),
      );
      assert.equal(c.downloader, true);
      assert.equal(c.model, "org/env");
      assert.equal(c.reason, `model from env ${name}`);
    });
  }

  void test("env from valueFrom names the model by its reference", () => {
    const c = classifyPod(
      pod(
        gpu({ env: [{ name: "MODEL_ID", valueFrom: { configMapKeyRef: { name: "models", key: "id" } } }] }),
      ),
    );
    assert.equal(c.downloader, true);
    assert.equal(c.model, "valueFrom(configMapKeyRef:models/id)");
  });

  void test("an empty model env names no model; the last definition wins", () => {
    assert.equal(classifyPod(pod(gpu({ env: [{ name: "MODEL_ID", value: "" }] }))).downloader, false);
    assert.equal(
      model({
        env: [
          { name: "MODEL_ID", value: "a" },
          { name: "MODEL_ID", value: "b" },
        ],
      }),
      "b",
    );
  });

  void test("NIM image: org/model from nvcr.io/nim, tag and digest dropped", () => {
    const c = classifyPod(pod(gpu({ image: "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8.4" })));
    assert.equal(c.model, "meta/llama-3.1-8b-instruct");
    assert.equal(c.reason, "model from NIM image");
    assert.equal(
      model({ image: "nvcr.io/nim/nvidia/nv-embedqa-e5-v5@sha256:0123abcd" }),
      "nvidia/nv-embedqa-e5-v5",
    );
    assert.equal(model({ image: "nvcr.io/nim/mistral:latest" }), "mistral");
  });

  void test("NIM_MODEL_NAME wins over the image; other nvcr.io images name nothing", () => {
    assert.equal(
      model({
        image: "nvcr.io/nim/meta/llama3:1",
        env: [{ name: "NIM_MODEL_NAME", value: "/models/custom" }],
      }),
      "/models/custom",
    );
    assert.equal(classifyPod(pod(gpu({ image: "nvcr.io/nvidia/tritonserver:24.01" }))).downloader, false);
  });
});

void describe("classifyPod: GPUs and the main container", () => {
  void test("GPU in requests only, or in limits only", () => {
    const req = gpu({ resources: { requests: { "nvidia.com/gpu": "2" } }, args: ["--model", "m"] });
    const lim = gpu({ resources: { limits: { "nvidia.com/gpu": "1" } }, args: ["--model", "m"] });
    assert.equal(classifyPod(pod(req)).downloader, true);
    assert.equal(classifyPod(pod(lim)).downloader, true);
    assert.equal(gpuCount(req), 2);
  });

  void test("numeric quantities from YAML count; zero does not", () => {
    const n = gpu({
      resources: { limits: { "nvidia.com/gpu": 4 as unknown as string } },
      args: ["--model", "m"],
    });
    assert.equal(classifyPod(pod(n)).downloader, true);
    const zero = gpu({ resources: { limits: { "nvidia.com/gpu": "0" } }, args: ["--model", "m"] });
    assert.deepEqual(classifyPod(pod(zero)), { downloader: false, reason: REASON_NO_GPU });
  });

  void test("the main container is the first GPU container, not the first container", () => {
    const sidecar: V1Container = { name: "proxy", image: "envoy", args: ["--model", "not-this"] };
    const first = gpu({ name: "w1", args: ["--model", "org/one"] });
    const second = gpu({ name: "w2", args: ["--model", "org/two"] });
    const c = classifyPod(pod(sidecar, first, second));
    assert.equal(c.containerIndex, 1);
    assert.equal(c.model, "org/one");
  });

  void test("a GPU container without a model is not a downloader even if a sidecar names one", () => {
    const sidecar: V1Container = { name: "side", image: "x", args: ["--model", "org/side"] };
    const c = classifyPod(pod(sidecar, gpu({ args: ["--port", "1"] })));
    assert.deepEqual(c, {
      downloader: false,
      reason: REASON_NO_MODEL,
      containerIndex: 1,
      gpus: { "nvidia.com/gpu": "1" },
    });
  });

  void test("frontends, routers, etcd and NATS (no GPU) are left alone", () => {
    const frontend: V1Container = {
      name: "frontend",
      image: "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.4",
      command: ["python3", "-m", "dynamo.frontend"],
      args: ["--http-port", "8000", "--model", "Qwen/Qwen3-0.6B"],
    };
    const router: V1Container = {
      name: "router",
      image: "lmsys/sglang-router",
      args: ["--model-path", "org/m"],
    };
    const etcd: V1Container = { name: "etcd", image: "quay.io/coreos/etcd:v3.5", command: ["etcd"] };
    const nats: V1Container = { name: "nats", image: "nats:2.10", args: ["-js"] };
    const nimNoGpu: V1Container = { name: "nim", image: "nvcr.io/nim/meta/llama3:1" };
    for (const c of [frontend, router, etcd, nats, nimNoGpu]) {
      assert.deepEqual(classifyPod(pod(c)), { downloader: false, reason: REASON_NO_GPU }, c.name);
    }
  });

  void test("odd pods never throw", () => {
    assert.equal(classifyPod({}).reason, REASON_NO_CONTAINERS);
    assert.equal(classifyPod({ spec: { containers: [] } }).reason, REASON_NO_CONTAINERS);
    const odd = {
      spec: { containers: [null, { name: "x", resources: { limits: { "nvidia.com/gpu": "abc" } } }] },
    };
    assert.equal(classifyPod(odd as unknown as V1Pod).reason, REASON_NO_GPU);
    const huge = gpu({
      args: [`--model ${"x".repeat(100_000)}`, ...Array.from({ length: 5000 }, (_, i) => `--f${i}`)],
    });
    assert.equal(classifyPod(pod(huge)).model?.length, 100_000);
  });
});
