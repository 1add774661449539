import * as k8s from "@kubernetes/client-node";
import { apiError, isAlreadyExists, isNotFound } from "../common/kube.js";
import { UNADMITTED_NAMESPACES } from "../core/contract.js";

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
