import * as k8s from "@kubernetes/client-node";
import { SKIP } from "../core/contract.js";
import { apiError, isAlreadyExists, isNotFound } from "../common/kube.js";

/**
 * The MutatingWebhookConfiguration for pod CREATE. Fail open (`Ignore`) with a short timeout so a
 * dead webhook never blocks a deployment; the system namespaces and opted-out namespaces are never
 * sent to us at all.
 */
export function webhookConfiguration(opts: {
  name: string;
  url?: string;
  service?: { namespace: string; name: string; port: number };
  caBundle: string;
  timeoutSeconds: number;
  systemNamespace: string;
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
        sideEffects: "None",
        timeoutSeconds: opts.timeoutSeconds,
        reinvocationPolicy: "Never",
        matchPolicy: "Equivalent",
        namespaceSelector: {
          matchExpressions: [
            {
              key: "kubernetes.io/metadata.name",
              operator: "NotIn",
              values: [opts.systemNamespace, "kube-system"],
            },
            { key: SKIP, operator: "NotIn", values: ["true"] },
          ],
        },
      },
    ],
  };
}

/** Create or replace the configuration (replace keeps a rotated CA bundle current). */
export async function registerWebhook(
  api: k8s.AdmissionregistrationV1Api,
  config: k8s.V1MutatingWebhookConfiguration,
): Promise<void> {
  const name = config.metadata!.name!;
  try {
    await api.createMutatingWebhookConfiguration({ body: config });
    return;
  } catch (err) {
    if (!isAlreadyExists(err)) throw apiError(`registering MutatingWebhookConfiguration ${name}`, err);
  }
  const current = await api.readMutatingWebhookConfiguration({ name });
  await api.replaceMutatingWebhookConfiguration({
    name,
    body: { ...config, metadata: { ...config.metadata, resourceVersion: current.metadata?.resourceVersion } },
  });
}

export async function unregisterWebhook(api: k8s.AdmissionregistrationV1Api, name: string): Promise<void> {
  try {
    await api.deleteMutatingWebhookConfiguration({ name });
  } catch (err) {
    if (!isNotFound(err)) throw apiError(`removing MutatingWebhookConfiguration ${name}`, err);
  }
}
