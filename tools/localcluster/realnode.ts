/**
 * Real nodes: a kubelet with its own containerd (runc, CNI loopback) per node, each with its
 * folders under the cluster's state, advertising `nvidia.com/gpu` as an extended resource. Pods
 * run on the host network (there is no pod network), reach loopback servers, and use images
 * imported into the node's containerd, never pulled. The taint keeps pods written for simulated
 * nodes away; pods meant for a real node tolerate it and select it by hostname.
 */
import { execFile } from "node:child_process";
import { readFile, readdir, rm, mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { setTimeout as sleep } from "node:timers/promises";
import * as k8s from "@kubernetes/client-node";
import { CNI_BIN_DIR } from "./host-packages.js";
import { GPU_PRODUCT_LABEL, setNodeGpus } from "./nodes.js";
import { freePort, type ProcessRecord } from "./processes.js";
import { stateDir } from "./versions.js";

const run = promisify(execFile);

export const REAL_NODE_TAINT = {
  key: "sim.warmstart.dev/real-node",
  value: "true",
  effect: "NoSchedule",
} as const;
export const REAL_NODE_LABEL = "sim.warmstart.dev/real-node";
export const DEFAULT_REAL_NODE_PRODUCT = "NVIDIA-L40S";

export interface RealNodePaths {
  dir: string;
  socket: string;
  kubeletRoot: string;
  podLogsDir: string;
  containerdRoot: string;
  containerdState: string;
}

export function realNodePaths(stateDir: string, name: string): RealNodePaths {
  const dir = join(stateDir, "nodes", name);
  return {
    dir,
    socket: join(dir, "containerd.sock"),
    kubeletRoot: join(dir, "kubelet"),
    podLogsDir: join(dir, "pod-logs"),
    containerdRoot: join(dir, "containerd", "root"),
    containerdState: join(dir, "containerd", "state"),
  };
}

export interface RealNodeContext {
  name: string;
  gpus: number;
  product?: string;
  stateDir: string;
  kubeconfig: string;
  caCert: string;
  kubelet: string;
  pauseImage: string;
  /** OCI archive of every image, imported before the kubelet starts. */
  imageArchive: string;
  launch: (name: string, command: string, args: string[]) => Promise<ProcessRecord>;
  core: k8s.CoreV1Api;
  progress: (line: string) => void;
}

/** Starts containerd, imports the images, starts the kubelet and waits for a Ready node with GPUs. */
export async function startRealNode(ctx: RealNodeContext): Promise<RealNodePaths> {
  const p = realNodePaths(ctx.stateDir, ctx.name);
  const cniConf = join(p.dir, "cni");
  await Promise.all(
    [p.kubeletRoot, p.podLogsDir, p.containerdRoot, p.containerdState, cniConf].map((d) =>
      mkdir(d, { recursive: true }),
    ),
  );
  // Pods use the host network; the loopback plugin only makes the runtime report its network ready.
  await writeFile(
    join(cniConf, "10-loopback.conf"),
    JSON.stringify({ cniVersion: "0.3.1", name: "lo", type: "loopback" }),
  );
  await writeFile(gpuProductFile(p), ctx.product ?? DEFAULT_REAL_NODE_PRODUCT);
  await writeFile(gpuRuntime(p), gpuRuntimeScript(p), { mode: 0o755 });
  await writeFile(join(p.dir, "containerd.toml"), containerdConfig(p, cniConf, ctx.pauseImage));
  ctx.progress(`real node ${ctx.name}: starting containerd`);
  await ctx.launch(`containerd-${ctx.name}`, "containerd", ["--config", join(p.dir, "containerd.toml")]);
  await waitFor(`containerd of ${ctx.name}`, 30_000, async () => {
    await ctr(p, ["version"]);
    return true;
  });
  const started = Date.now();
  await ctr(p, ["-n", "k8s.io", "images", "import", ctx.imageArchive]);
  ctx.progress(`real node ${ctx.name}: images imported in ${((Date.now() - started) / 1000).toFixed(1)}s`);

  const port = await freePort();
  await writeFile(join(p.dir, "kubelet.yaml"), kubeletConfig(p, port, ctx.caCert));
  ctx.progress(`real node ${ctx.name}: starting the kubelet`);
  await ctx.launch(`kubelet-${ctx.name}`, ctx.kubelet, [
    `--config=${join(p.dir, "kubelet.yaml")}`,
    `--kubeconfig=${ctx.kubeconfig}`,
    `--root-dir=${p.kubeletRoot}`,
    `--cert-dir=${join(p.dir, "kubelet-pki")}`,
    `--hostname-override=${ctx.name}`,
    `--node-labels=${GPU_PRODUCT_LABEL}=${ctx.product ?? DEFAULT_REAL_NODE_PRODUCT},${REAL_NODE_LABEL}=true`,
    "--v=0",
  ]);
  await waitFor(`node ${ctx.name} Ready`, 90_000, async () => {
    const node = await ctx.core.readNode({ name: ctx.name });
    return node.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ?? false;
  });
  // An extended resource, as a device plugin would advertise it: the kubelet keeps it in its status.
  await setNodeGpus(ctx.core, ctx.name, ctx.gpus);
  return p;
}

/**
 * Everything a real node leaves behind once its processes are stopped: containers (killed and
 * deleted through containerd while it still runs), shims (by the pid containerd recorded), and
 * mounts under its folder (deepest first). Called by `cluster down` before it stops containerd.
 */
export async function stopContainers(p: RealNodePaths): Promise<void> {
  const { stdout } = await ctr(p, ["-n", "k8s.io", "tasks", "ls", "-q"]).catch(() => ({ stdout: "" }));
  const ids = stdout
    .split("\n")
    .map((s) => s.trim())
    .filter(Boolean);
  await Promise.all(
    ids.map(async (id) => {
      await ctr(p, ["-n", "k8s.io", "tasks", "kill", "-a", "-s", "SIGKILL", id]).catch(() => undefined);
      for (let i = 0; i < 50; i++) {
        const r = await ctr(p, ["-n", "k8s.io", "tasks", "delete", id]).then(
          () => true,
          () => false,
        );
        if (r) break;
        await sleep(100);
      }
    }),
  );
}

/** A container's init process and the shim that runs it (host pids). */
export interface TaskProcesses {
  shim: number;
  init: number;
}

/**
 * The shims and containers' init processes of a real node, from its containerd's task folders:
 * each task's `init.pid` names the container's init, whose parent is its shim. Read while the
 * tasks still run: once they are gone nothing on disk names the shim's pid.
 */
export async function findTasks(p: RealNodePaths): Promise<TaskProcesses[]> {
  const tasks = join(p.containerdState, "io.containerd.runtime.v2.task");
  const found: TaskProcesses[] = [];
  for (const ns of await readdir(tasks).catch(() => [] as string[])) {
    for (const id of await readdir(join(tasks, ns)).catch(() => [] as string[])) {
      const init = Number((await readFile(join(tasks, ns, id, "init.pid"), "utf8").catch(() => "")).trim());
      const shim = init ? await parentOf(init) : 0;
      if (shim > 1) found.push({ shim, init });
    }
  }
  return found;
}

async function parentOf(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, "utf8").catch(() => "");
  return Number(/^PPid:\s*(\d+)/m.exec(status)?.[1] ?? 0);
}

/**
 * Kills what outlived containerd: each container's init (ending its PID namespace) while it is
 * still the child of its shim, then the shim; never a pid that has become something else.
 */
export async function killTasks(tasks: TaskProcesses[]): Promise<void> {
  const kill = (pid: number): void => {
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      /* gone */
    }
  };
  for (const t of tasks) if ((await parentOf(t.init)) === t.shim) kill(t.init);
  for (const shim of new Set(tasks.map((t) => t.shim))) {
    const cmd = await readFile(`/proc/${shim}/cmdline`, "utf8").catch(() => "");
    if (cmd.includes("containerd-shim")) kill(shim);
  }
}

/** Unmounts every mount point under `dir`, deepest first. */
export async function unmountUnder(dir: string): Promise<string[]> {
  const info = await readFile("/proc/self/mountinfo", "utf8");
  const points = info
    .split("\n")
    .map((l) => l.split(" ")[4])
    .filter((m): m is string => !!m)
    .map((m) => m.replace(/\\(\d{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8))))
    .filter((m) => m === dir || m.startsWith(`${dir}/`))
    .sort((a, b) => b.length - a.length);
  const done: string[] = [];
  for (const m of [...new Set(points)]) {
    await run("umount", ["-l", m]).then(
      () => done.push(m),
      () => undefined,
    );
  }
  return done;
}

export async function removeNodeFolder(p: RealNodePaths): Promise<void> {
  await unmountUnder(p.dir);
  await rm(p.dir, { recursive: true, force: true, maxRetries: 3 });
}

const gpuProductFile = (p: RealNodePaths): string => join(p.dir, "gpu-product");
const gpuRuntime = (p: RealNodePaths): string => join(p.dir, "runc-gpu");

/**
 * The node's container runtime, as the NVIDIA container runtime is on a GPU node: a wrapper of
 * runc that edits each container's OCI spec before runc creates it. Here it gives every container
 * the node's GPU product (NVIDIA_GPU_PRODUCT, from the node's gpu-product file), which the engine
 * stand-in's compile caches key on as real engines' key on the device.
 */
function gpuRuntimeScript(p: RealNodePaths): string {
  const edit = [
    "const fs = require('fs'); const [spec, file] = process.argv.slice(1);",
    "const c = JSON.parse(fs.readFileSync(spec, 'utf8')); if (!c.process) process.exit(0);",
    "const product = fs.readFileSync(file, 'utf8').trim();",
    "c.process.env = (c.process.env || []).filter((e) => !e.startsWith('NVIDIA_GPU_PRODUCT='));",
    "c.process.env.push('NVIDIA_GPU_PRODUCT=' + product); fs.writeFileSync(spec, JSON.stringify(c));",
  ].join(" ");
  return `#!/bin/sh
bundle= prev=
for a in "$@"; do
  case "$prev" in --bundle|-b) bundle=$a ;; esac
  case "$a" in --bundle=*) bundle=\${a#--bundle=} ;; esac
  prev=$a
done
if [ -n "$bundle" ] && [ -f "$bundle/config.json" ]; then
  ${shellQuote(process.execPath)} -e ${shellQuote(edit)} "$bundle/config.json" ${shellQuote(gpuProductFile(p))} || true
fi
exec runc "$@"
`;
}

const shellQuote = (s: string): string => `'${s.replaceAll("'", `'\\''`)}'`;

/**
 * Swaps a real node's GPUs for another product: containers created from now on see it, and the
 * node's nvidia.com/gpu.product label says it (as GPU feature discovery would).
 */
export async function setRealNodeGpuProduct(
  core: k8s.CoreV1Api,
  name: string,
  product: string,
  dir = stateDir(),
): Promise<void> {
  await writeFile(gpuProductFile(realNodePaths(dir, name)), product);
  await core.patchNode(
    { name, body: { metadata: { labels: { [GPU_PRODUCT_LABEL]: product } } } },
    k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch),
  );
}

function ctr(p: RealNodePaths, args: string[]): Promise<{ stdout: string }> {
  return run("ctr", ["--address", p.socket, "--connect-timeout", "2s", ...args], { maxBuffer: 16 << 20 });
}

function containerdConfig(p: RealNodePaths, cniConf: string, pause: string): string {
  return `version = 2
root = ${JSON.stringify(p.containerdRoot)}
state = ${JSON.stringify(p.containerdState)}
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = ${JSON.stringify(p.socket)}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = ${JSON.stringify(pause)}
  # The sandbox cannot raise its own OOM score (no CAP_SYS_RESOURCE here).
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = ${JSON.stringify(join(p.dir, "runc"))}
        BinaryName = ${JSON.stringify(gpuRuntime(p))}
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = ${JSON.stringify(CNI_BIN_DIR)}
    conf_dir = ${JSON.stringify(cniConf)}
`;
}

function kubeletConfig(p: RealNodePaths, port: number, caCert: string): string {
  return `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1 and has no systemd: cgroupfs, no per-QoS hierarchy.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
address: 127.0.0.1
port: ${port}
readOnlyPort: 0
healthzPort: 0
containerRuntimeEndpoint: unix://${p.socket}
podLogsDir: ${JSON.stringify(p.podLogsDir)}
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: false }
  x509: { clientCAFile: ${JSON.stringify(caCert)} }
authorization:
  mode: AlwaysAllow
registerNode: true
registerWithTaints:
  - { key: ${REAL_NODE_TAINT.key}, value: "${REAL_NODE_TAINT.value}", effect: ${REAL_NODE_TAINT.effect} }
# A shared development disk: evict only when it is really full, never collect the imported images.
evictionHard: { memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%" }
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
maxPods: 110
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
`;
}

async function waitFor(what: string, timeoutMs: number, check: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  while (Date.now() < deadline) {
    try {
      if (await check()) return;
    } catch (err) {
      last = err;
    }
    await sleep(200);
  }
  throw new Error(`timed out waiting for ${what}${last ? `: ${(last as Error).message}` : ""}`);
}
