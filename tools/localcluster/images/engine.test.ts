/**
 * The engine stand-in under each real entry point, run with this machine's python3 and the real
 * `huggingface_hub` client against a model hub started in-process: each downloads to where the
 * real engine would, writes its compile caches where the real engine does, and a second start on
 * the same caches downloads 0 bytes and finds its compile caches. Images' entrypoints and env come
 * from standins.ts, with their absolute paths moved into a test folder.
 */
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { isAbsolute, join } from "node:path";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";
import type { TestContext } from "node:test";
import { test } from "node:test";
import { ModelHub } from "../hub/server.js";
import { hostHubClient, writeStandIn } from "./build.js";
import { REAL_IMAGES, standInConfig, type RealImage } from "./standins.js";

const MiB = 2 ** 20;
const hasPython = spawnSync("python3", ["--version"]).status === 0;

interface Report {
  engine: string;
  model: string;
  revision: string | null;
  snapshot: string;
  uid: number;
  client: string;
  fetchedBytes: number;
  fetchSeconds: number;
  downloadDir: string;
  downloads: { what: string; repo: string | null; revision: string | null; dir: string; bytes: number }[];
  compileCache?: "hit" | "rebuilt" | "disabled";
  compileDetail?: string | null;
  compileSeconds?: number;
  compileDirs?: string[];
  besideModel?: { writable: boolean };
  modelStore?: { writable: boolean; dir: string };
  readySeconds: number;
  profile?: string;
  gpus?: number;
}

interface Fixture {
  /** The stand-in's files, as in the image, under this folder. */
  root: string;
  /** A scratch folder standing for the container's writable places (HOME, TMPDIR, /tmp). */
  dir: string;
  hubUrl: string;
  hub: ModelHub;
  pythonPath: string;
}

async function fixture(t: TestContext): Promise<Fixture | undefined> {
  if (!hasPython) {
    t.skip("no python3 on this machine");
    return undefined;
  }
  const dir = mkdtempSync(join(tmpdir(), "ws-engine-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const root = join(dir, "root");
  await writeStandIn(root);
  const hub = new ModelHub({ modelBytes: 2 * MiB, bytesPerSecond: 0 });
  const server = await hub.listen(0);
  t.after(() => new Promise<void>((resolve) => server.close(() => resolve())));
  const addr = server.address();
  const port = typeof addr === "object" && addr ? addr.port : 0;
  const site = await hostHubClient();
  return {
    root,
    dir,
    hub,
    hubUrl: `http://127.0.0.1:${port}`,
    pythonPath: `${join(root, "opt/engine/site-packages")}:${site}`,
  };
}

/** A path as the container sees it, moved into the fixture: /tmp into the scratch folder, the rest into the root. */
function hostPath(fx: Fixture, p: string): string {
  if (p === "/tmp" || p.startsWith("/tmp/")) return join(fx.dir, p);
  return join(fx.root, p);
}

/** The env a container would have: the image's (paths moved) and the pod's, nothing of this machine's. */
function containerEnv(fx: Fixture, imageEnv: string[], env: Record<string, string>): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of imageEnv) {
    const [k, ...v] = e.split("=");
    const value = v.join("=");
    out[k!] = isAbsolute(value) && k !== "PATH" && k !== "PYTHONPATH" ? hostPath(fx, value) : value;
  }
  return {
    ...out,
    PATH: [
      join(fx.root, "usr/local/bin"),
      join(fx.root, "opt/venv/bin"),
      ...(process.env.PATH ?? "").split(":"),
    ].join(":"),
    PYTHONPATH: fx.pythonPath,
    PYTHONDONTWRITEBYTECODE: "1",
    HOME: join(fx.dir, "home"),
    TMPDIR: join(fx.dir, "tmp"),
    HF_ENDPOINT: fx.hubUrl,
    ENGINE_READY_FILE: join(fx.dir, "tmp", "engine-ready"),
    ENGINE_COMPILE_SECONDS: "0",
    ...env,
  };
}

interface Run {
  report: Report;
  /** Whether the ready file (removed before the start) existed when the report line came. */
  readyAfter: boolean;
}

/**
 * Starts `argv` (absolute paths in the image moved into the fixture) and waits for its report:
 * a server is then stopped with SIGTERM, a job (the storage initializer) must exit 0.
 */
async function start(
  fx: Fixture,
  argv: string[],
  env: Record<string, string>,
  imageEnv: string[] = [],
): Promise<Run> {
  const ready = join(fx.dir, "tmp", "engine-ready");
  rmSync(ready, { force: true });
  for (const d of ["home", "tmp"]) spawnSync("mkdir", ["-p", join(fx.dir, d)]);
  const cmd = argv.map((a) => (isAbsolute(a) && existsSync(join(fx.root, a)) ? join(fx.root, a) : a));
  const child = spawn(cmd[0]!, cmd.slice(1), {
    env: containerEnv(fx, imageEnv, env),
    cwd: fx.dir,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stderr = "";
  child.stderr.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-4000)));
  const exited = new Promise<number | null>((resolve) => child.on("close", (code) => resolve(code)));
  const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
  try {
    let report: Report | undefined;
    let readyAfter = false;
    for await (const line of createInterface({ input: child.stdout })) {
      if (line.startsWith("ENGINE-REPORT ")) {
        report = JSON.parse(line.slice("ENGINE-REPORT ".length)) as Report;
        // The report goes out first (so it is in the log once the probe passes), the file right after.
        for (let i = 0; i < 100 && !readyAfter; i++) {
          readyAfter = existsSync(ready);
          if (!readyAfter) await sleep(20);
        }
        // A server runs until stopped; the storage initializer is a job and exits by itself.
        if (report.engine !== "kserve-storage-initializer") child.kill("SIGTERM");
        break;
      }
    }
    const code = await exited;
    if (!report) throw new Error(`${argv.join(" ")}: no report (exit ${code}):\n${stderr}`);
    assert.equal(code, 0, `${argv.join(" ")} exits 0 (stopped by SIGTERM or done):\n${stderr}`);
    return { report, readyAfter };
  } finally {
    clearTimeout(timer);
    child.kill("SIGKILL");
  }
}

function image(name: string): RealImage {
  const found = REAL_IMAGES.find((i) => i.name === name);
  assert.ok(found, `${name} is listed`);
  return found;
}

/** Runs a real image's entrypoint (+ cmd, or the pod's args instead of cmd), with its env. */
function startImage(
  fx: Fixture,
  name: string,
  args: string[] | undefined,
  env: Record<string, string>,
): Promise<Run> {
  const config = standInConfig(image(name)) as { Entrypoint?: string[]; Cmd?: string[]; Env: string[] };
  const argv = [...(config.Entrypoint ?? []), ...(args ?? config.Cmd ?? [])];
  return start(fx, argv, env, config.Env);
}

function under(dir: string, path: string): boolean {
  return path === dir || path.startsWith(`${dir}/`);
}

/**
 * Same command twice: the first downloads and compiles (unless `compiled`: caches an earlier
 * start left), the second fetches nothing and finds its compile caches.
 */
async function twice(fx: Fixture, run: () => Promise<Run>, compiled = false): Promise<[Report, Report]> {
  const first = await run();
  const bytesAfterFirst = fx.hub.snapshot().bytes;
  const second = await run();
  assert.equal(second.report.fetchedBytes, 0, "the second start fetched nothing");
  assert.equal(fx.hub.snapshot().bytes, bytesAfterFirst, "the hub served no byte to the second start");
  if (first.report.compileCache !== undefined) {
    assert.equal(first.report.compileCache, compiled ? "hit" : "rebuilt");
    assert.equal(second.report.compileCache, "hit", "the second start found its compile caches");
    assert.ok(first.readyAfter, "the ready file exists once the report is out");
  }
  return [first.report, second.report];
}

const modelBytes = async (fx: Fixture, repo: string, rev = "main"): Promise<number> =>
  (await fx.hub.repos.get(repo, rev))!.totalBytes;

void test("engine (the original entry): vLLM's command line, the hub cache its env names, compile caches in VLLM_CACHE_ROOT", async (t) => {
  const fx = await fixture(t);
  if (!fx) return;
  const hf = join(fx.dir, "cache/hf");
  const vllm = join(fx.dir, "cache/vllm");
  const env = {
    HF_HOME: hf,
    VLLM_CACHE_ROOT: vllm,
    TORCHINDUCTOR_CACHE_DIR: join(fx.dir, "cache/inductor"),
    TRITON_CACHE_DIR: join(fx.dir, "cache/triton"),
    POD_NAME: "engine-0",
  };
  const [first, second] = await twice(fx, () =>
    start(fx, ["python3", "/opt/engine/engine.py", "--model", "synthetic/a", "--compile-seconds", "0"], env),
  );
  assert.equal(first.engine, "vllm");
  assert.equal(first.client, "engine-0");
  assert.equal(first.fetchedBytes, await modelBytes(fx, "synthetic/a"));
  assert.ok(under(join(hf, "hub/models--synthetic--a/snapshots"), first.snapshot), first.snapshot);
  assert.deepEqual(
    first.compileDirs?.map((d) => d.slice(fx.dir.length + 1).replace(/[0-9a-f]{10,}/g, "H")),
    ["cache/vllm/torch_compile_cache/H/rank_0_0/backbone", "cache/inductor/fxgraph/H", "cache/triton/H"],
  );
  // The fields the integration tests read are all still there.
  for (const k of [
    "model",
    "uid",
    "fetchSeconds",
    "compileSeconds",
    "besideModel",
    "modelStore",
    "readySeconds",
  ])
    assert.ok(k in second, k);
  assert.equal(fx.hub.snapshot().clients["engine-0"]?.bytes, first.fetchedBytes, "counted under its pod");

  // `serve REPO` works as before, and --enforce-eager compiles nothing.
  const eager = await start(
    fx,
    ["python3", "/opt/engine/engine.py", "serve", "synthetic/a", "--enforce-eager", "--compile-seconds", "0"],
    env,
  );
  assert.equal(eager.report.fetchedBytes, 0);
  assert.equal(eager.report.compileCache, "disabled");
});

void test("vllm/vllm-openai (ENTRYPOINT vllm serve) with no cache env: ~/.cache/huggingface/hub, ~/.cache/vllm, <tmp>/torchinductor_<user>", async (t) => {
  const fx = await fixture(t);
  if (!fx) return;
  const home = join(fx.dir, "home");
  const repo = "meta-llama/Llama-3.1-8B-Instruct";
  const [first] = await twice(fx, () =>
    startImage(fx, "vllm/vllm-openai:latest", [repo, "--port", "8000", "--compile-seconds", "0"], {}),
  );
  assert.equal(first.fetchedBytes, await modelBytes(fx, repo));
  assert.ok(
    under(join(home, ".cache/huggingface/hub/models--meta-llama--Llama-3.1-8B-Instruct"), first.snapshot),
  );
  const [backbone, inductor, triton] = first.compileDirs ?? [];
  assert.ok(under(join(home, ".cache/vllm/torch_compile_cache"), backbone!), backbone);
  assert.match(inductor!, new RegExp(`^${join(fx.dir, "tmp")}/torchinductor_[^/]+/fxgraph/`));
  assert.ok(triton!.startsWith(inductor!.replace(/fxgraph\/.*$/, "triton/0/")), triton);

  const version = spawnSync("vllm", ["--version"], { env: containerEnv(fx, [], {}), encoding: "utf8" });
  assert.equal(version.status, 0, version.stderr);
  assert.match(version.stdout.trim(), /^\d+\.\d+\.\d+$/);
});

void test("vllm serve --model M --download-dir D: weights in D, config and tokenizer in the hub cache (XDG_CACHE_HOME)", async (t) => {
  const fx = await fixture(t);
  if (!fx) return;
  const xdg = join(fx.dir, "xdg");
  const dl = join(fx.dir, "models");
  const repo = "synthetic/dl";
  const [first] = await twice(fx, () =>
    start(fx, ["vllm", "serve", "--model", repo, "--download-dir", dl, "--compile-seconds", "0"], {
      XDG_CACHE_HOME: xdg,
    }),
  );
  const [weights, config] = first.downloads;
  assert.equal(weights?.dir, dl);
  assert.equal(first.downloadDir, dl);
  assert.ok(under(join(dl, "models--synthetic--dl"), first.snapshot));
  assert.ok(
    readdirSync(first.snapshot).includes("model.safetensors.index.json"),
    "the index is beside the weights",
  );
  assert.equal(config?.dir, join(xdg, "huggingface/hub"));
  assert.ok(existsSync(join(xdg, "huggingface/hub/models--synthetic--dl")));
  assert.ok(under(join(xdg, "vllm/torch_compile_cache"), first.compileDirs![0]!));
  assert.equal(first.fetchedBytes, await modelBytes(fx, repo));
});

void test("python3 -m vllm.entrypoints.openai.api_server --model M: HF_HUB_CACHE; VLLM_USE_STANDALONE_COMPILE=0 keeps Inductor and Triton in the rank folder", async (t) => {
  const fx = await fixture(t);
  if (!fx) return;
  const hubCache = join(fx.dir, "hubcache");
  const vllm = join(fx.dir, "vllm");
  const argv = ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "synthetic/api"];
  const [first] = await twice(fx, () =>
    start(fx, [...argv, "--tensor_parallel_size", "2", "--compile-seconds", "0"], {
      HF_HUB_CACHE: hubCache,
      VLLM_CACHE_ROOT: vllm,
      VLLM_USE_STANDALONE_COMPILE: "0",
    }),
  );
  assert.ok(under(join(hubCache, "models--synthetic--api"), first.snapshot));
  assert.deepEqual(
    first.compileDirs?.map((d) => d.slice(vllm.length + 1).replace(/[0-9a-f]{10,}/g, "H")),
    [
      "torch_compile_cache/H/rank_0_0/backbone",
      "torch_compile_cache/H/rank_1_0/backbone",
      "torch_compile_cache/H/rank_0_0/inductor_cache/H",
      "torch_compile_cache/H/rank_0_0/triton_cache/H",
    ],
  );
});

void test("python3 -m sglang.launch_server --model-path M: HF_HOME/hub; Triton's cache in ~/.triton/cache", async (t) => {
  const fx = await fixture(t);
  if (!fx) return;
  const hf = join(fx.dir, "hf");
  const [first] = await twice(fx, () =>
    startImage(
      fx,
      "lmsysorg/sglang:latest",
      ["python3", "-m", "sglang.launch_server", "--model-path", "meta/llama-3.1-8b-instruct", "--tp", "1"],
      { HF_HOME: hf },
    ),
  );
  assert.equal(first.engine, "sglang");
  assert.ok(under(join(hf, "hub/models--meta--llama-3.1-8b-instruct"), first.snapshot));
  assert.deepEqual(
    first.compileDirs?.map((d) => d.replace(/[0-9a-f]{16}$/, "H")),
    [join(fx.dir, "home/.triton/cache/H")],
  );
});

void test("text-generation-launcher: MODEL_ID into the image's HF_HOME=/data; --huggingface-hub-cache wins", async (t) => {
  const fx = await fixture(t);
  if (!fx) return;
  const tgi = "ghcr.io/huggingface/text-generation-inference:3.3.5";
  const [first] = await twice(fx, () => startImage(fx, tgi, undefined, { MODEL_ID: "org/tgi" }));
  assert.equal(first.engine, "tgi");
  assert.ok(under(join(fx.root, "data/hub/models--org--tgi"), first.snapshot), first.snapshot);
  assert.equal(first.fetchedBytes, await modelBytes(fx, "org/tgi"));

  const cache = join(fx.dir, "tgi-cache");
  const [other] = await twice(fx, () =>
    startImage(fx, tgi, ["--model-id", "org/tgi2", "--huggingface-hub-cache", cache, "--json-output"], {}),
  );
  assert.ok(under(join(cache, "models--org--tgi2"), other.snapshot), other.snapshot);
});

void test("NIM: the image's model into NIM_CACHE_PATH, its profile (the revision downloaded) set by the GPUs it sees", async (t) => {
  const fx = await fixture(t);
  if (!fx) return;
  const nim = "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.3.3";
  const nimCache = join(fx.root, "opt/nim/.cache");
  const [one] = await twice(fx, () => startImage(fx, nim, undefined, { NVIDIA_VISIBLE_DEVICES: "GPU-aaaa" }));
  assert.equal(one.engine, "nim");
  assert.equal(one.model, "meta/llama-3.1-8b-instruct");
  assert.equal(one.profile, "vllm-bf16-tp1");
  assert.equal(one.revision, "vllm-bf16-tp1");
  assert.ok(under(join(nimCache, "ngc/hub/models--meta--llama-3.1-8b-instruct"), one.snapshot));

  const [two] = await twice(fx, () => startImage(fx, nim, undefined, { NVIDIA_VISIBLE_DEVICES: "0,1" }));
  assert.equal(two.gpus, 2);
  assert.equal(two.profile, "vllm-bf16-tp2");
  assert.notEqual(two.snapshot, one.snapshot, "another profile is another snapshot");
  assert.ok(two.fetchedBytes > 0, "another profile downloads its own weights");
  assert.equal(two.compileDirs?.length, 2, "one compile folder per rank");

  const [hf] = await twice(fx, () =>
    startImage(fx, nim, undefined, { NIM_MODEL_NAME: "hf://meta-llama/Llama-3.1-8B-Instruct" }),
  );
  assert.ok(under(join(nimCache, "huggingface/hub/models--meta-llama--Llama-3.1-8B-Instruct"), hf.snapshot));

  const none = spawnSync(join(fx.root, "opt/nim/start_server.sh"), [], {
    env: containerEnv(fx, [], { NVIDIA_VISIBLE_DEVICES: "void", WARMSTART_STANDIN_NIM_MODEL: "meta/x" }),
    encoding: "utf8",
  });
  assert.equal(none.status, 1, "a NIM with no GPU fails");
  assert.match(none.stderr, /no GPU visible/);
});

void test("KServe: the storage initializer puts hf:// files directly in DEST; vLLM and the Hugging Face runtime load from there and download nothing", async (t) => {
  const fx = await fixture(t);
  if (!fx) return;
  const dest = join(fx.dir, "tmp/mnt/models");
  const init = "kserve/storage-initializer:v0.20.0";
  const [first] = await twice(fx, () => startImage(fx, init, ["hf://meta/llama-3.1-8b-instruct", dest], {}));
  assert.equal(first.engine, "kserve-storage-initializer");
  assert.equal(first.fetchedBytes, await modelBytes(fx, "meta/llama-3.1-8b-instruct"));
  const files = readdirSync(dest);
  for (const f of ["config.json", "model-00001-of-00004.safetensors", "tokenizer.json"])
    assert.ok(files.includes(f), `${f} directly in DEST (${files.join(", ")})`);

  // A pinned revision is another snapshot.
  const pinned = await startImage(
    fx,
    init,
    ["hf://meta/llama-3.1-8b-instruct:v2", join(fx.dir, "tmp/v2")],
    {},
  );
  assert.equal(pinned.report.revision, "v2");
  assert.ok(pinned.report.fetchedBytes > 0);

  const served = fx.hub.snapshot().bytes;
  const [vllm] = await twice(fx, () =>
    startImage(fx, "vllm/vllm-openai:latest", ["--model", dest, "--compile-seconds", "0"], {}),
  );
  assert.equal(vllm.fetchedBytes, 0);
  assert.equal(vllm.snapshot, dest);
  assert.equal(vllm.modelStore?.dir, dest);
  // Same model folder, same vLLM underneath: it finds the compile caches vLLM left.
  const [runtime] = await twice(
    fx,
    () =>
      startImage(fx, "kserve/huggingfaceserver:v0.20.0", ["--model_name=llama", `--model_dir=${dest}`], {}),
    true,
  );
  assert.equal(runtime.engine, "kserve-huggingfaceserver");
  assert.equal(runtime.fetchedBytes, 0);
  assert.equal(fx.hub.snapshot().bytes, served, "nothing was downloaded for the main containers");

  // --model_id downloads like vLLM into the image's HF_HOME (/tmp/huggingface).
  const [byId] = await twice(fx, () =>
    startImage(fx, "kserve/huggingfaceserver:latest-gpu", ["--model_name=m", "--model_id=org/kserve"], {}),
  );
  assert.ok(under(join(fx.dir, "tmp/huggingface/hub/models--org--kserve"), byId.snapshot), byId.snapshot);
});

void test("LWS's multi-node helper: the leader returns at once, so the engine command after it runs", async (t) => {
  const fx = await fixture(t);
  if (!fx) return;
  const script = join(fx.root, "vllm-workspace/examples/online_serving/multi-node-serving.sh");
  const r = spawnSync("bash", [script, "leader", "--ray_cluster_size=2"], { encoding: "utf8" });
  assert.equal(r.status, 0, r.stderr);
});
