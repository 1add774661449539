#!/usr/bin/env python3
"""Model-engine stand-in for the local cluster's real nodes.

One program behind the entry points the real serving images use, each taking that engine's command
line and downloading with the real `huggingface_hub` client (from HF_ENDPOINT) to where that engine
would, then "compiling" where that engine keeps its compile caches:

  engine ARGS                          vLLM's command line (`--model M` or `serve M`), as before
  vllm serve M ... | vllm serve --model M
  python3 -m vllm.entrypoints.openai.api_server --model M
  python3 -m sglang.launch_server --model-path M
  text-generation-launcher [--model-id M]          (else env MODEL_ID)
  /opt/nim/start_server.sh                         (NIM: NIM_MODEL_PATH / NIM_MODEL_NAME / the image's model)
  python3 -m huggingfaceserver --model_id M | --model_dir D     (KServe's Hugging Face runtime)
  /storage-initializer/scripts/initializer-entrypoint SRC DEST  (KServe, SRC = hf://org/name[:rev])

Where each downloads (the rules of the real engine; see "Locations" below):
  vLLM, SGLang, KServe runtime: weights (and their index) into --download-dir if given, else the hub
    cache; config and tokenizer files always into the hub cache (transformers ignores
    --download-dir). The hub cache is the client's own rule: HF_HUB_CACHE, else HF_HOME/hub, else
    XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub. A local folder as the model
    downloads nothing.
  TGI: everything into --huggingface-hub-cache if given, else the hub cache.
  NIM: NIM_CACHE_PATH (default /opt/nim/.cache): ngc/hub for the image's model, at the revision
    named by the profile (NIM_MODEL_PROFILE, else `vllm-bf16-tp<GPUs>`), huggingface/hub for hf://.
  storage initializer: the snapshot's files directly in DEST (`local_dir`), as KServe does.

Compile caches (every one checked file by file: present, same bytes, same mtime to the nanosecond;
any difference costs --compile-seconds and rewrites it):
  vLLM (and KServe's runtime): VLLM_CACHE_ROOT (default XDG_CACHE_HOME/vllm, ~/.cache/vllm)
    torch_compile_cache/<hash>/rank_<r>_0/backbone; with VLLM_USE_STANDALONE_COMPILE (the
    default) Inductor's cache in TORCHINDUCTOR_CACHE_DIR (default <tmp>/torchinductor_<user>) and
    Triton's in TRITON_CACHE_DIR (default <inductor cache>/triton/0); with it "0", both inside the
    rank folder (vLLM redirects them there). `--enforce-eager` compiles nothing.
  NIM: the vLLM rank folders (one per GPU) under VLLM_CACHE_ROOT, else NIM_CACHE_PATH/vllm (a
    stand-in choice: NIM's own layout is not public).
  SGLang, TGI: Triton's cache (TRITON_CACHE_DIR, default ~/.triton/cache); SGLang with
    --enable-torch-compile also Inductor's.

Every compile cache is keyed by the GPU product too (NVIDIA_GPU_PRODUCT, default "stand-in-gpu"),
as real engines' are by the device: the same cache on another product is a miss.

A compile costs --compile-seconds (else ENGINE_COMPILE_SECONDS, else 2). Along the way it prints
the real engine's own phase lines (download, weight load, compile-cache hit or miss, ready) in that
engine's format with its measured seconds. Then it prints one line
`ENGINE-REPORT {json}` and creates /tmp/engine-ready (ENGINE_READY_FILE), the file its readiness
probe reads; it opens no port and runs as any UID. The storage initializer prints the same line
and exits.
"""
import fnmatch
import getpass
import hashlib
import json
import os
import re
import signal
import sys
import tempfile
import time
import uuid

started = time.time()

VLLM_VERSION = "0.11.0"
REPORT_PREFIX = "ENGINE-REPORT "
WEIGHT_PATTERNS = ["*.safetensors", "*.bin", "*.pt"]
# What transformers fetches besides the weights: config, generation config, tokenizer files.
METADATA_PATTERNS = ["*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja", "*.py"]
SAFETENSORS_INDEX = "*.safetensors.index.json"


def ready_file():
    return os.environ.get("ENGINE_READY_FILE") or "/tmp/engine-ready"


class Args:
    """An argv read as argparse reads it: `--name value` or `--name=value`, `_` and `-` alike in
    names (as vLLM's FlexibleArgumentParser and KServe accept), the last occurrence winning."""

    def __init__(self, argv):
        self.argv = []
        for a in argv:
            if a.startswith("--"):
                name, eq, value = a.partition("=")
                a = name.replace("_", "-") + eq + value
            self.argv.append(a)

    def value(self, *names):
        found = None
        for i, a in enumerate(self.argv):
            for name in names:
                if a == name and i + 1 < len(self.argv):
                    found = self.argv[i + 1]
                elif a.startswith(name + "="):
                    found = a.split("=", 1)[1]
        return found

    def flag(self, *names):
        return any(a in names for a in self.argv)

    def positional_after(self, word):
        """The first argument after `word` (a subcommand) when it is not a flag."""
        if word not in self.argv:
            return None
        rest = self.argv[self.argv.index(word) + 1:]
        return rest[0] if rest and not rest[0].startswith("-") else None

    def int_value(self, default, *names):
        v = self.value(*names)
        try:
            return int(v) if v is not None else default
        except ValueError:
            return default


def fail(message, code=2):
    print("engine: " + message, file=sys.stderr, flush=True)
    sys.exit(code)


# ---------------------------------------------------------------------------------------------
# Locations, each as the real program computes it.


def home():
    return os.path.expanduser("~")


def user_name():
    """getpass.getuser() (env LOGNAME, USER, ... then the password database), as torch uses it;
    a UID with no passwd entry falls back to its number instead of failing."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        name = str(os.getuid())
    return re.sub(r'[\\/:*?"<>|]', "_", name)


def hub_cache():
    """The hub client's own rule (HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME/hub, XDG_CACHE_HOME...)."""
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def vllm_cache_root(default_root=None):
    """vllm/envs.py: VLLM_CACHE_ROOT, else XDG_CACHE_HOME/vllm, else ~/.cache/vllm."""
    xdg = os.getenv("XDG_CACHE_HOME", os.path.join(home(), ".cache"))
    return os.path.expanduser(os.getenv("VLLM_CACHE_ROOT", default_root or os.path.join(xdg, "vllm")))


def inductor_cache_dir():
    """torch/_inductor/runtime/cache_dir_utils.py: TORCHINDUCTOR_CACHE_DIR, else <tmp>/torchinductor_<user>."""
    d = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return d if d is not None else os.path.join(tempfile.gettempdir(), "torchinductor_" + user_name())


def triton_cache_dir(under_inductor):
    """TRITON_CACHE_DIR; else, for kernels Inductor compiles, <inductor cache>/triton/0 (torch sets
    it so); else Triton's own default, (TRITON_HOME or ~)/.triton/cache."""
    d = os.environ.get("TRITON_CACHE_DIR")
    if d is not None:
        return d
    if under_inductor:
        return os.path.join(inductor_cache_dir(), "triton", "0")
    return os.path.join(os.getenv("TRITON_HOME") or home(), ".triton", "cache")


def visible_gpus():
    """The GPUs a NIM sees: NVIDIA_VISIBLE_DEVICES as the device plugin sets it (a list of indices
    or UUIDs, `all`, or `none`/`void`), else CUDA_VISIBLE_DEVICES, else the /dev/nvidiaN device
    nodes, else 1 (the local cluster's real nodes advertise GPUs without a device plugin)."""
    for name in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
        v = os.environ.get(name)
        if v is None or v.strip() == "":
            continue
        v = v.strip()
        if v in ("none", "void", "-1"):
            return 0
        if v != "all":
            return len([x for x in v.split(",") if x.strip()])
    try:
        nodes = [n for n in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", n)]
    except OSError:
        nodes = []
    return len(nodes) or 1


# ---------------------------------------------------------------------------------------------
# Downloads.


_client = []


def client_id():
    """How the hub counts this process: its pod's name, else one random id for the process."""
    if not _client:
        _client.append(os.environ.get("POD_NAME") or uuid.uuid4().hex[:12])
    return _client[0]


def repo_folder(cache_dir, repo):
    return os.path.join(cache_dir, "models--" + repo.replace("/", "--"))


def blob_sizes(cache_dir, repo):
    blobs = os.path.join(repo_folder(cache_dir, repo), "blobs")
    sizes = {}
    if os.path.isdir(blobs):
        for name in os.listdir(blobs):
            try:
                sizes[name] = os.stat(os.path.join(blobs, name)).st_size
            except OSError:
                pass
    return sizes


def tree_state(folder):
    """Size and mtime of every file under `folder` but the client's own `.cache` metadata."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        if dirpath == folder and ".cache" in dirnames:
            dirnames.remove(".cache")
        for name in filenames:
            p = os.path.join(dirpath, name)
            try:
                st = os.stat(p)
            except OSError:
                continue
            state[os.path.relpath(p, folder)] = (st.st_size, st.st_mtime_ns)
    return state


def download(repo, revision, what, cache_dir=None, local_dir=None, allow=None, ignore=None):
    """One snapshot_download, and the bytes it wrote: new or changed blobs in the cache, or new or
    changed files in `local_dir`."""
    from huggingface_hub import snapshot_download

    target = local_dir or cache_dir or hub_cache()
    before = tree_state(local_dir) if local_dir else blob_sizes(target, repo)
    kwargs = {"revision": revision, "user_agent": {"client": client_id()}}
    if local_dir:
        kwargs["local_dir"] = local_dir
    elif cache_dir:
        kwargs["cache_dir"] = cache_dir
    if allow:
        kwargs["allow_patterns"] = allow
    if ignore:
        kwargs["ignore_patterns"] = ignore
    t0 = time.time()
    path = snapshot_download(repo, **kwargs)
    seconds = time.time() - t0
    if local_dir:
        after = tree_state(local_dir)
        fetched = sum(v[0] for k, v in after.items() if before.get(k) != v)
    else:
        after = blob_sizes(target, repo)
        fetched = sum(size for name, size in after.items() if before.get(name) != size)
    return {
        "what": what,
        "repo": repo,
        "revision": revision,
        "dir": target,
        "snapshot": path,
        "bytes": fetched,
        "seconds": round(seconds, 3),
    }


def repo_files(repo, revision):
    from huggingface_hub import HfApi

    return HfApi(user_agent={"client": client_id()}).list_repo_files(repo, revision=revision)


def fetch_like_vllm(model, revision, download_dir, weights=True):
    """vLLM's (and SGLang's) loader: the first weight format the repository has (and its index)
    into `download_dir` (None: the hub cache); the config and tokenizer through transformers,
    which always uses the hub cache."""
    downloads = []
    if weights:
        files = repo_files(model, revision)
        pattern = next((p for p in WEIGHT_PATTERNS if fnmatch.filter(files, p)), WEIGHT_PATTERNS[0])
        downloads.append(
            download(
                model,
                revision,
                "weights",
                cache_dir=download_dir,
                allow=[pattern, SAFETENSORS_INDEX],
                ignore=["original/**/*"],
            )
        )
    downloads.append(download(model, revision, "config", allow=METADATA_PATTERNS, ignore=[SAFETENSORS_INDEX]))
    return downloads


def local_model(path):
    if not os.path.isdir(path):
        fail("model folder %s does not exist" % path)
    if not os.path.isfile(os.path.join(path, "config.json")):
        fail("no config.json in %s" % path)
    return {"what": "local", "repo": None, "revision": None, "dir": path, "snapshot": path, "bytes": 0, "seconds": 0}


def is_local(model):
    return model.startswith("/") or model.startswith("./") or os.path.isdir(model)


# ---------------------------------------------------------------------------------------------
# Compile caches.


def check_cache(folder, files):
    """"hit" when every file of the folder's index is there with its bytes and mtime, else why not."""
    try:
        with open(os.path.join(folder, "index.json")) as f:
            index = json.load(f)
        bad = []
        for name, want in index["files"].items():
            p = os.path.join(folder, name)
            st = os.stat(p)
            with open(p, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            if digest != want["sha256"] or st.st_mtime_ns != want["mtime_ns"]:
                bad.append(name)
        if not bad and len(index["files"]) == files:
            return "hit"
        return "stale (%d of %d files changed or lost their times)" % (len(bad), len(index["files"]))
    except (OSError, ValueError, KeyError):
        return "miss"


def write_cache(folder, key, files):
    os.makedirs(folder, exist_ok=True)
    index = {"files": {}}
    for i in range(files):
        name = "graph-%04d.bin" % i
        data = hashlib.sha256(("%s/%s/%d" % (key, os.path.basename(folder), i)).encode()).digest() * 128
        p = os.path.join(folder, name)
        with open(p, "wb") as f:
            f.write(data)
        index["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "mtime_ns": os.stat(p).st_mtime_ns}
    tmp = os.path.join(folder, "index.json.tmp")
    with open(tmp, "w") as f:
        json.dump(index, f)
    os.replace(tmp, os.path.join(folder, "index.json"))


def compile_caches(parts, key, seconds):
    """Checks every part ((folder, files)); when any is not a hit, "compiles" (sleeps) once and
    rewrites those that were not."""
    if parts is None:
        return {"state": "disabled", "dirs": []}
    states = [(folder, files, check_cache(folder, files)) for folder, files in parts]
    dirs = [folder for folder, _, _ in states]
    misses = [(folder, files, state) for folder, files, state in states if state != "hit"]
    if not misses:
        return {"state": "hit", "dirs": dirs}
    time.sleep(seconds)  # the compile we stand in for
    for folder, files, _ in misses:
        write_cache(folder, key, files)
    return {"state": "rebuilt", "was": misses[0][2], "dirs": dirs}


def vllm_parts(args, key, root=None):
    """vLLM's compile caches for this command line (None: it compiles nothing)."""
    if args.flag("--enforce-eager") and args.value("-O", "--compilation-config") is None:
        return None
    files = args.int_value(200, "--compile-files")
    side = max(1, files // 4)
    world = max(1, args.int_value(1, "--tensor-parallel-size", "-tp")) * max(
        1, args.int_value(1, "--pipeline-parallel-size", "-pp")
    )
    base = os.path.join(vllm_cache_root(root), "torch_compile_cache", key[:10])
    parts = [(os.path.join(base, "rank_%d_0" % r, "backbone"), files) for r in range(min(world, 16))]
    if os.environ.get("VLLM_USE_STANDALONE_COMPILE", "1") == "1":
        parts.append((os.path.join(inductor_cache_dir(), "fxgraph", key[:16]), side))
        parts.append((os.path.join(triton_cache_dir(under_inductor=True), key[:16]), side))
    else:
        rank0 = os.path.join(base, "rank_0_0")
        parts.append((os.path.join(rank0, "inductor_cache", key[:16]), side))
        parts.append((os.path.join(rank0, "triton_cache", key[:16]), side))
    return parts


def gpu_product():
    """The GPU the caches are compiled for (the node's nvidia.com/gpu.product): real engines' compile
    caches depend on the device, so the same model on another product compiles again."""
    return os.environ.get("NVIDIA_GPU_PRODUCT") or "stand-in-gpu"


def compile_key(model, snapshot):
    if is_local(model):
        try:
            with open(os.path.join(snapshot, "config.json"), "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
            return hashlib.sha256(("%s@%s@%s" % (model, digest, gpu_product())).encode()).hexdigest()
        except OSError:
            pass
    return hashlib.sha256(("%s@%s@%s" % (model, os.path.basename(snapshot), gpu_product())).encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Engines: each turns its command line into a plan (what to download where, which caches).


def plan_vllm(engine, args, model):
    if model is None:
        fail("no model (%s)" % ("--model M or serve M" if engine == "vllm" else "--model M"))
    revision = None if is_local(model) else args.value("--revision") or "main"
    download_dir = args.value("--download-dir")

    def fetch():
        if is_local(model):
            return [local_model(model)]
        return fetch_like_vllm(model, revision, download_dir, weights=args.value("--load-format") != "dummy")

    return {
        "engine": engine,
        "model": model,
        "revision": revision,
        "fetch": fetch,
        "parts": lambda key: vllm_parts(args, key),
    }


def plan_sglang(args):
    model = args.value("--model-path", "--model")
    if model is None:
        fail("no model (--model-path M)")
    revision = None if is_local(model) else args.value("--revision") or "main"
    download_dir = args.value("--download-dir")
    files = args.int_value(200, "--compile-files")

    def parts(key):
        torch_compile = args.flag("--enable-torch-compile")
        p = [(os.path.join(triton_cache_dir(under_inductor=False), key[:16]), max(1, files // 4))]
        if torch_compile:
            p.append((os.path.join(inductor_cache_dir(), "fxgraph", key[:16]), files))
        return p

    def fetch():
        if is_local(model):
            return [local_model(model)]
        return fetch_like_vllm(model, revision, download_dir, weights=args.value("--load-format") != "dummy")

    return {"engine": "sglang", "model": model, "revision": revision, "fetch": fetch, "parts": parts}


def plan_tgi(args):
    model = args.value("--model-id") or os.environ.get("MODEL_ID") or "bigscience/bloom-560m"
    revision = None if is_local(model) else args.value("--revision") or os.environ.get("REVISION") or "main"
    cache_dir = args.value("--huggingface-hub-cache")
    files = args.int_value(200, "--compile-files")

    def fetch():
        if is_local(model):
            return [local_model(model)]
        files_ = repo_files(model, revision)
        pattern = "*.safetensors" if fnmatch.filter(files_, "*.safetensors") else "*.bin"
        return [download(model, revision, "weights", cache_dir=cache_dir, allow=[pattern] + METADATA_PATTERNS)]

    def parts(key):
        return [(os.path.join(triton_cache_dir(under_inductor=False), key[:16]), max(1, files // 4))]

    return {"engine": "tgi", "model": model, "revision": revision, "fetch": fetch, "parts": parts}


def nim_source(args):
    """The model a NIM serves: a positional argument, NIM_MODEL_PATH, NIM_MODEL_NAME, or the one
    its image was built for (set in the image's config)."""
    positional = args.argv[0] if args.argv and not args.argv[0].startswith("-") else None
    for source in (
        positional,
        os.environ.get("NIM_MODEL_PATH"),
        os.environ.get("NIM_MODEL_NAME"),
        os.environ.get("WARMSTART_STANDIN_NIM_MODEL"),
    ):
        if source:
            return source
    fail("no model (NIM_MODEL_NAME, NIM_MODEL_PATH, or an image that names one)")


def plan_nim(args):
    source = nim_source(args)
    cache = os.environ.get("NIM_CACHE_PATH") or "/opt/nim/.cache"
    gpus = visible_gpus()
    if gpus == 0:
        fail("no GPU visible (NVIDIA_VISIBLE_DEVICES)", 1)
    profile = os.environ.get("NIM_MODEL_PROFILE") or "vllm-bf16-tp%d" % gpus
    if source.startswith("hf://"):
        repo, _, rev = source[len("hf://"):].partition(":")
        model, revision, cache_dir = repo, rev or "main", os.path.join(cache, "huggingface", "hub")
    elif source.startswith("ngc://"):
        # ngc://org/team/model:version: the team/model repository, one revision per profile.
        path = source[len("ngc://"):].split(":", 1)[0].split("/")
        model, revision, cache_dir = "/".join(path[-2:]), profile, os.path.join(cache, "ngc", "hub")
    elif is_local(source):
        model, revision, cache_dir = source, None, None
    else:
        model, revision, cache_dir = source, profile, os.path.join(cache, "ngc", "hub")
    files = args.int_value(200, "--compile-files")

    def fetch():
        if cache_dir is None:
            return [local_model(model)]
        return [download(model, revision, "profile " + profile, cache_dir=cache_dir)]

    def parts(key):
        base = os.path.join(vllm_cache_root(os.path.join(cache, "vllm")), "torch_compile_cache", key[:10])
        return [(os.path.join(base, "rank_%d_0" % r, "backbone"), files) for r in range(min(gpus, 16))]

    return {
        "engine": "nim",
        "model": model,
        "revision": revision,
        "fetch": fetch,
        "parts": parts,
        "extra": {"profile": profile, "gpus": gpus, "nimCache": cache},
    }


def plan_kserve_runtime(args):
    model_id = args.value("--model-id")
    model = model_id or args.value("--model-dir") or "/mnt/models"
    revision = None if is_local(model) else args.value("--model-revision") or "main"

    def fetch():
        if model_id and not is_local(model_id):
            return fetch_like_vllm(model_id, revision, args.value("--download-dir"))
        return [local_model(model)]

    return {
        "engine": "kserve-huggingfaceserver",
        "model": model,
        "revision": revision,
        "fetch": fetch,
        "parts": lambda key: vllm_parts(args, key),
    }


# ---------------------------------------------------------------------------------------------
# The real engines' own phase lines, in their formats, with the stand-in's measured seconds (what
# src/core/engine-log.ts reads; the sources of each format are listed there). `m` holds the times
# so far: start, fetched (+ fetch seconds), loaded (+ load seconds), compiled (+ state, seconds).


def vllm_log(t, where, message, process="EngineCore_DP0"):
    """vLLM's logger: `(process pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message`, local time.
    The file:line tags are those of a recent release's logs; they move between releases."""
    stamp = time.strftime("%m-%d %H:%M:%S", time.localtime(t))
    return "(%s pid=%d) INFO %s [%s] %s" % (process, os.getpid(), stamp, where, message)


def sglang_log(t, message):
    return "[%s] %s" % (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)), message)


def rust_duration(seconds):
    """A Rust Duration's `{:?}` ("10.308899699s", "850.1ms"); ns below a millisecond (Rust: micro)."""
    for unit, scale, places in (("s", 1, 9), ("ms", 1e3, 6)):
        if seconds * scale >= 1:
            return ("%.*f" % (places, seconds * scale)).rstrip("0").rstrip(".") + unit
    return "%dns" % round(seconds * 1e9)


def tgi_log(m, t, target, message, span=None):
    """TGI's tracing lines: compact text, or JSON with --json-output (the router's flattened)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%06dZ" % int(t % 1 * 1e6)
    if m.get("json"):
        line = {"timestamp": stamp, "level": "INFO"}
        if target.startswith("text_generation_launcher"):
            line.update(fields={"message": message}, target=target)
            if span:
                line.update(span=span, spans=[span])
        else:
            line.update(message=message, target=target.split(": ")[0])
        return json.dumps(line, separators=(",", ":"))
    where = "%s: " % span["name"] if span else ""
    rank = " rank=%d" % span["rank"] if span and "rank" in span else ""
    return "%s  INFO %s%s: %s%s" % (stamp, where, target, message, rank)


def engine_lines(engine, event, m):
    """The lines `engine` prints at `event` ("start", "fetched", "loaded", "compiled")."""
    if engine in ("vllm", "nim", "kserve-huggingfaceserver"):
        if event == "start":
            return [vllm_log(m["start"], "api_server.py:1885", "vLLM API server version %s" % VLLM_VERSION, "APIServer")]
        if event == "fetched" and m["fetch_seconds"] > 0.5:  # vLLM says nothing under half a second
            line = "Time spent downloading weights for %s: %.6f seconds" % (m["model"], m["fetch_seconds"])
            return [vllm_log(m["fetched"], "weight_utils.py:581", line)]
        if event == "loaded":
            return [
                vllm_log(m["loaded"], "default_loader.py:384", "Loading weights took %.2f seconds" % m["load_seconds"]),
                vllm_log(
                    m["loaded"],
                    "gpu_model_runner.py:5132",
                    "Model loading took 0.0 GiB memory and %.6f seconds" % (m["fetch_seconds"] + m["load_seconds"]),
                ),
            ]
        if event == "compiled":
            lines, compiled = [], m["compile_state"] != "disabled"
            if m["compile_state"] == "hit":
                line = "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took %.3f s"
                lines.append(vllm_log(m["compiled"], "backends.py:292", line % m["compile_seconds"]))
            elif compiled:
                line = "Compiling a graph for compile range (1, 8192) takes %.2f s"
                lines.append(vllm_log(m["compiled"], "backends.py:318", line % m["compile_seconds"]))
            if compiled:
                line = "torch.compile took %.2f s in total" % m["compile_seconds"]
                lines.append(vllm_log(m["compiled"], "monitor.py:53", line))
            line = "init engine (profile, create kv cache, warmup model) took %.2f s" % m["compile_seconds"]
            if compiled:
                line += " (compilation: %.2f s)" % m["compile_seconds"]
            lines.append(vllm_log(m["compiled"], "core.py:259", line))
            return lines + ["INFO:     Application startup complete."]  # Uvicorn's, no time
    if engine == "sglang":
        if event == "start":
            return [
                sglang_log(m["start"], "server_args=ServerArgs(model_path=%r)" % m["model"]),
                sglang_log(m["start"], "Load weight begin. avail mem=0.00 GB"),
            ]
        if event == "loaded":
            line = "Load weight end. elapsed=%.2f s, type=StandIn, avail mem=0.00 GB, mem usage=0.00 GB."
            return [sglang_log(m["loaded"], line % (m["fetch_seconds"] + m["load_seconds"]))]
        if event == "compiled":
            # SGLang compiles its kernels (Triton, Inductor) while it captures its CUDA graphs.
            line = "Capture cuda graph end. Time elapsed: %.2f s. mem usage=0.00 GB. avail mem=0.00 GB."
            return [
                sglang_log(m["compiled"], line % m["compile_seconds"]),
                sglang_log(m["compiled"], "The server is fired up and ready to roll!"),
            ]
    if engine == "tgi":
        launcher, shard = "text_generation_launcher", {"rank": 0, "name": "shard-manager"}
        if event == "start":
            download = "Starting check and download process for %s" % m["model"]
            return [tgi_log(m, m["start"], launcher, download, {"name": "download"})]
        if event == "fetched":
            done = "Successfully downloaded weights for %s" % m["model"]
            return [
                tgi_log(m, m["fetched"], launcher, done, {"name": "download"}),
                tgi_log(m, m["fetched"], launcher, "Starting shard", shard),
            ]
        if event == "loaded":
            router = "text_generation_router_v3: backends/v3/src/lib.rs:125"
            return [
                tgi_log(m, m["loaded"], launcher, "Shard ready in %s" % rust_duration(m["load_seconds"]), shard),
                tgi_log(m, m["loaded"], launcher, "Starting Webserver"),
                tgi_log(m, m["loaded"], router, "Warming up model"),
            ]
        if event == "compiled":
            return [tgi_log(m, m["compiled"], "text_generation_router::server: router/src/server.rs:2302", "Connected")]
    return []


def say(plan, event, m):
    for line in engine_lines(plan["engine"], event, m):
        print(line, flush=True)


# ---------------------------------------------------------------------------------------------
# Running.


def probe_write(directory):
    """Whether a new file can be created in `directory` (and the errno name when not)."""
    path = os.path.join(directory, ".engine-probe-%s" % uuid.uuid4().hex[:8])
    try:
        with open(path, "w") as f:
            f.write("probe")
        os.unlink(path)
        return {"writable": True}
    except OSError as e:
        return {"writable": False, "error": os.strerror(e.errno), "errno": e.errno}


def stop(*_):
    """SIGTERM: a server has nothing to clean up. os._exit, not sys.exit: an exit that waits for
    the hub client's threads can outlast the kubelet's grace period."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


def serve(plan, args):
    signal.signal(signal.SIGTERM, stop)
    client = client_id()
    m = {"model": plan["model"], "json": args.flag("--json-output"), "start": time.time()}
    say(plan, "start", m)
    downloads = plan["fetch"]()
    main_download = downloads[0]
    path = main_download["snapshot"]
    m.update(fetched=time.time(), fetch_seconds=sum(d["seconds"] for d in downloads))
    say(plan, "fetched", m)

    # Every weight file must be readable where the cache (or the folder) says it is.
    weights = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    for name in weights:
        with open(os.path.join(path, name), "rb") as f:
            f.read(4096)
    model_dir = os.path.dirname(os.path.realpath(os.path.join(path, weights[0]))) if weights else path
    now = time.time()
    m.update(loaded=now, load_seconds=now - m["fetched"])
    say(plan, "loaded", m)

    key = compile_key(plan["model"], path)
    t1 = time.time()
    seconds = float(args.value("--compile-seconds") or os.environ.get("ENGINE_COMPILE_SECONDS") or "2")
    compiled = compile_caches(plan["parts"](key), key, seconds)
    compile_seconds = time.time() - t1
    m.update(compiled=time.time(), compile_state=compiled["state"], compile_seconds=compile_seconds)
    say(plan, "compiled", m)

    report = {
        "engine": plan["engine"],
        "model": plan["model"],
        "revision": plan["revision"],
        "snapshot": path,
        "uid": os.getuid(),
        "client": client,
        "fetchedBytes": sum(d["bytes"] for d in downloads),
        "fetchSeconds": round(sum(d["seconds"] for d in downloads), 3),
        "downloadDir": main_download["dir"],
        "downloads": [{k: d[k] for k in ("what", "repo", "revision", "dir", "bytes")} for d in downloads],
        "compileCache": compiled["state"],
        "compileDetail": compiled.get("was"),
        "compileSeconds": round(compile_seconds, 3),
        "compileDirs": compiled["dirs"],
        # Beside the model (the snapshot folder, where the hub client also writes) vs the
        # folder the weights really live in (the read-only volume on a restore).
        "besideModel": probe_write(path),
        "modelStore": dict(probe_write(model_dir), dir=model_dir),
        "readySeconds": round(time.time() - started, 3),
    }
    report.update(plan.get("extra", {}))
    print(REPORT_PREFIX + json.dumps(report), flush=True)
    ready = ready_file()
    with open(ready + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(ready + ".tmp", ready)
    # Short sleeps: a signal the kernel hands to another of our threads only runs its handler
    # once this (main) thread wakes.
    while True:
        time.sleep(1)


def storage_initializer(argv):
    """KServe's initializer-entrypoint: pairs of SRC_URI DEST_PATH; hf://org/name[:revision]
    downloads the snapshot's files directly into DEST_PATH."""
    if len(argv) < 2 or len(argv) % 2 != 0:
        fail("usage: initializer-entrypoint src_uri_0 dest_path_0 ... src_uri_n dest_path_n", 1)

    def patterns(name):
        v = os.environ.get(name)
        return json.loads(v) if v else None

    downloads = []
    for src, dest in zip(argv[0::2], argv[1::2]):
        if not src.startswith("hf://"):
            fail("the stand-in initializer reads hf:// only, not %s" % src, 1)
        parts = src[len("hf://"):].split("/")
        if len(parts) != 2 or not all(parts):
            fail("Invalid Hugging Face URI format. Expected 'hf://owner/model[:revision]', got '%s'" % src, 1)
        name, _, revision = parts[1].partition(":")
        os.makedirs(dest, exist_ok=True)
        downloads.append(
            download(
                parts[0] + "/" + name,
                revision or None,
                "snapshot",
                local_dir=dest,
                allow=patterns("STORAGE_ALLOW_PATTERNS"),
                ignore=patterns("STORAGE_IGNORE_PATTERNS"),
            )
        )
    report = {
        "engine": "kserve-storage-initializer",
        "model": downloads[0]["repo"],
        "revision": downloads[0]["revision"],
        "snapshot": downloads[0]["snapshot"],
        "uid": os.getuid(),
        "client": client_id(),
        "fetchedBytes": sum(d["bytes"] for d in downloads),
        "fetchSeconds": round(sum(d["seconds"] for d in downloads), 3),
        "downloadDir": downloads[0]["dir"],
        "downloads": [{k: d[k] for k in ("what", "repo", "revision", "dir", "bytes")} for d in downloads],
        "readySeconds": round(time.time() - started, 3),
    }
    print(REPORT_PREFIX + json.dumps(report), flush=True)


def main(entry="engine", argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    args = Args(argv)
    if entry == "engine":
        # The original stand-in's command line: vLLM's, `--model M` or `serve M`.
        plan = plan_vllm("vllm", args, args.value("--model") or args.positional_after("serve"))
    elif entry == "vllm":
        if args.flag("--version", "-v"):
            print(VLLM_VERSION)
            return
        if not argv or argv[0] != "serve":
            fail("the stand-in's vllm runs `vllm serve` only (got %r)" % " ".join(argv))
        plan = plan_vllm("vllm", args, args.positional_after("serve") or args.value("--model"))
    elif entry == "vllm-api-server":
        plan = plan_vllm("vllm", args, args.value("--model"))
    elif entry == "sglang":
        plan = plan_sglang(args)
    elif entry == "tgi":
        plan = plan_tgi(args)
    elif entry == "nim":
        plan = plan_nim(args)
    elif entry == "kserve-huggingfaceserver":
        plan = plan_kserve_runtime(args)
    elif entry == "kserve-storage-initializer":
        return storage_initializer(argv)
    else:
        fail("unknown entry point %s" % entry)
    serve(plan, args)


ENTRIES = ("engine", "vllm", "vllm-api-server", "sglang", "tgi", "nim", "kserve-huggingfaceserver", "kserve-storage-initializer")

if __name__ == "__main__":
    # `python3 engine.py ARGS` is the original entry; `python3 -m warmstart_engine ENTRY ARGS` the others.
    if len(sys.argv) > 1 and sys.argv[1] in ENTRIES:
        main(sys.argv[1], sys.argv[2:])
    else:
        main("engine")
