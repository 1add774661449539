/** What the node agent watches: the pods of its node, and every cache record (its trees' fate). */
import type * as k8s from "@kubernetes/client-node";
import type { Clock } from "../common/clock.js";
import { Informer } from "../common/controller/informer.js";
import type { Logger } from "../common/log.js";
import type { ModelCacheObject } from "../common/modelcache.js";
import { MODELCACHE } from "../core/contract.js";
import type { NodeAgentMetrics } from "./metrics.js";

export interface AgentInformers {
  pods: Informer<k8s.V1Pod>;
  caches: Informer<ModelCacheObject>;
}

export function agentInformers(o: {
  kc: k8s.KubeConfig;
  node: string;
  core: k8s.CoreV1Api;
  custom: k8s.CustomObjectsApi;
  clock: Clock;
  log: Logger;
  metrics: NodeAgentMetrics;
}): AgentInformers {
  const fieldSelector = `spec.nodeName=${o.node}`;
  const common = { kc: o.kc, clock: o.clock, log: o.log };
  return {
    pods: new Informer<k8s.V1Pod>({
      ...common,
      name: "pods",
      path: "/api/v1/pods",
      list: () => o.core.listPodForAllNamespaces({ fieldSelector }),
      fieldSelector,
      onError: () => o.metrics.watchRestarts.inc(),
    }),
    caches: new Informer<ModelCacheObject>({
      ...common,
      name: "modelcaches",
      path: `/apis/${MODELCACHE.group}/${MODELCACHE.version}/${MODELCACHE.plural}`,
      list: () =>
        o.custom.listClusterCustomObject({
          group: MODELCACHE.group,
          version: MODELCACHE.version,
          plural: MODELCACHE.plural,
        }) as Promise<k8s.KubernetesListObject<ModelCacheObject>>,
    }),
  };
}
