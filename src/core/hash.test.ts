import { describe, test } from "node:test";
import assert from "node:assert/strict";
import type { V1Container, V1EnvVar, V1Pod } from "@kubernetes/client-node";
import { classifyPod } from "./classify.js";
import { REDACTED, cacheHash, hashOfInputs, scopeOfInputs, sealInputs, stripRoleArgs } from "./hash.js";
import { namespaceInScope, scopeKey } from "./scope.js";

function pod(c: Partial<V1Container>, extra: V1Container[] = []): V1Pod {
  return {
    metadata: { generateName: "w-" },
    spec: {
      containers: [
        ...extra,
        {
          name: "main",
          image: "nvcr.io/nvidia/ai-dynamo/vllm-runtime:0.4.0",
          resources: { limits: { "nvidia.com/gpu": "1" } },
          ...c,
        },
      ],
    },
  };
}
const hashOf = (p: V1Pod): string => cacheHash(p, classifyPod(p)).hash;
const inputsOf = (p: V1Pod): ReturnType<typeof cacheHash>["inputs"] => cacheHash(p, classifyPod(p)).inputs;

const DYN_ENV = (component: string, index: string): V1EnvVar[] => [
  { name: "DYN_NAMESPACE", value: "llm-demo" },
  { name: "DYN_COMPONENT", value: component },
  { name: "DYNAMO_PORT", value: component === "prefill" ? "9090" : "9091" },
  { name: "ETCD_ENDPOINTS", value: "http://etcd:2379" },
  { name: "NATS_SERVER", value: "nats://nats:4222" },
  { name: "NATS_URL", value: "nats://nats:4222" },
  { name: "GROVE_PCLQ_NAME", value: `llm-0-${component}` },
  { name: "GROVE_PCLQ_POD_INDEX", value: index },
  { name: "GROVE_PCSG_INDEX", value: index },
  { name: "HF_HOME", value: "/cache/hf" },
];

void describe("cacheHash: shape and determinism", () => {
  void test("full sha256 hex and the 16-char short", () => {
    const h = cacheHash(pod({ args: ["--model", "m"] }), classifyPod(pod({ args: ["--model", "m"] })));
    assert.match(h.hash, /^[0-9a-f]{64}$/);
    assert.equal(h.short, h.hash.slice(0, 16));
    assert.equal(h.hash, hashOfInputs(h.inputs));
  });

  void test("env order does not matter; the last definition of a name does", () => {
    const a = pod({
      args: ["--model", "m"],
      env: [
        { name: "A", value: "1" },
        { name: "B", value: "2" },
      ],
    });
    const b = pod({
      args: ["--model", "m"],
      env: [
        { name: "B", value: "2" },
        { name: "A", value: "1" },
      ],
    });
    assert.equal(hashOf(a), hashOf(b));
    const c = pod({
      args: ["--model", "m"],
      env: [
        { name: "A", value: "0" },
        { name: "B", value: "2" },
        { name: "A", value: "1" },
      ],
    });
    assert.equal(hashOf(c), hashOf(a));
    assert.deepEqual(
      inputsOf(b).env.map((e) => e.name),
      ["A", "B"],
    );
  });

  void test("the recipe is stable: a fixed pod keeps its hash (change v when this must change)", () => {
    const p = pod({
      image: "vllm/vllm-openai:v0.9.0",
      command: ["vllm", "serve", "Qwen/Qwen3-0.6B"],
      env: [{ name: "A", value: "1" }],
    });
    assert.deepEqual(inputsOf(p), {
      v: 2,
      image: "vllm/vllm-openai:v0.9.0",
      argv: ["vllm", "serve", "Qwen/Qwen3-0.6B"],
      env: [{ name: "A", value: "1" }],
      envFrom: [],
      gpus: { "nvidia.com/gpu": "1" },
      model: "Qwen/Qwen3-0.6B",
    });
    // sha256 of the stable JSON, computed outside this code.
    assert.equal(hashOf(p), "0f79cda10bc63a48b1eb59ede6b5188dda58b02698fa6c38a986a74e25a22587");
  });

  void test("a sidecar that neither mounts the cache nor sets a cache location does not count", () => {
    const side = (v: string): V1Container => ({ name: "side", image: `envoy:${v}` });
    assert.equal(
      hashOf(pod({ args: ["--model", "m"] }, [side("1")])),
      hashOf(pod({ args: ["--model", "m"] }, [side("2")])),
    );
  });
});

void describe("cacheHash: disaggregated workers of one model hash equal", () => {
  void test("vLLM under Dynamo: --is-prefill-worker, kv configs, DYN_/GROVE_/etcd/NATS env", () => {
    const prefill = pod({
      command: ["python3", "-m", "dynamo.vllm"],
      args: [
        "--model",
        "Qwen/Qwen3-0.6B",
        "--is-prefill-worker",
        "--kv-transfer-config",
        '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}',
        "--kv-events-config",
        '{"enable_kv_cache_events": true}',
      ],
      env: DYN_ENV("prefill", "0"),
    });
    const decode = pod({
      command: ["python3", "-m", "dynamo.vllm"],
      args: [
        "--model",
        "Qwen/Qwen3-0.6B",
        "--is-decode-worker",
        '--kv-transfer-config={"kv_connector":"NixlConnector"}',
      ],
      env: DYN_ENV("decode", "1"),
    });
    assert.equal(hashOf(prefill), hashOf(decode));
    assert.deepEqual(inputsOf(prefill).argv, ["python3", "-m", "dynamo.vllm", "--model", "Qwen/Qwen3-0.6B"]);
    assert.deepEqual(
      inputsOf(prefill).env.map((e) => e.name),
      ["HF_HOME"],
    );
  });

  void test("SGLang: --disaggregation-mode prefill|decode with other --disaggregation-* values", () => {
    const mk = (mode: string, port: string): V1Pod =>
      pod({
        command: ["python3", "-m", "sglang.launch_server"],
        args: [
          "--model-path",
          "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
          "--disaggregation-mode",
          mode,
          "--disaggregation-bootstrap-port",
          port,
          "--disaggregation-transfer-backend=nixl",
          "--tp",
          "2",
        ],
      });
    assert.equal(hashOf(mk("prefill", "30001")), hashOf(mk("decode", "30002")));
    assert.deepEqual(inputsOf(mk("prefill", "1")).argv, [
      "python3",
      "-m",
      "sglang.launch_server",
      "--model-path",
      "deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
      "--tp",
      "2",
    ]);
  });

  void test("shell-string forms (sh -c, bash -lc, one-item flag pairs)", () => {
    const prefill = pod({
      command: ["/bin/sh", "-c"],
      args: [
        "exec python3 -m dynamo.sglang --model-path Qwen/Qwen3-0.6B --disaggregation-mode prefill --disaggregation-bootstrap-port 30001 --tp 1",
      ],
    });
    const decode = pod({
      command: ["/bin/sh", "-c"],
      args: [
        "exec   python3 -m dynamo.sglang --model-path Qwen/Qwen3-0.6B --disaggregation-mode=decode --tp 1",
      ],
    });
    assert.equal(hashOf(prefill), hashOf(decode));

    const vp = pod({
      command: [
        "bash",
        "-lc",
        `cd /w && vllm serve org/m --is-prefill-worker --kv-transfer-config '{"a": 1}' 2>&1`,
      ],
    });
    const vd = pod({ command: ["bash", "-lc", `cd /w && vllm serve org/m --is-decode-worker 2>&1`] });
    assert.equal(hashOf(vp), hashOf(vd));

    const one = pod({ args: ["--model org/m", "--disaggregation-mode prefill", "--is-prefill-worker"] });
    const two = pod({ args: ["--model org/m", "--disaggregation-mode decode"] });
    assert.equal(hashOf(one), hashOf(two));
    assert.deepEqual(inputsOf(one).argv, ["--model org/m"]);
  });

  void test("a nested sh -c script is stripped too", () => {
    const a = pod({ command: ["bash", "-c", `sh -c "vllm serve org/m --is-prefill-worker"`] });
    const b = pod({ command: ["bash", "-c", `sh -c "vllm serve org/m"`] });
    assert.equal(hashOf(a), hashOf(b));
  });

  void test("two replicas differing only in GROVE_* pod index hash equal", () => {
    const r0 = pod({ args: ["--model", "m"], env: DYN_ENV("decode", "0") });
    const r1 = pod({ args: ["--model", "m"], env: DYN_ENV("decode", "1") });
    assert.equal(hashOf(r0), hashOf(r1));
  });

  void test("WARMSTART_* env the author sets counts, except WARMSTART_PREWARM", () => {
    const base = hashOf(pod({ args: ["--model", "m"] }));
    const own = (name: string, value: string): V1Pod =>
      pod({ args: ["--model", "m"], env: [{ name, value }] });
    // A user's own WARMSTART_* variable may change what the engine does: it is theirs, and in.
    assert.notEqual(hashOf(own("WARMSTART_MODE", "a")), base);
    assert.notEqual(hashOf(own("WARMSTART_MODE", "a")), hashOf(own("WARMSTART_MODE", "b")));
    assert.notEqual(hashOf(own("WARMSTART_CACHE_TREE", "x")), base);
    // WARMSTART_PREWARM only decides whether a restore warms the page cache: the tree downloaded
    // is the same either way, so it does not split the cache.
    assert.equal(hashOf(own("WARMSTART_PREWARM", "0")), base);
    assert.equal(hashOf(own("WARMSTART_PREWARM", "1")), base);
  });
});

void describe("stripRoleArgs", () => {
  void test("a value flag left dangling at the end is dropped without crashing", () => {
    assert.deepEqual(stripRoleArgs([], ["--model", "m", "--disaggregation-mode"]), {
      command: [],
      args: ["--model", "m"],
    });
    assert.deepEqual(stripRoleArgs([], ["--model", "m", "--kv-transfer-config"]), {
      command: [],
      args: ["--model", "m"],
    });
    assert.deepEqual(stripRoleArgs(["sh", "-c", "serve --model m --kv-events-config"], []), {
      command: ["sh", "-c", "serve --model m"],
      args: [],
    });
  });

  void test("a value flag never eats the next flag", () => {
    assert.deepEqual(stripRoleArgs([], ["--disaggregation-mode", "--tp", "2"]).args, ["--tp", "2"]);
  });

  void test("a flag at the end of command takes its value from args", () => {
    assert.deepEqual(stripRoleArgs(["run", "--disaggregation-mode"], ["prefill", "--model", "m"]), {
      command: ["run"],
      args: ["--model", "m"],
    });
  });

  void test("boolean role flags in =value form go too; look-alike flags stay", () => {
    assert.deepEqual(
      stripRoleArgs([], ["--is-prefill-worker=true", "--is-prefill", "--kv-cache-dtype", "fp8"]).args,
      ["--is-prefill", "--kv-cache-dtype", "fp8"],
    );
  });

  void test("an empty argument as written is kept", () => {
    assert.deepEqual(stripRoleArgs([], ["--chat-template", ""]).args, ["--chat-template", ""]);
  });
});

void describe("cacheHash: what changes the download changes the hash", () => {
  const base = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--tp", "1"];
  const h = (args: string[], env: V1EnvVar[] = [], image?: string): string =>
    hashOf(
      pod({
        command: ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        args,
        env,
        ...(image ? { image } : {}),
      }),
    );
  const ref = h(base);

  void test("a different model", () => {
    assert.notEqual(h(["--model", "meta-llama/Llama-3.1-70B-Instruct", "--tp", "1"]), ref);
  });
  void test("--revision", () => {
    assert.notEqual(h([...base, "--revision", "main"]), ref);
    assert.notEqual(h([...base, "--revision", "a1b2c3"]), h([...base, "--revision", "d4e5f6"]));
  });
  void test("--tokenizer", () => {
    assert.notEqual(h([...base, "--tokenizer", "org/tok"]), ref);
  });
  void test("quantization flags", () => {
    assert.notEqual(h([...base, "--quantization", "fp8"]), ref);
    assert.notEqual(h([...base, "--quantization=awq"]), h([...base, "--quantization=gptq"]));
  });
  void test("cache-location env", () => {
    assert.notEqual(h(base, [{ name: "HF_HOME", value: "/a" }]), h(base, [{ name: "HF_HOME", value: "/b" }]));
    assert.notEqual(h(base, [{ name: "TORCHINDUCTOR_CACHE_DIR", value: "/x" }]), ref);
  });
  void test("the image", () => {
    assert.notEqual(h(base, [], "vllm/vllm-openai:v0.9.0"), h(base, [], "vllm/vllm-openai:v0.9.1"));
  });
  void test("a model inside a shell string", () => {
    assert.notEqual(
      hashOf(pod({ command: ["sh", "-c", "vllm serve org/a"] })),
      hashOf(pod({ command: ["sh", "-c", "vllm serve org/b"] })),
    );
  });
  void test("a different model env or NIM image", () => {
    assert.notEqual(h([], [{ name: "MODEL_ID", value: "a" }]), h([], [{ name: "MODEL_ID", value: "b" }]));
    assert.notEqual(
      hashOf(pod({ image: "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.8" })),
      hashOf(pod({ image: "nvcr.io/nim/meta/llama-3.1-70b-instruct:1.8" })),
    );
  });
});

void describe("cacheHash: credentials count by name only and never reach the inputs", () => {
  const SECRET = "hf_s3cr3tValue9876";
  const CREDS = [
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "NGC_API_KEY",
    "S3_TOKEN",
    "OPENAI_API_KEY",
    "DB_SECRET",
    "ADMIN_PASSWORD",
  ];

  for (const name of CREDS) {
    void test(`${name}: its value changes nothing, its presence does`, () => {
      const a = pod({ args: ["--model", "m"], env: [{ name, value: SECRET }] });
      const b = pod({ args: ["--model", "m"], env: [{ name, value: "other" }] });
      assert.equal(hashOf(a), hashOf(b));
      assert.notEqual(hashOf(a), hashOf(pod({ args: ["--model", "m"] })));
      assert.deepEqual(inputsOf(a).env, [{ name, credential: true }]);
      assert.ok(!JSON.stringify(inputsOf(a)).includes(SECRET));
    });
  }

  void test("credential from a Secret counts by name only, not by which Secret", () => {
    const from = (secret: string): V1EnvVar => ({
      name: "HF_TOKEN",
      valueFrom: { secretKeyRef: { name: secret, key: "token" } },
    });
    assert.equal(
      hashOf(pod({ args: ["--model", "m"], env: [from("a")] })),
      hashOf(pod({ args: ["--model", "m"], env: [from("b")] })),
    );
  });

  void test("credential flags and assignments in args and shell strings are redacted", () => {
    const a = pod({
      command: ["sh", "-c", `HF_TOKEN=${SECRET} vllm serve org/m --api-key ${SECRET}`],
      args: ["--hf-token", SECRET, `--ngc-api-key=${SECRET}`, `NGC_API_KEY=${SECRET}`],
    });
    const b = pod({
      command: ["sh", "-c", "HF_TOKEN=x vllm serve org/m --api-key y"],
      args: ["--hf-token", "z", "--ngc-api-key=w", "NGC_API_KEY=v"],
    });
    assert.equal(hashOf(a), hashOf(b));
    const text = JSON.stringify(inputsOf(a));
    assert.ok(!text.includes(SECRET), text);
    assert.ok(text.includes(REDACTED));
    assert.deepEqual(inputsOf(a).argv.slice(-4), [
      "--hf-token",
      REDACTED,
      `--ngc-api-key=${REDACTED}`,
      `NGC_API_KEY=${REDACTED}`,
    ]);
  });

  void test("a password inside a URL never reaches the inputs", () => {
    const a = pod({
      args: ["--model", "m"],
      env: [{ name: "HF_ENDPOINT", value: `https://user:${SECRET}@mirror.local/hf` }],
    });
    assert.ok(!JSON.stringify(inputsOf(a)).includes(SECRET));
    assert.deepEqual(inputsOf(a).env, [{ name: "HF_ENDPOINT", value: "https://<redacted>@mirror.local/hf" }]);
  });

  void test("TOKENIZER-like names are not credentials", () => {
    const a = pod({ args: ["--model", "m"], env: [{ name: "TOKENIZER_PATH", value: "/a" }] });
    const b = pod({ args: ["--model", "m"], env: [{ name: "TOKENIZER_PATH", value: "/b" }] });
    assert.notEqual(hashOf(a), hashOf(b));
  });
});

void describe("cacheHash: valueFrom counts by its reference", () => {
  const withRef = (ref: V1EnvVar["valueFrom"]): V1Pod =>
    pod({ args: ["--model", "m"], env: [{ name: "MODEL_REVISION", valueFrom: ref }] });

  void test("same reference hashes equal, another reference differs", () => {
    const a = withRef({ configMapKeyRef: { name: "rev", key: "v" } });
    assert.equal(hashOf(a), hashOf(withRef({ configMapKeyRef: { name: "rev", key: "v" } })));
    assert.notEqual(hashOf(a), hashOf(withRef({ configMapKeyRef: { name: "rev2", key: "v" } })));
    assert.notEqual(hashOf(a), hashOf(withRef({ configMapKeyRef: { name: "rev", key: "w" } })));
    assert.deepEqual(inputsOf(a).env, [{ name: "MODEL_REVISION", from: "configMapKeyRef:rev/v" }]);
  });

  void test("a fieldRef such as the pod name is the same reference in every pod", () => {
    const a = pod({
      args: ["--model", "m"],
      env: [{ name: "MY_POD", valueFrom: { fieldRef: { fieldPath: "metadata.name" } } }],
    });
    assert.deepEqual(inputsOf(a).env, [{ name: "MY_POD", from: "fieldRef:metadata.name" }]);
  });

  void test("envFrom counts by reference", () => {
    const a = pod({
      args: ["--model", "m"],
      envFrom: [{ configMapRef: { name: "engine" } }, { secretRef: { name: "s" }, prefix: "X_" }],
    });
    assert.deepEqual(inputsOf(a).envFrom, ["configMapRef:engine", "secretRef:s prefix=X_"]);
    assert.notEqual(
      hashOf(a),
      hashOf(pod({ args: ["--model", "m"], envFrom: [{ configMapRef: { name: "other" } }] })),
    );
  });
});

void describe("cacheHash: nothing on the pod says what was injected", () => {
  void test("a forged injected-env annotation cannot make the hash ignore the pod's own env", () => {
    const withEndpoint = (endpoint: string, annotations?: Record<string, string>): V1Pod => ({
      ...pod({ args: ["--model", "m"], env: [{ name: "HF_ENDPOINT", value: endpoint }] }),
      metadata: { generateName: "w-", annotations },
    });
    const forged = { "warmstart.dev/injected-env": "HF_ENDPOINT" };
    // Two mirrors serve different trees: their caches must never merge, whatever the pod claims.
    assert.notEqual(
      hashOf(withEndpoint("https://mirror-a.local", forged)),
      hashOf(withEndpoint("https://mirror-b.local", forged)),
    );
    assert.equal(
      hashOf(withEndpoint("https://mirror-a.local", forged)),
      hashOf(withEndpoint("https://mirror-a.local")),
    );
  });

  void test("the hash does not depend on the cache-env template: it is composed before decoration", () => {
    // The template is only known to decorate; hashInputs has no way to take it, by design. What
    // the author sets for a cache location is theirs, and counts.
    const a = pod({ args: ["--model", "m"], env: [{ name: "HF_HOME", value: "/data/hf" }] });
    const b = pod({ args: ["--model", "m"], env: [{ name: "HF_HOME", value: "/other/hf" }] });
    assert.notEqual(hashOf(a), hashOf(b));
  });
});

void describe("cacheHash: every container that touches the cache", () => {
  const init = (c: Partial<V1Container>): V1Pod => {
    const p = pod({ args: ["--model", "m"] });
    p.spec!.initContainers = [{ name: "prep", image: "prep:1", ...c }];
    return p;
  };
  const mountsCache = (image: string): Partial<V1Container> => ({
    image,
    volumeMounts: [{ name: "warmstart-cache", mountPath: "/warmstart/cache-root" }],
  });

  void test("an init container that mounts the cache volume counts: it can write into the tree", () => {
    const plain = hashOf(pod({ args: ["--model", "m"] }));
    assert.notEqual(hashOf(init(mountsCache("fetch:1"))), plain);
    assert.notEqual(hashOf(init(mountsCache("fetch:1"))), hashOf(init(mountsCache("fetch:2"))));
    assert.deepEqual(inputsOf(init(mountsCache("fetch:1"))).containers, [
      {
        kind: "init",
        image: "fetch:1",
        argv: [],
        env: [],
        envFrom: [],
        mounts: ["/warmstart/cache-root"],
      },
    ]);
  });

  void test("a sidecar that sets a cache location counts, with its args and env", () => {
    const side = (args: string[]): V1Container => ({
      name: "fetcher",
      image: "fetch:1",
      args,
      env: [{ name: "HF_HOME", value: "/warmstart/cache-root/model/huggingface" }],
    });
    const a = pod({ args: ["--model", "m"] }, [side(["--repo", "org/a"])]);
    const b = pod({ args: ["--model", "m"] }, [side(["--repo", "org/b"])]);
    assert.notEqual(hashOf(a), hashOf(b));
    assert.equal(inputsOf(a).containers?.[0]?.kind, "container");
    // Its credentials are redacted like the main container's.
    const token = "hf_sidecarSecret4321";
    const secret = pod({ args: ["--model", "m"] }, [
      { ...side([]), env: [...side([]).env!, { name: "HF_TOKEN", value: token }] },
    ]);
    assert.ok(!JSON.stringify(inputsOf(secret)).includes(token));
  });

  void test("with a shared process namespace every container running beside the engine counts (it reaches /proc/<pid>/root)", () => {
    const side = (v: string): V1Container => ({ name: "side", image: `debug:${v}` });
    const shared = (p: V1Pod): V1Pod => ({ ...p, spec: { ...p.spec!, shareProcessNamespace: true } });
    const a = shared(pod({ args: ["--model", "m"] }, [side("1")]));
    const b = shared(pod({ args: ["--model", "m"] }, [side("2")]));
    assert.notEqual(hashOf(a), hashOf(b), "the sidecar that can write the tree is in the hash");
    assert.deepEqual(inputsOf(a).containers, [
      {
        kind: "container",
        image: "debug:1",
        argv: [],
        env: [],
        envFrom: [],
        mounts: [],
        sharedProcesses: true,
      },
    ]);
    // A sidecar init container (restartPolicy Always) runs beside the engine; a plain one ends first.
    const withInit = (c: V1Container): V1Pod => {
      const p = shared(pod({ args: ["--model", "m"] }));
      p.spec!.initContainers = [c];
      return p;
    };
    assert.notEqual(
      hashOf(withInit({ name: "s", image: "debug:1", restartPolicy: "Always" })),
      hashOf(withInit({ name: "s", image: "debug:2", restartPolicy: "Always" })),
    );
    assert.equal(
      hashOf(withInit({ name: "s", image: "busybox:1", command: ["true"] })),
      hashOf(withInit({ name: "s", image: "busybox:2", command: ["true"] })),
    );
    // Without a shared process namespace nothing changes.
    assert.equal(
      hashOf(pod({ args: ["--model", "m"] }, [side("1")])),
      hashOf(pod({ args: ["--model", "m"] }, [side("2")])),
    );
  });

  void test("an init container touching nothing of the cache changes nothing", () => {
    assert.equal(
      hashOf(init({ image: "busybox", command: ["true"] })),
      hashOf(pod({ args: ["--model", "m"] })),
    );
  });
});

void describe("cacheHash: sharing scope", () => {
  const p = pod({ args: ["--model", "m"] });
  const scoped = (scope?: string): string => cacheHash(p, classifyPod(p), { scope }).hash;

  void test("the cluster scope keeps the hash pods always had; other scopes split it", () => {
    assert.equal(scoped("cluster"), hashOf(p));
    assert.equal(scoped(undefined), hashOf(p));
    assert.notEqual(scoped("namespace:a"), hashOf(p));
    assert.notEqual(scoped("namespace:a"), scoped("namespace:b"));
    assert.notEqual(scoped("group:a"), scoped("namespace:a"));
    assert.equal(scoped("group:ml"), scoped("group:ml"));
  });

  void test("scopeKey: namespace, group, and a namespace without a group is its own", () => {
    assert.equal(scopeKey("cluster", "a", { "warmstart.dev/share-group": "g" }), "cluster");
    assert.equal(scopeKey("namespace", "a", { "warmstart.dev/share-group": "g" }), "namespace:a");
    assert.equal(scopeKey("group", "a", { "warmstart.dev/share-group": "g" }), "group:g");
    assert.equal(scopeKey("group", "b", { "warmstart.dev/share-group": "g" }), "group:g");
    assert.equal(scopeKey("group", "c", {}), "namespace:c");
    assert.equal(scopeKey("group", "c", { "warmstart.dev/share-group": "" }), "namespace:c");
  });

  void test("namespaceInScope: a namespace is inside a scope key exactly when scopeKey would give it", () => {
    const g = { "warmstart.dev/share-group": "g" };
    assert.equal(namespaceInScope("cluster", "any", undefined), true);
    assert.equal(namespaceInScope("namespace:a", "a", undefined), true);
    assert.equal(namespaceInScope("namespace:a", "b", g), false, "another namespace");
    assert.equal(namespaceInScope("group:g", "b", g), true);
    assert.equal(namespaceInScope("group:g", "c", {}), false, "no label: its own group");
    assert.equal(namespaceInScope("group:g", "c", { "warmstart.dev/share-group": "h" }), false);
    assert.equal(namespaceInScope("namespace:", "", undefined), false, "no namespace is no scope");
    assert.equal(namespaceInScope("bogus", "a", g), false, "an unknown key admits nobody");
    for (const scope of ["cluster", "namespace", "group"] as const)
      for (const [ns, labels] of [
        ["a", g],
        ["b", {}],
        ["c", { "warmstart.dev/share-group": "h" }],
      ] as const)
        assert.equal(namespaceInScope(scopeKey(scope, ns, labels), ns, labels), true, `${scope} ${ns}`);
  });

  void test("a record's scope is read from its inputs; none means the cluster", () => {
    assert.equal(scopeOfInputs(cacheHash(p, classifyPod(p), { scope: "group:g" }).inputs), "group:g");
    assert.equal(
      scopeOfInputs(sealInputs(cacheHash(p, classifyPod(p), { scope: "group:g" }).inputs)),
      "group:g",
    );
    assert.equal(scopeOfInputs(undefined), "cluster");
    assert.equal(scopeOfInputs({ image: "x" }), "cluster");
  });
});

void describe("cacheHash: groups and GPU products (SPEC 1.3)", () => {
  const base = { args: ["--model", "org/m"] };
  void test("the GPU product a pod selects is in the hash, by node selector or required affinity", () => {
    const plain = pod(base);
    const h100 = pod(base);
    h100.spec!.nodeSelector = { "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3" };
    const a100 = pod(base);
    a100.spec!.nodeSelector = { "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB" };
    const byAffinity = pod(base);
    byAffinity.spec!.affinity = {
      nodeAffinity: {
        requiredDuringSchedulingIgnoredDuringExecution: {
          nodeSelectorTerms: [
            {
              matchExpressions: [
                { key: "nvidia.com/gpu.product", operator: "In", values: ["NVIDIA-H100-80GB-HBM3"] },
              ],
            },
          ],
        },
      },
    };
    assert.notEqual(hashOf(h100), hashOf(a100));
    assert.notEqual(hashOf(h100), hashOf(plain));
    assert.equal(hashOf(byAffinity), hashOf(h100), "the same product, chosen either way");
    assert.equal(inputsOf(plain).gpuProduct, undefined, "a pod that chooses none keeps its hash");
  });

  void test("RoleBasedGroup's RBG_ wiring env is left out, its group size kept", () => {
    const rbg = (instance: string, size: string): V1Pod =>
      pod({
        ...base,
        env: [
          { name: "RBG_GROUP_NAME", value: instance },
          { name: "RBG_ROLE_INSTANCE_NAME", value: `${instance}-prefill-0` },
          { name: "RBG_LWP_GROUP_SIZE", value: size },
        ],
      });
    assert.equal(hashOf(rbg("a", "1")), hashOf(rbg("b", "1")));
    assert.notEqual(hashOf(rbg("a", "1")), hashOf(rbg("a", "2")));
  });

  void test("the rank of a multi-node group is an input of its own", () => {
    const rank = (r: string): V1Pod => pod({ args: ["--model", "org/m", "--nnodes", "2", "--node-rank", r] });
    assert.equal(inputsOf(rank("1")).rank, "1");
    assert.notEqual(hashOf(rank("0")), hashOf(rank("1")));
    assert.equal(inputsOf(pod(base)).rank, undefined);
  });
});
