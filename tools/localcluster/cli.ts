import { Command, Option } from "commander";
import { down, status, up, type ClusterState } from "./cluster.js";
import { SHARING_SCOPES } from "../../src/core/scope.js";
import type { SharingScope } from "../../src/core/contract.js";

const progress = (line: string): void => {
  process.stderr.write(`[cluster] ${line}\n`);
};

function publicStatus(s: Awaited<ReturnType<typeof status>>): Record<string, unknown> {
  if (!("kubeconfig" in s)) return { running: false };
  const st = s;
  return {
    running: st.running,
    kubeconfig: st.kubeconfig,
    apiServer: st.apiServer,
    versions: st.versions,
    startedAt: st.startedAt,
    nodes: st.nodes,
    roles: st.roles,
    ...(st.images ? { images: st.images } : {}),
    ...(st.models ? { models: st.models } : {}),
    ...(st.csi ? { csi: st.csi } : {}),
    ...(st.storeDriver ? { storeDriver: st.storeDriver } : {}),
    processes: st.processes.map((p) => ({ name: p.name, pid: p.pid, log: p.log })),
  };
}

export function registerClusterCommands(program: Command): void {
  const cluster = program
    .command("cluster")
    .description("a real local Kubernetes control plane with simulated GPU nodes");

  cluster
    .command("up")
    .description(
      "build (once) and start etcd, kube-apiserver, controller manager, scheduler, KWOK and the Warmstart roles",
    )
    .addOption(new Option("--nodes <n>", "simulated GPU nodes").default(2).argParser(positiveInt))
    .addOption(new Option("--gpus <n>", "nvidia.com/gpu per node").default(4).argParser(positiveInt))
    .addOption(
      new Option("--real-nodes <n>", "kubelet nodes that run real containers (containerd, runc)")
        .env("WARMSTART_REAL_NODES")
        .default(1)
        .argParser(positiveInt),
    )
    .addOption(
      new Option("--hub-model-mib <n>", "size of each synthetic model the local hub serves")
        .default(256)
        .argParser(positiveInt),
    )
    .addOption(
      new Option("--hub-mib-s <n>", "bandwidth shared by all the hub's clients, MiB/s (0: unthrottled)")
        .default(64)
        .argParser(positiveInt),
    )
    .addOption(
      new Option("--sharing-scope <scope>", "the webhook's sharing scope (who shares a cache)")
        .choices(SHARING_SCOPES)
        .default("cluster"),
    )
    .addOption(
      new Option(
        "--node-link-mbit <n>",
        "shape what each real node sends to its peers to this rate, Mbit/s (default: loopback's speed)",
      ).argParser(positiveInt),
    )
    .option("--no-csi", "without the CSI stack (driver stand-in and sidecars) on the first real node")
    .option(
      "--store-driver",
      "each real node's agent serves the CSI driver store.warmstart.dev with a peer certificate and token (replication between nodes); the default wherever there are real nodes and roles",
    )
    .option(
      "--no-store-driver",
      "real nodes' agents without the store driver: restores pinned to the tree's node",
    )
    .option("--bare", "start Kubernetes alone, without the Warmstart roles", false)
    .addOption(
      new Option(
        "--vllm",
        "real vLLM (its CPU build, about 5.5 GiB an image) on every real node, and the hub's real tiny model",
      )
        .env("WARMSTART_VLLM")
        .default(false),
    )
    .action(
      async (opts: {
        nodes: number;
        gpus: number;
        realNodes: number;
        nodeLinkMbit?: number;
        hubModelMib: number;
        hubMibS: number;
        csi: boolean;
        storeDriver?: boolean;
        bare: boolean;
        sharingScope: SharingScope;
        vllm: boolean;
      }) => {
        const state = await up({
          nodes: opts.nodes,
          gpusPerNode: opts.gpus,
          realNodes: opts.realNodes,
          nodeLinkMbit: opts.nodeLinkMbit,
          hubModelMiB: opts.hubModelMib,
          hubMiBs: opts.hubMibS,
          csi: opts.csi,
          storeDriver: opts.storeDriver,
          bare: opts.bare,
          sharingScope: opts.sharingScope,
          vllm: Boolean(opts.vllm),
          progress,
        });
        process.stdout.write(
          `kubeconfig: ${state.kubeconfig}\napi server: ${state.apiServer}\nnodes:      ${state.nodes
            .map((n) => `${n.name} (${n.gpus} GPU)`)
            .join(", ")}\n` +
            Object.entries(state.roles)
              .map(([k, v]) => `${`${k}:`.padEnd(12)}${String(v)}\n`)
              .join("") +
            (state.storeDriver ? `store driver: ${storeDriverLine(state)}\n` : "") +
            `\nexport KUBECONFIG=${state.kubeconfig}\n`,
        );
      },
    );

  cluster
    .command("down")
    .description("stop every process the local cluster started")
    .action(async () => {
      await down(progress);
    });

  cluster
    .command("status")
    .description("what is running")
    .addOption(new Option("-o, --output <format>", "output format").choices(["text", "json"]).default("text"))
    .action(async (opts: { output: string }) => {
      const s = publicStatus(await status());
      if (opts.output === "json") {
        process.stdout.write(`${JSON.stringify(s, null, 2)}\n`);
        return;
      }
      if (!s.running) {
        process.stdout.write("not running\n");
        process.exitCode = 3;
        return;
      }
      const st = s as unknown as ClusterState;
      process.stdout.write(`running since ${st.startedAt}\nkubeconfig: ${st.kubeconfig}\n`);
      for (const n of st.nodes)
        process.stdout.write(
          `node ${n.name}: ${n.gpus} GPU, ${n.real ? "real (containerd)" : "simulated"}, kubelet root ${n.kubeletRoot}\n`,
        );
      for (const [k, v] of Object.entries(st.roles)) process.stdout.write(`${k}: ${String(v)}\n`);
      if (st.storeDriver) process.stdout.write(`store driver: ${storeDriverLine(st)}\n`);
    });
}

function storeDriverLine(st: ClusterState): string {
  const d = st.storeDriver!;
  return `${d.driver} on ${d.nodes.join(", ")} (peer certificates in ${d.peerTls})`;
}

function positiveInt(v: string): number {
  const n = Number(v);
  if (!Number.isInteger(n) || n < 0) throw new Error(`expected a non-negative integer, got "${v}"`);
  return n;
}
