/**
 * Pods of the compatibility corpus (test/corpus/: rendered upstream charts and operators, each
 * file saying where it came from), read for tests on the local cluster's real nodes.
 */
import { readFileSync } from "node:fs";
import type * as k8s from "@kubernetes/client-node";
import { parse } from "yaml";
import { kube } from "./harness.js";

interface CorpusPod {
  id: string;
  pod: k8s.V1Pod;
}
export function corpus(file: string): Map<string, k8s.V1Pod> {
  const text = readFileSync(new URL(`../../test/corpus/${file}`, import.meta.url), "utf8");
  const doc = parse(text) as { pods: CorpusPod[] };
  return new Map(doc.pods.map((p) => [p.id, p.pod]));
}

/** The secrets and config maps a pod's env and volumes refer to, created with placeholder values. */
export async function createReferenced(namespace: string, pod: k8s.V1Pod): Promise<void> {
  const { core } = await kube();
  for (const v of pod.spec?.volumes ?? []) {
    const keys = (items?: k8s.V1KeyToPath[]): Record<string, string> =>
      Object.fromEntries((items ?? []).map((i) => [i.key, "placeholder"]));
    if (v.configMap?.name)
      await core
        .createNamespacedConfigMap({
          namespace,
          body: { metadata: { name: v.configMap.name }, data: keys(v.configMap.items) },
        })
        .catch(() => undefined);
    if (v.secret?.secretName)
      await core
        .createNamespacedSecret({
          namespace,
          body: { metadata: { name: v.secret.secretName }, stringData: keys(v.secret.items) },
        })
        .catch(() => undefined);
  }
  const env = [...(pod.spec?.containers ?? []), ...(pod.spec?.initContainers ?? [])].flatMap(
    (c) => c.env ?? [],
  );
  for (const e of env) {
    const s = e.valueFrom?.secretKeyRef;
    const m = e.valueFrom?.configMapKeyRef;
    if (s?.name)
      await core
        .createNamespacedSecret({
          namespace,
          body: { metadata: { name: s.name }, stringData: { [s.key]: "placeholder" } },
        })
        .catch(() => undefined);
    if (m?.name)
      await core
        .createNamespacedConfigMap({
          namespace,
          body: { metadata: { name: m.name }, data: { [m.key]: "placeholder" } },
        })
        .catch(() => undefined);
  }
}
