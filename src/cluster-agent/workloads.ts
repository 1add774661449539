/**
 * What a deployment request becomes in the cluster: a Deployment of N model workers named after
 * the request, its Service, and a record of the request in the agent's namespace. Manifests are
 * built by pure functions; the writes are server-side applies, so repeating one changes nothing.
 */
import * as k8s from "@kubernetes/client-node";
import type { DeploymentRequest, Instance, ReportedPhase } from "../control-plane/api.js";
import { apiError, apiErrorInfo, isNotFound } from "../common/kube.js";
import { redactUrlCredentials } from "../core/env.js";
import { GPU_PRODUCT_LABEL, GPU_RESOURCE } from "./inventory.js";
import { MANAGED_BY } from "./credentials.js";
import type { Requirement } from "./selector.js";

export const FIELD_MANAGER = "warmstart-cluster-agent";
/**
 * The request's label, on every object the agent creates and on its pods. Not under warmstart.dev/:
 * on pods that domain belongs to admission, and the webhook removes whatever a pod's author wrote
 * there (SPEC 1.9); with the request's label gone a pod no longer matched its ReplicaSet, which
 * let it go and made another, without end.
 */
export const LABEL_REQUEST_ID = "cluster-agent.warmstart.dev/request-id";
/** The model on the pods, for the same reason outside warmstart.dev/ (the Deployment has ANN_MODEL). */
export const ANN_POD_MODEL = "cluster-agent.warmstart.dev/model";
export const LABEL_MANAGED_BY = "app.kubernetes.io/managed-by";
export const ANN_MESSAGE_ID = "warmstart.dev/message-id";
export const ANN_MODEL = "warmstart.dev/model";
export const ANN_GPU_TYPE = "warmstart.dev/gpu-type";
export const MODEL_PORT = 8000;

export interface PlacementOptions {
  /** The agent's node selector: workloads land only on the nodes it counts. */
  nodeSelector: readonly Requirement[];
  /** The label that overrides the product label for the GPU type. */
  gpuTypeLabel: string;
}

export const recordName = (requestId: string): string => `warmstart-request-${requestId}`;

/** The container args: the request's, or `--model <model>` when it has none. */
export function workerArgs(req: Pick<DeploymentRequest, "args" | "model">): string[] {
  return req.args.length > 0 ? [...req.args] : ["--model", req.model];
}

/**
 * Node affinity for a GPU type, exact whichever label names the type on a node: the override label
 * when a node has it, else the product label. Both terms also carry the agent's node selector.
 */
export function gpuAffinity(gpuType: string, p: PlacementOptions): k8s.V1Affinity {
  const pool: k8s.V1NodeSelectorRequirement[] = p.nodeSelector.map((r) => ({
    key: r.key,
    operator: r.operator,
    ...(r.values ? { values: [...r.values] } : {}),
  }));
  const terms: k8s.V1NodeSelectorTerm[] = [
    { matchExpressions: [{ key: p.gpuTypeLabel, operator: "In", values: [gpuType] }, ...pool] },
  ];
  if (p.gpuTypeLabel !== GPU_PRODUCT_LABEL) {
    terms.push({
      matchExpressions: [
        { key: p.gpuTypeLabel, operator: "DoesNotExist" },
        { key: GPU_PRODUCT_LABEL, operator: "In", values: [gpuType] },
        ...pool,
      ],
    });
  }
  return { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: terms } } };
}

export function buildDeployment(
  req: DeploymentRequest,
  namespace: string,
  messageId: string,
  p: PlacementOptions,
): k8s.V1Deployment {
  const labels = {
    [LABEL_REQUEST_ID]: req.requestId,
    [LABEL_MANAGED_BY]: MANAGED_BY,
    "app.kubernetes.io/name": req.name,
  };
  const gpus = String(req.gpus);
  // Annotations are readable by anyone who can read the Deployment: never a credential there. The
  // container's args are the user's own and stay as given.
  const model = redactUrlCredentials(req.model);
  return {
    apiVersion: "apps/v1",
    kind: "Deployment",
    metadata: {
      name: req.name,
      namespace,
      labels,
      annotations: { [ANN_MESSAGE_ID]: messageId, [ANN_MODEL]: model, [ANN_GPU_TYPE]: req.gpuType },
    },
    spec: {
      replicas: req.replicas,
      selector: { matchLabels: { [LABEL_REQUEST_ID]: req.requestId } },
      template: {
        metadata: { labels, annotations: { [ANN_POD_MODEL]: model } },
        spec: {
          affinity: gpuAffinity(req.gpuType, p),
          // GPU nodes are commonly tainted so that only GPU workloads land there.
          tolerations: [{ key: GPU_RESOURCE, operator: "Exists", effect: "NoSchedule" }],
          containers: [
            {
              name: "model",
              image: req.image,
              args: workerArgs(req),
              ports: [{ name: "http", containerPort: MODEL_PORT }],
              resources: { requests: { [GPU_RESOURCE]: gpus }, limits: { [GPU_RESOURCE]: gpus } },
            },
          ],
        },
      },
    },
  };
}

export function buildService(req: DeploymentRequest, namespace: string): k8s.V1Service {
  return {
    apiVersion: "v1",
    kind: "Service",
    metadata: {
      name: req.name,
      namespace,
      labels: {
        [LABEL_REQUEST_ID]: req.requestId,
        [LABEL_MANAGED_BY]: MANAGED_BY,
        "app.kubernetes.io/name": req.name,
      },
    },
    spec: {
      selector: { [LABEL_REQUEST_ID]: req.requestId },
      ports: [{ name: "http", port: MODEL_PORT, targetPort: "http" }],
    },
  };
}

/**
 * A request's progress from its Deployment and pods: Running when every replica is ready, Failed
 * when the rollout stopped progressing, else Deploying.
 */
export function workloadStatus(
  deployment: k8s.V1Deployment | undefined,
  pods: readonly k8s.V1Pod[],
): { phase: ReportedPhase; message?: string; instances: Instance[] } {
  const instances: Instance[] = pods
    .filter((p) => p.metadata?.name && !p.metadata.deletionTimestamp)
    .map((p) => ({
      name: p.metadata!.name!,
      phase: asPodPhase(p.status?.phase),
      ready: p.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ?? false,
    }))
    .sort((a, b) => (a.name < b.name ? -1 : 1));
  if (!deployment) return { phase: "Failed", message: "the Deployment is gone", instances };
  const stalled = deployment.status?.conditions?.find(
    (c) => c.type === "Progressing" && c.status === "False" && c.reason === "ProgressDeadlineExceeded",
  );
  if (stalled) return { phase: "Failed", message: stalled.message ?? "rollout stalled", instances };
  const want = deployment.spec?.replicas ?? 1;
  const ready = instances.filter((i) => i.ready).length;
  if (ready >= want && instances.length >= want)
    return { phase: "Running", message: `${ready}/${want} ready`, instances };
  return { phase: "Deploying", message: `${ready}/${want} ready`, instances };
}

function asPodPhase(p: string | undefined): Instance["phase"] {
  return p === "Pending" || p === "Running" || p === "Succeeded" || p === "Failed" ? p : "Unknown";
}

/** A Kubernetes refusal that will not change by retrying (bad spec, missing namespace, forbidden). */
export function isTerminalApiError(err: unknown): boolean {
  const { code } = apiErrorInfo(err);
  return code !== undefined && code >= 400 && code < 500 && code !== 408 && code !== 409 && code !== 429;
}

export type RecordState = "accepted" | "applied" | "terminated" | "failed";

export interface RequestRecord {
  requestId: string;
  messageId: string;
  name: string;
  namespace: string;
  state: RecordState;
  updatedAt: string;
}

function recordFrom(cm: k8s.V1ConfigMap): RequestRecord | undefined {
  const d = cm.data ?? {};
  if (!d.requestId || !d.state) return undefined;
  return {
    requestId: d.requestId,
    messageId: d.messageId ?? "",
    name: d.name ?? "",
    namespace: d.namespace ?? "",
    state: d.state as RecordState,
    updatedAt: d.updatedAt ?? "",
  };
}

/** Thrown when the target name already belongs to something this request does not own. */
export class OwnershipError extends Error {
  override readonly name = "OwnershipError";
}

/** Thrown when a request targets a namespace this agent does not deploy into. */
export class NamespaceNotAllowedError extends Error {
  override readonly name = "NamespaceNotAllowedError";
}

/** The cluster side of the queue: records, workloads and their status. */
export class Workloads {
  constructor(
    private readonly core: k8s.CoreV1Api,
    private readonly apps: k8s.AppsV1Api,
    /** Where the records live (the agent's namespace). */
    private readonly recordNamespace: string,
    private readonly placement: PlacementOptions,
    /** The only namespaces workloads may be created in. */
    readonly namespaces: readonly string[],
    /** When set, every workload goes here instead of the request's namespace. */
    private readonly workloadNamespace?: string,
  ) {}

  targetNamespace(req: { namespace: string }): string {
    return this.workloadNamespace ?? req.namespace;
  }

  allows(namespace: string): boolean {
    return this.namespaces.includes(namespace);
  }

  /** Why a request cannot be deployed into its namespace here, or undefined when it can. */
  refusal(req: { namespace: string }): string | undefined {
    const ns = this.targetNamespace(req);
    return this.allows(ns)
      ? undefined
      : `namespace ${ns} is not one this cluster agent deploys into (${this.namespaces.join(", ")})`;
  }

  async readRecord(requestId: string): Promise<RequestRecord | undefined> {
    try {
      const cm = await this.core.readNamespacedConfigMap({
        name: recordName(requestId),
        namespace: this.recordNamespace,
      });
      return recordFrom(cm);
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw apiError(`read record of request ${requestId}`, err);
    }
  }

  async listRecords(): Promise<RequestRecord[]> {
    const list = await this.core.listNamespacedConfigMap({
      namespace: this.recordNamespace,
      labelSelector: `${LABEL_MANAGED_BY}=${MANAGED_BY},${LABEL_REQUEST_ID}`,
    });
    return list.items.flatMap((cm) => recordFrom(cm) ?? []);
  }

  async writeRecord(rec: RequestRecord): Promise<void> {
    const body: k8s.V1ConfigMap = {
      apiVersion: "v1",
      kind: "ConfigMap",
      metadata: {
        name: recordName(rec.requestId),
        namespace: this.recordNamespace,
        labels: { [LABEL_MANAGED_BY]: MANAGED_BY, [LABEL_REQUEST_ID]: rec.requestId },
      },
      data: { ...rec },
    };
    try {
      await this.core.patchNamespacedConfigMap(
        {
          name: recordName(rec.requestId),
          namespace: this.recordNamespace,
          body,
          fieldManager: FIELD_MANAGER,
          force: true,
        },
        k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.ServerSideApply),
      );
    } catch (err) {
      throw apiError(`record request ${rec.requestId}`, err);
    }
  }

  async deleteRecord(requestId: string): Promise<void> {
    try {
      await this.core.deleteNamespacedConfigMap({
        name: recordName(requestId),
        namespace: this.recordNamespace,
      });
    } catch (err) {
      if (!isNotFound(err)) throw apiError(`delete record of request ${requestId}`, err);
    }
  }

  /** Create or converge the Deployment and Service; refuses to take over objects of another owner. */
  async apply(req: DeploymentRequest, messageId: string): Promise<void> {
    const namespace = this.targetNamespace(req);
    // The last guard, whatever the caller checked: nothing is written outside the allowlist.
    const refused = this.refusal(req);
    if (refused) throw new NamespaceNotAllowedError(refused);
    await this.checkOwner(namespace, req.name, req.requestId);
    const opts = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.ServerSideApply);
    try {
      await this.apps.patchNamespacedDeployment(
        {
          name: req.name,
          namespace,
          body: buildDeployment(req, namespace, messageId, this.placement),
          fieldManager: FIELD_MANAGER,
          force: true,
        },
        opts,
      );
      await this.core.patchNamespacedService(
        {
          name: req.name,
          namespace,
          body: buildService(req, namespace),
          fieldManager: FIELD_MANAGER,
          force: true,
        },
        opts,
      );
    } catch (err) {
      throw apiError(`apply workload ${namespace}/${req.name}`, err);
    }
  }

  private async checkOwner(namespace: string, name: string, requestId: string): Promise<void> {
    let existing: k8s.V1Deployment | undefined;
    try {
      existing = await this.apps.readNamespacedDeployment({ name, namespace });
    } catch (err) {
      if (isNotFound(err)) return;
      throw apiError(`read Deployment ${namespace}/${name}`, err);
    }
    const owner = existing.metadata?.labels?.[LABEL_REQUEST_ID];
    if (owner !== requestId)
      throw new OwnershipError(
        `Deployment ${namespace}/${name} already exists and belongs to ${owner ? `request ${owner}` : "someone else"}`,
      );
  }

  /** Delete the Deployment and Service of a request, but only if they are that request's. */
  async remove(requestId: string, namespace: string, name: string): Promise<void> {
    const dep = await this.apps.readNamespacedDeployment({ name, namespace }).catch((err: unknown) => {
      if (isNotFound(err)) return undefined;
      throw apiError(`read Deployment ${namespace}/${name}`, err);
    });
    if (dep && dep.metadata?.labels?.[LABEL_REQUEST_ID] === requestId) {
      await this.apps
        .deleteNamespacedDeployment({
          name,
          namespace,
          propagationPolicy: "Background",
          body: { preconditions: { uid: dep.metadata.uid } },
        })
        .catch((err: unknown) => {
          if (!isNotFound(err)) throw apiError(`delete Deployment ${namespace}/${name}`, err);
        });
    }
    const svc = await this.core.readNamespacedService({ name, namespace }).catch((err: unknown) => {
      if (isNotFound(err)) return undefined;
      throw apiError(`read Service ${namespace}/${name}`, err);
    });
    if (svc && svc.metadata?.labels?.[LABEL_REQUEST_ID] === requestId) {
      await this.core
        .deleteNamespacedService({ name, namespace, body: { preconditions: { uid: svc.metadata.uid } } })
        .catch((err: unknown) => {
          if (!isNotFound(err)) throw apiError(`delete Service ${namespace}/${name}`, err);
        });
    }
  }

  async status(rec: RequestRecord): Promise<ReturnType<typeof workloadStatus>> {
    const dep = await this.apps
      .readNamespacedDeployment({ name: rec.name, namespace: rec.namespace })
      .catch((err: unknown) => {
        if (isNotFound(err)) return undefined;
        throw apiError(`read Deployment ${rec.namespace}/${rec.name}`, err);
      });
    const owned = dep?.metadata?.labels?.[LABEL_REQUEST_ID] === rec.requestId ? dep : undefined;
    const pods = await this.core.listNamespacedPod({
      namespace: rec.namespace,
      labelSelector: `${LABEL_REQUEST_ID}=${rec.requestId}`,
    });
    return workloadStatus(owned, pods.items);
  }
}
