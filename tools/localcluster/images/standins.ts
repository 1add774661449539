/**
 * The engine stand-in under the real serving images' names: which names each real node's
 * containerd gets (so a rendered upstream chart runs with only its pull policy changed), where
 * each name and tag comes from, and what the stand-in image of each kind looks like (entrypoint,
 * env, user, the files the real image's command lines call).
 *
 * Every image here is the same two layers (the base and the engine layer) under a config of its
 * own, so a name costs a manifest and a config in the archive, nothing more. To add a tag, add a
 * line to REAL_IMAGES. Names are imported fully qualified (`docker.io/vllm/vllm-openai:latest`),
 * as the kubelet asks containerd for them; a tag must be listed (containerd resolves names
 * exactly), and a reference by digest can never match.
 */

/** The engine the stand-in plays under a name (it decides the image's entrypoint and env). */
export type StandInKind =
  "vllm" | "sglang" | "tgi" | "nim" | "kserve-huggingfaceserver" | "kserve-storage-initializer";

export interface RealImage {
  /** As a chart writes it (`vllm/vllm-openai:latest`). */
  name: string;
  kind: StandInKind;
  /** Which chart, example or default uses this tag. */
  source: string;
}

const KSERVE = "kserve/kserve v0.20.0 (charts/kserve-runtime-configs, charts/kserve-resources)";

export const REAL_IMAGES: readonly RealImage[] = [
  // vLLM
  {
    name: "vllm/vllm-openai:latest",
    kind: "vllm",
    source:
      "vllm-project/production-stack helm (modelSpec.repository/tag in its tutorials), KServe vllmserver runtime (tag: latest)",
  },
  {
    name: "vllm/vllm-openai:v0.8.5",
    kind: "vllm",
    source: "kubernetes-sigs/lws docs/examples/vllm/GPU/lws.yaml",
  },
  {
    name: "lmcache/vllm-openai:latest",
    kind: "vllm",
    source: "vllm-project/production-stack helm/values-example.yaml (runs /opt/venv/bin/vllm)",
  },
  // llm-d: vLLM images, started with `vllm serve` (modelCommand vllmServe) or a bash script that execs it.
  {
    name: "ghcr.io/llm-d/llm-d-cuda:latest",
    kind: "vllm",
    source: "llm-d-incubation/llm-d-modelservice examples (v0.4.12)",
  },
  {
    name: "ghcr.io/llm-d/llm-d-cuda:v0.9.0",
    kind: "vllm",
    source: `${KSERVE} LLMInferenceServiceConfig main container`,
  },
  {
    name: "ghcr.io/llm-d/llm-d:v0.2.0",
    kind: "vllm",
    source: "llm-d-incubation/llm-d-modelservice examples (output-cpu.yaml)",
  },
  // SGLang
  {
    name: "lmsysorg/sglang:latest",
    kind: "sglang",
    source: "kubernetes-sigs/lws docs/examples/sglang/lws.yaml, SGLang's Kubernetes examples",
  },
  // TGI
  {
    name: "ghcr.io/huggingface/text-generation-inference:latest",
    kind: "tgi",
    source: "huggingface/text-generation-inference README",
  },
  {
    name: "ghcr.io/huggingface/text-generation-inference:3.3.5",
    kind: "tgi",
    source: "text-generation-inference 3.3.x docs and Kubernetes examples",
  },
  // NIM: the model comes from the image name.
  {
    name: "nvcr.io/nim/meta/llama-3.1-8b-instruct:latest",
    kind: "nim",
    source: "NVIDIA NIM for LLMs docs",
  },
  {
    name: "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.3.3",
    kind: "nim",
    source: "NVIDIA NIM Operator NIMService samples",
  },
  {
    name: "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.1.0",
    kind: "nim",
    source: "NVIDIA/nim-deploy helm/nim-llm README (image.repository llama-3.1-8b-instruct, image.tag 1.1.0)",
  },
  {
    name: "nvcr.io/nim/meta/llama3-8b-instruct:1.0.3",
    kind: "nim",
    source: "NVIDIA/nim-deploy helm/nim-llm (image.repository default, tag = appVersion 1.0.3)",
  },
  // KServe
  {
    name: "kserve/storage-initializer:v0.20.0",
    kind: "kserve-storage-initializer",
    source: `${KSERVE}: kserve.storage.image, tag defaults to kserve.version`,
  },
  {
    name: "kserve/storage-initializer:latest",
    kind: "kserve-storage-initializer",
    source: "kserve/kserve config/ (kustomize) storage initializer",
  },
  {
    name: "kserve/huggingfaceserver:v0.20.0",
    kind: "kserve-huggingfaceserver",
    source: `${KSERVE}: servingruntime.huggingfaceserver, tag defaults to kserve.version`,
  },
  {
    name: "kserve/huggingfaceserver:v0.20.0-gpu",
    kind: "kserve-huggingfaceserver",
    source: `${KSERVE}: GPU variant of the Hugging Face runtime`,
  },
  {
    name: "kserve/huggingfaceserver:latest",
    kind: "kserve-huggingfaceserver",
    source: "kserve/kserve charts/kserve-runtime-configs/files/runtimes/resources.yaml",
  },
  {
    name: "kserve/huggingfaceserver:latest-gpu",
    kind: "kserve-huggingfaceserver",
    source: "kserve/kserve charts/kserve-runtime-configs/files/runtimes/resources.yaml (multinode)",
  },
];

/**
 * An image reference as containerd stores it: `vllm/vllm-openai:latest` is
 * `docker.io/vllm/vllm-openai:latest`, `ubuntu` is `docker.io/library/ubuntu:latest`.
 */
export function qualifiedImageName(ref: string): string {
  const slash = ref.indexOf("/");
  const first = slash < 0 ? "" : ref.slice(0, slash);
  const hasDomain = slash >= 0 && (first.includes(".") || first.includes(":") || first === "localhost");
  let name = hasDomain ? ref : `docker.io/${slash < 0 ? `library/${ref}` : ref}`;
  const lastPart = name.slice(name.lastIndexOf("/") + 1);
  if (!lastPart.includes(":") && !lastPart.includes("@")) name += ":latest";
  return name;
}

/** The model a NIM image serves: `nvcr.io/nim/meta/llama-3.1-8b-instruct:1.3.3` -> `meta/llama-3.1-8b-instruct`. */
export function nimModelOf(image: string): string {
  const repo = image.replace(/[:@][^/]*$/, "");
  return repo.split("/").slice(-2).join("/");
}

/** Where the stand-in's Python lives in the image (and on PYTHONPATH). */
export const ENGINE_SITE_PACKAGES = "/opt/engine/site-packages";
const PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const ENGINE_ENV = [
  PATH_ENV,
  `PYTHONPATH=${ENGINE_SITE_PACKAGES}`,
  "PYTHONDONTWRITEBYTECODE=1",
  "PYTHONUNBUFFERED=1",
];

/**
 * The image config of the stand-in under a real name: the real image's entrypoint, working
 * folder, user and the env its engine reads (TGI's HF_HOME=/data, KServe's HF_HOME and UID 1000,
 * NIM's cache path and model), checked against each project's Dockerfile.
 */
export function standInConfig(image: RealImage): Record<string, unknown> {
  switch (image.kind) {
    case "vllm":
      // vllm/vllm-openai: ENTRYPOINT ["vllm", "serve"], WORKDIR /vllm-workspace, root.
      return { Entrypoint: ["vllm", "serve"], Env: ENGINE_ENV, WorkingDir: "/vllm-workspace" };
    case "sglang":
      // lmsysorg/sglang: no entrypoint, charts give the whole command.
      return { Cmd: ["/bin/bash"], Env: ENGINE_ENV, WorkingDir: "/sgl-workspace" };
    case "tgi":
      // text-generation-inference: ENV HF_HOME=/data PORT=80, ENTRYPOINT launcher, CMD --json-output.
      return {
        Entrypoint: ["text-generation-launcher"],
        Cmd: ["--json-output"],
        Env: [...ENGINE_ENV, "HF_HOME=/data", "PORT=80"],
        WorkingDir: "/usr/src",
      };
    case "nim":
      // NIM for LLMs: ENTRYPOINT nvidia_entrypoint.sh, CMD start_server.sh, cache in /opt/nim/.cache.
      return {
        Entrypoint: ["/opt/nvidia/nvidia_entrypoint.sh"],
        Cmd: ["/opt/nim/start_server.sh"],
        Env: [
          ...ENGINE_ENV,
          "NIM_CACHE_PATH=/opt/nim/.cache",
          `WARMSTART_STANDIN_NIM_MODEL=${nimModelOf(image.name)}`,
        ],
      };
    case "kserve-huggingfaceserver":
      // python/huggingface_server.Dockerfile: HF_HOME=/tmp/huggingface, USER 1000.
      return {
        Entrypoint: ["python3", "-m", "huggingfaceserver"],
        Env: [...ENGINE_ENV, "HF_HOME=/tmp/huggingface"],
        User: "1000",
      };
    case "kserve-storage-initializer":
      // python/storage-initializer.Dockerfile: USER 1000, WORKDIR /work.
      return {
        Entrypoint: ["/storage-initializer/scripts/initializer-entrypoint"],
        Env: ENGINE_ENV,
        User: "1000",
        WorkingDir: "/work",
      };
  }
}

/** The env of the original `engine` images (warmstart.local/engine). */
export const ENGINE_IMAGE_ENV: readonly string[] = ENGINE_ENV;

export interface StandInFile {
  /** Absolute path in the image. */
  path: string;
  content: string;
  mode: number;
}

const run = (entry: string): string => `#!/bin/sh\nexec python3 -m warmstart_engine ${entry} "$@"\n`;
const py = (entry: string): string =>
  `from warmstart_engine import main\n\nif __name__ == "__main__":\n    main("${entry}")\n`;

/**
 * The files that put the stand-in (`warmstart_engine`, engine.py) under the real entry points:
 * console scripts, the Python packages `python3 -m` finds, NIM's and KServe's scripts, LWS's
 * multi-node helper, and the folders the real images' env points at (writable by any UID).
 */
export function standInFiles(): StandInFile[] {
  const file = (path: string, content: string, mode = 0o644): StandInFile => ({ path, content, mode });
  const site = ENGINE_SITE_PACKAGES;
  return [
    file("/usr/local/bin/engine", '#!/bin/sh\nexec python3 /opt/engine/engine.py "$@"\n', 0o755),
    file("/usr/local/bin/vllm", run("vllm"), 0o755),
    file("/opt/venv/bin/vllm", run("vllm"), 0o755),
    file("/usr/local/bin/text-generation-launcher", run("tgi"), 0o755),
    file("/opt/nim/start_server.sh", run("nim"), 0o755),
    file("/opt/nvidia/nvidia_entrypoint.sh", '#!/bin/sh\nexec "$@"\n', 0o755),
    file("/storage-initializer/scripts/initializer-entrypoint", run("kserve-storage-initializer"), 0o755),
    file(
      "/vllm-workspace/examples/online_serving/multi-node-serving.sh",
      [
        "#!/bin/bash",
        "# Stand-in for vLLM's Ray helper (LWS examples): the leader has nothing to wait for, a worker idles.",
        'case "$1" in',
        '  leader) echo "multi-node-serving stand-in: leader, no Ray cluster to start"; exit 0 ;;',
        "  worker) trap 'exit 0' TERM; while true; do sleep 3600 & wait $!; done ;;",
        '  *) echo "usage: $0 leader|worker [ray args]" >&2; exit 1 ;;',
        "esac",
        "",
      ].join("\n"),
      0o755,
    ),
    // Every python3 in the image finds the stand-in, even when a chart sets its own PYTHONPATH.
    file("/usr/lib/python3/dist-packages/warmstart-engine.pth", `${site}\n`),
    file(`${site}/vllm/__init__.py`, `__version__ = "0.11.0"\n`),
    file(`${site}/vllm/entrypoints/__init__.py`, ""),
    file(`${site}/vllm/entrypoints/openai/__init__.py`, ""),
    file(`${site}/vllm/entrypoints/openai/api_server.py`, py("vllm-api-server")),
    file(`${site}/sglang/__init__.py`, ""),
    file(`${site}/sglang/launch_server.py`, py("sglang")),
    file(`${site}/huggingfaceserver/__init__.py`, ""),
    file(`${site}/huggingfaceserver/__main__.py`, py("kserve-huggingfaceserver")),
  ];
}

/** Folders the real images' env or working folder names, writable by any UID as a volume would be. */
export const STANDIN_WRITABLE_DIRS: readonly string[] = ["/data", "/opt/nim/.cache", "/work", "/mnt/models"];
/** Working folders that only need to exist. */
export const STANDIN_DIRS: readonly string[] = ["/vllm-workspace", "/sgl-workspace", "/usr/src"];
