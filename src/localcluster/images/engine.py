#!/usr/bin/env python3
"""Model-engine stand-in for the local cluster's real nodes.

It takes vLLM's command line (`--model REPO [--revision REV]`, `serve REPO`; other flags are
ignored), fetches the model with the real `huggingface_hub` client from HF_ENDPOINT into the
cache locations its environment names (HF_HOME, ...), then "compiles": it checks the compile
cache it finds under VLLM_CACHE_ROOT (every file present, same bytes, same mtime to the
nanosecond, as ninja-style caches do) and rebuilds it when anything differs, which costs
--compile-seconds. Only then does it create /tmp/engine-ready, the file its readiness probe reads.
It prints one line `ENGINE-REPORT {json}` with what it fetched and found, opens no port, and runs
as any UID.
"""
import hashlib
import json
import os
import signal
import sys
import time
import uuid

started = time.time()


def arg_value(argv, name):
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def parse(argv):
    model = arg_value(argv, "--model")
    if model is None and "serve" in argv:
        rest = argv[argv.index("serve") + 1:]
        if rest and not rest[0].startswith("-"):
            model = rest[0]
    if model is None:
        sys.exit("engine: no model (--model REPO or serve REPO)")
    return {
        "model": model,
        "revision": arg_value(argv, "--revision") or "main",
        "compile_seconds": float(arg_value(argv, "--compile-seconds") or "2"),
        "compile_files": int(arg_value(argv, "--compile-files") or "200"),
    }


def blob_sizes(hub_cache, repo):
    blobs = os.path.join(hub_cache, "models--" + repo.replace("/", "--"), "blobs")
    sizes = {}
    if os.path.isdir(blobs):
        for name in os.listdir(blobs):
            try:
                sizes[name] = os.stat(os.path.join(blobs, name)).st_size
            except OSError:
                pass
    return sizes


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


def compile_cache(root, key, files, seconds):
    """Checks the compile cache for `key`; rebuilds it (slowly) when any file differs."""
    folder = os.path.join(root, "torch_compile_cache", key[:16])
    index_path = os.path.join(folder, "index.json")
    try:
        with open(index_path) as f:
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
            return {"state": "hit", "files": files, "dir": folder}
        state = "stale (%d of %d files changed or lost their times)" % (len(bad), len(index["files"]))
    except (OSError, ValueError, KeyError):
        state = "miss"
    time.sleep(seconds)  # the compile we stand in for
    os.makedirs(folder, exist_ok=True)
    index = {"files": {}}
    for i in range(files):
        name = "graph-%04d.bin" % i
        data = hashlib.sha256(("%s/%d" % (key, i)).encode()).digest() * 128
        p = os.path.join(folder, name)
        with open(p, "wb") as f:
            f.write(data)
        index["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "mtime_ns": os.stat(p).st_mtime_ns}
    tmp = index_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(index, f)
    os.replace(tmp, index_path)
    return {"state": "rebuilt", "was": state, "files": files, "dir": folder}


def main():
    opts = parse(sys.argv[1:])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    from huggingface_hub import constants, snapshot_download

    hub_cache = constants.HF_HUB_CACHE
    before = blob_sizes(hub_cache, opts["model"])
    client = os.environ.get("POD_NAME") or uuid.uuid4().hex[:12]
    t0 = time.time()
    path = snapshot_download(opts["model"], revision=opts["revision"], user_agent={"client": client})
    fetch_seconds = time.time() - t0
    after = blob_sizes(hub_cache, opts["model"])
    fetched = sum(size for name, size in after.items() if before.get(name) != size)

    # Every weight file must be readable where the cache says it is.
    weights = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
    for name in weights:
        with open(os.path.join(path, name), "rb") as f:
            f.read(4096)
    model_dir = os.path.dirname(os.path.realpath(os.path.join(path, weights[0]))) if weights else path

    vllm_root = os.environ.get("VLLM_CACHE_ROOT") or os.path.join(os.path.expanduser("~"), ".cache", "vllm")
    key = hashlib.sha256(("%s@%s" % (opts["model"], os.path.basename(path))).encode()).hexdigest()
    t1 = time.time()
    compiled = compile_cache(vllm_root, key, opts["compile_files"], opts["compile_seconds"])
    compile_seconds = time.time() - t1

    report = {
        "model": opts["model"],
        "snapshot": path,
        "uid": os.getuid(),
        "client": client,
        "fetchedBytes": fetched,
        "fetchSeconds": round(fetch_seconds, 3),
        "compileCache": compiled["state"],
        "compileDetail": compiled.get("was"),
        "compileSeconds": round(compile_seconds, 3),
        # Beside the model (the snapshot folder, where the hub client also writes) vs the
        # folder the weights really live in (the read-only volume on a restore).
        "besideModel": probe_write(path),
        "modelStore": dict(probe_write(model_dir), dir=model_dir),
        "readySeconds": round(time.time() - started, 3),
    }
    print("ENGINE-REPORT " + json.dumps(report), flush=True)
    with open("/tmp/engine-ready.tmp", "w") as f:
        json.dump(report, f)
    os.replace("/tmp/engine-ready.tmp", "/tmp/engine-ready")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
