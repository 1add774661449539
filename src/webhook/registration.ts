import * as k8s from "@kubernetes/client-node";
import { apiError, isAlreadyExists, isNotFound } from "../common/kube.js";
import { UNADMITTED_NAMESPACES } from "../core/contract.js";
import { RECORDS_PATH } from "./server.js";

/**
 * The MutatingWebhookConfiguration for pod CREATE. Fail open (`Ignore`) with a short timeout so a
 * dead webhook never blocks a deployment. Every namespace but kube-system is sent to us, opted-out
 * ones and our own included: the stamps a pod's author set are removed whatever the decision
 * (docs/adr/0004-admission-election-and-fail-open.md). Side effects (Leases, records, claims)
 * happen only on real creates.
 */
export function webhookConfiguration(opts: {
  name: string;
  url?: string;
  service?: { namespace: string; name: string; port: number };
  caBundle: string;
  timeoutSeconds: number;
}): k8s.V1MutatingWebhookConfiguration {
  return {
    apiVersion: "admissionregistration.k8s.io/v1",
    kind: "MutatingWebhookConfiguration",
    metadata: { name: opts.name, labels: { "app.kubernetes.io/name": "warmstart" } },
    webhooks: [
      {
        name: "pods.warmstart.dev",
        admissionReviewVersions: ["v1"],
        clientConfig: {
          ...(opts.url ? { url: `${opts.url.replace(/\/$/, "")}/mutate` } : {}),
          ...(opts.service ? { service: { ...opts.service, path: "/mutate" } } : {}),
          caBundle: Buffer.from(opts.caBundle).toString("base64"),
        },
        rules: [
          {
            operations: ["CREATE"],
            apiGroups: [""],
            apiVersions: ["v1"],
            resources: ["pods"],
            scope: "Namespaced",
          },
        ],
        failurePolicy: "Ignore",
        sideEffects: "NoneOnDryRun",
        timeoutSeconds: opts.timeoutSeconds,
        reinvocationPolicy: "Never",
        matchPolicy: "Equivalent",
        namespaceSelector: {
          matchExpressions: [
            { key: "kubernetes.io/metadata.name", operator: "NotIn", values: [...UNADMITTED_NAMESPACES] },
          ],
        },
      },
    ],
  };
}

/**
 * The ValidatingWebhookConfiguration for node agents' writes to cache records that claim a
 * capture (records-review.ts): refused when the webhook cannot answer (`Fail`), which holds only
 * those writes, never a pod. The match conditions send nothing else.
 */
export function recordsWebhookConfiguration(opts: {
  name: string;
  url?: string;
  service?: { namespace: string; name: string; port: number };
  caBundle: string;
  timeoutSeconds: number;
  nodeAgentUser: string;
}): k8s.V1ValidatingWebhookConfiguration {
  return {
    apiVersion: "admissionregistration.k8s.io/v1",
    kind: "ValidatingWebhookConfiguration",
    metadata: { name: opts.name, labels: { "app.kubernetes.io/name": "warmstart" } },
    webhooks: [
      {
        name: "records.warmstart.dev",
        admissionReviewVersions: ["v1"],
        clientConfig: {
          ...(opts.url ? { url: `${opts.url.replace(/\/$/, "")}${RECORDS_PATH}` } : {}),
          ...(opts.service ? { service: { ...opts.service, path: RECORDS_PATH } } : {}),
          caBundle: Buffer.from(opts.caBundle).toString("base64"),
        },
        rules: [
          {
            operations: ["CREATE", "UPDATE"],
            apiGroups: ["warmstart.dev"],
            apiVersions: ["*"],
            resources: ["modelcaches", "modelcaches/status"],
            scope: "Cluster",
          },
        ],
        failurePolicy: "Fail",
        sideEffects: "None",
        timeoutSeconds: opts.timeoutSeconds,
        matchPolicy: "Equivalent",
        matchConditions: [
          {
            name: "a-node-agent-claiming-a-capture",
            expression:
              `request.userInfo.username == '${opts.nodeAgentUser}' && (request.operation == 'CREATE' || ` +
              "object.?status.?node.orValue('') != oldObject.?status.?node.orValue('') || " +
              "object.?status.?manifestDigest.orValue('') != oldObject.?status.?manifestDigest.orValue(''))",
          },
        ],
      },
    ],
  };
}

/** Create or replace the configuration (replace keeps a rotated CA bundle current). */
export function registerWebhook(
  api: k8s.AdmissionregistrationV1Api,
  config: k8s.V1MutatingWebhookConfiguration,
): Promise<void> {
  return createOrReplace("MutatingWebhookConfiguration", config, {
    create: (body) => api.createMutatingWebhookConfiguration({ body }),
    read: (name) => api.readMutatingWebhookConfiguration({ name }),
    replace: (name, body) => api.replaceMutatingWebhookConfiguration({ name, body }),
  });
}

/** Create or replace the records review's configuration. */
export function registerRecordsWebhook(
  api: k8s.AdmissionregistrationV1Api,
  config: k8s.V1ValidatingWebhookConfiguration,
): Promise<void> {
  return createOrReplace("ValidatingWebhookConfiguration", config, {
    create: (body) => api.createValidatingWebhookConfiguration({ body }),
    read: (name) => api.readValidatingWebhookConfiguration({ name }),
    replace: (name, body) => api.replaceValidatingWebhookConfiguration({ name, body }),
  });
}

async function createOrReplace<T extends { metadata?: k8s.V1ObjectMeta }>(
  kind: string,
  config: T,
  api: {
    create(body: T): Promise<unknown>;
    read(name: string): Promise<T>;
    replace(name: string, body: T): Promise<unknown>;
  },
): Promise<void> {
  const name = config.metadata!.name!;
  try {
    await api.create(config);
    return;
  } catch (err) {
    if (!isAlreadyExists(err)) throw apiError(`registering ${kind} ${name}`, err);
  }
  const current = await api.read(name);
  await api.replace(name, {
    ...config,
    metadata: { ...config.metadata, resourceVersion: current.metadata?.resourceVersion },
  });
}

export async function unregisterWebhook(api: k8s.AdmissionregistrationV1Api, name: string): Promise<void> {
  try {
    await api.deleteMutatingWebhookConfiguration({ name });
  } catch (err) {
    if (!isNotFound(err)) throw apiError(`removing MutatingWebhookConfiguration ${name}`, err);
  }
}
