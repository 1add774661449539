/**
 * A chart of model-engine replicas for the local cluster's real nodes, as a serving chart would
 * write it (nothing Warmstart-specific in it): the engine stand-in with vLLM's command line,
 * fetching from the local model hub, on the host network, tolerating the real-node taint.
 */
import type * as k8s from "@kubernetes/client-node";
import { GPU_RESOURCE } from "../../src/core/gpu.js";
import { REAL_NODE_TAINT } from "./realnode.js";

export const ENGINE_READY_FILE = "/tmp/engine-ready";
export const ENGINE_REPORT_PREFIX = "ENGINE-REPORT ";

export interface EngineChart {
  name?: string;
  replicas: number;
  model: string;
  /** The real node (kubernetes.io/hostname) the replicas run on. */
  node: string;
  /** The local model hub (HF_ENDPOINT). */
  hub: string;
  image: string;
  compileSeconds: number;
  env?: k8s.V1EnvVar[];
  securityContext?: k8s.V1SecurityContext;
  podSecurityContext?: k8s.V1PodSecurityContext;
}

export function engineDeployment(o: EngineChart): k8s.V1Deployment {
  const name = o.name ?? "engine";
  const labels = { app: name };
  return {
    apiVersion: "apps/v1",
    kind: "Deployment",
    metadata: { name },
    spec: {
      replicas: o.replicas,
      selector: { matchLabels: labels },
      template: {
        metadata: { labels },
        spec: {
          hostNetwork: true,
          nodeSelector: { "kubernetes.io/hostname": o.node },
          tolerations: [{ key: REAL_NODE_TAINT.key, operator: "Exists", effect: REAL_NODE_TAINT.effect }],
          terminationGracePeriodSeconds: 2,
          ...(o.podSecurityContext ? { securityContext: o.podSecurityContext } : {}),
          containers: [
            {
              name: "engine",
              image: o.image,
              imagePullPolicy: "IfNotPresent",
              args: ["--model", o.model, "--compile-seconds", String(o.compileSeconds ?? 2)],
              env: [
                { name: "HF_ENDPOINT", value: o.hub },
                { name: "POD_NAME", valueFrom: { fieldRef: { fieldPath: "metadata.name" } } },
                ...(o.env ?? []),
              ],
              resources: { limits: { [GPU_RESOURCE]: "1" } },
              readinessProbe: { exec: { command: ["cat", ENGINE_READY_FILE] }, periodSeconds: 1 },
              ...(o.securityContext ? { securityContext: o.securityContext } : {}),
            },
          ],
        },
      },
    },
  };
}

export interface VllmServer {
  name: string;
  /** The real node (kubernetes.io/hostname) it runs on. */
  node: string;
  /** The vLLM image (`cluster status`'s `images.vllm`) and the hub's model it serves. */
  image: string;
  model: string;
  hub: string;
  /** Its own port of the node's network, which every pod there shares. */
  port: number;
  /**
   * A ConfigMap holding `serve.yaml`, read with `--config` (the chart's way); without one, the
   * settings are flags: bfloat16 and a short context.
   */
  configMap?: string;
  env?: k8s.V1EnvVar[];
}

/**
 * One real vLLM server (its CPU build) as a chart writes it, `vllm serve MODEL ...` in a container
 * named `engine`, on the host network, sized for the CPU build (1 GiB of KV cache: the image's env).
 */
export function vllmServerPod(o: VllmServer): k8s.V1Pod {
  const health = `import urllib.request; urllib.request.urlopen('http://127.0.0.1:${o.port}/health', timeout=2)`;
  const settings = o.configMap
    ? ["--config", "/etc/vllm/serve.yaml"]
    : ["--dtype", "bfloat16", "--max-model-len", "256"];
  return {
    metadata: { name: o.name, labels: { app: "vllm" } },
    spec: {
      hostNetwork: true,
      nodeSelector: { "kubernetes.io/hostname": o.node },
      tolerations: [{ key: REAL_NODE_TAINT.key, operator: "Exists", effect: REAL_NODE_TAINT.effect }],
      terminationGracePeriodSeconds: 2,
      containers: [
        {
          name: "engine",
          image: o.image,
          imagePullPolicy: "IfNotPresent",
          command: ["vllm", "serve"],
          args: [o.model, ...settings, "--port", String(o.port)],
          env: [{ name: "HF_ENDPOINT", value: o.hub }, ...(o.env ?? [])],
          resources: { limits: { [GPU_RESOURCE]: "1" } },
          readinessProbe: {
            exec: { command: ["python3", "-c", health] },
            periodSeconds: 1,
            timeoutSeconds: 5,
          },
          volumeMounts: [
            { name: "shm", mountPath: "/dev/shm" },
            ...(o.configMap ? [{ name: "serve", mountPath: "/etc/vllm", readOnly: true }] : []),
          ],
        },
      ],
      // vLLM's processes talk through shared memory (160 MiB here); a container's own /dev/shm
      // is 64 MiB, so charts mount a memory emptyDir there, as this one does.
      volumes: [
        { name: "shm", emptyDir: { medium: "Memory", sizeLimit: "1Gi" } },
        ...(o.configMap ? [{ name: "serve", configMap: { name: o.configMap } }] : []),
      ],
    },
  };
}

/** What the engine reports once ready (its one `ENGINE-REPORT {json}` line). */
export interface EngineReport {
  /** Which entry point ran: `vllm`, `sglang`, `tgi`, `nim`, `kserve-storage-initializer`, ... */
  engine?: string;
  model: string;
  uid: number;
  fetchedBytes: number;
  fetchSeconds: number;
  /** Where the weights went, and every download with its folder and bytes. */
  downloadDir?: string;
  downloads?: Array<{ what: string; repo: string; revision: string; dir: string; bytes: number }>;
  /** `disabled` when the engine runs eager (`--enforce-eager`): nothing is compiled. */
  compileCache: "hit" | "rebuilt" | "disabled";
  compileDetail?: string;
  compileSeconds: number;
  compileDirs?: string[];
  besideModel: { writable: boolean; error?: string };
  modelStore: { writable: boolean; error?: string; dir: string };
  readySeconds: number;
}

/** The report in a container log as the kubelet writes it (CRI lines: time, stream, tag, text). */
export function parseEngineReport(criLog: string): EngineReport | undefined {
  for (const raw of criLog.split("\n")) {
    const text = raw.split(" ").slice(3).join(" ");
    if (text.startsWith(ENGINE_REPORT_PREFIX))
      return JSON.parse(text.slice(ENGINE_REPORT_PREFIX.length)) as EngineReport;
  }
  return undefined;
}

/** The kubelet's log folder of one container: `<podLogsDir>/<ns>_<pod>_<uid>/<container>`. */
export function containerLogDir(podLogsDir: string, pod: k8s.V1Pod, container: string): string {
  return `${podLogsDir}/${pod.metadata!.namespace}_${pod.metadata!.name}_${pod.metadata!.uid}/${container}`;
}
