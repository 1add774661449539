/**
 * Gangs and groups (SPEC 1.3 "Groups and gangs: never deadlock"): whether something waits for a
 * pod, so that gating it could hold the very pods its leader needs.
 *
 * - A *gang member* is placed all-or-nothing by a gang scheduler: one gated member holds the
 *   whole gang, its leader included.
 * - A *rank* of a multi-node group serves one model instance together with the other ranks;
 *   rank 0 turns Ready only once every rank has joined.
 *
 * Every key below is read from each project's own code (repository, path, commit in
 * docs/compatibility.md, "Gangs and groups"). Only what is on a pod when the API server hands it
 * to the webhook counts: keys that a controller patches in later (KAI's and Volcano's group
 * annotations on plain pods, Kueue's group of an LWS) are covered by what is there at creation
 * (the scheduler's name, Kueue's queue label or gate).
 */
import type { V1Container, V1Pod } from "@kubernetes/client-node";
import { argvTokens, flagValue, type ArgvToken } from "./argv.js";
import { listOf, literalEnv, textOf } from "./env.js";
import { isRecord } from "./guards.js";

export const FOLLOWER_MODES = ["auto", "gate", "wait"] as const;
export type FollowerMode = (typeof FOLLOWER_MODES)[number];

/** The scheduler a pod names when it names none. */
export const DEFAULT_SCHEDULER = "default-scheduler";

export interface Gang {
  /** Which gang scheduler: workload, kueue, volcano, kai, coscheduling, grove, yunikorn. */
  kind: string;
  /** The gang's name as the pod gives it (the pod's scheduler, when only that says so). */
  name: string;
  /** The field, label or annotation that says so. */
  by: string;
}

export interface Group {
  /** Which multi-node group: lws, rbg, ray, kaito, grove, engine. */
  kind: string;
  /** The group's name within the pod's namespace (one model instance). */
  name: string;
  /**
   * The rank's ordinal (or role, where ranks have none: a Ray head or worker): part of the cache
   * hash, so rank k of a later group restores rank k's compile caches. Absent when the pod does
   * not say which rank it is.
   */
  rank?: string;
  by: string;
}

export interface Membership {
  gang?: Gang;
  group?: Group;
  /** `spec.schedulerName` when it is not the default scheduler. */
  scheduler?: string;
}

const labelsOf = (pod: V1Pod): Record<string, string> =>
  isRecord(pod.metadata?.labels) ? pod.metadata.labels : {};
const annotationsOf = (pod: V1Pod): Record<string, string> =>
  isRecord(pod.metadata?.annotations) ? pod.metadata.annotations : {};
/**
 * A key's value as read here: a string, cut to 128 characters. Names go into stamps, the Lease and
 * reasons, and an annotation the author wrote may be long (a pod's annotations may total 256 KiB):
 * copying it whole could make the admitted pod too large to store.
 */
const str = (v: unknown): string | undefined =>
  typeof v === "string" && v !== "" ? v.slice(0, MAX_NAME) : undefined;
const MAX_NAME = 128;

// Kubernetes' gang policy: k8s.io/api v0.35.4 core/v1 `workloadRef`; v0.36+ `schedulingGroup`.
const KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name";
const KUEUE_QUEUE = "kueue.x-k8s.io/queue-name";
const KUEUE_MANAGED = "kueue.x-k8s.io/managed";
const KUEUE_GATE = "kueue.x-k8s.io/admission";
const KUEUE_SERVING = "kueue.x-k8s.io/pod-group-serving";
const VOLCANO_GROUP = ["scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name"];
const KAI_GROUP = "pod-group-name";
const KAI_QUEUE = "kai.scheduler/queue";
// scheduler-plugins' coscheduling label, its two earlier names, and the one RoleBasedGroup writes.
const COSCHEDULING = [
  "scheduling.x-k8s.io/pod-group",
  "pod-group.scheduling.x-k8s.io",
  "pod-group.scheduling.sigs.k8s.io",
  "pod-group.scheduling.sigs.k8s.io/name",
];
const GROVE_GANG = "grove.io/podgang";
const GROVE_GATE = "grove.io/podgang-pending-creation";
const YUNIKORN_GROUPS = ["yunikorn.apache.org/task-groups", "yunikorn.apache.org/task-group-name"];
/** Schedulers that place pods in gangs (their own names, from their default configurations). */
const GANG_SCHEDULERS: Record<string, string> = { volcano: "volcano", "kai-scheduler": "kai" };

/** The gang a pod belongs to, when a gang scheduler places it. */
export function gangOf(pod: V1Pod): Gang | undefined {
  const spec: Record<string, unknown> = isRecord(pod.spec) ? pod.spec : {};
  const labels = labelsOf(pod);
  const ann = annotationsOf(pod);
  const ref = spec.workloadRef;
  if (isRecord(ref)) {
    const parts = [str(ref.name) ?? "?", str(ref.podGroup), str(ref.podGroupReplicaKey)].filter(Boolean);
    return { kind: "workload", name: parts.join("/"), by: "spec.workloadRef" };
  }
  const sg = spec.schedulingGroup;
  if (isRecord(sg))
    return { kind: "workload", name: str(sg.podGroupName) ?? "?", by: "spec.schedulingGroup" };
  const gates = listOf(spec.schedulingGates as { name?: unknown }[] | undefined).map((g) =>
    isRecord(g) ? textOf(g.name) : "",
  );
  const kueue = str(ann[KUEUE_GROUP]) ?? str(labels[KUEUE_GROUP]);
  if (kueue) return { kind: "kueue", name: kueue, by: KUEUE_GROUP };
  // A pod Kueue admits is all-or-nothing with its workload (and its own gate holds it until then).
  for (const [key, v] of [
    [KUEUE_QUEUE, labels[KUEUE_QUEUE]],
    [KUEUE_MANAGED, labels[KUEUE_MANAGED]],
    [KUEUE_SERVING, ann[KUEUE_SERVING]],
  ] as const)
    if (str(v)) return { kind: "kueue", name: str(labels[KUEUE_QUEUE]) ?? "?", by: key };
  if (gates.includes(KUEUE_GATE)) return { kind: "kueue", name: "?", by: `scheduling gate ${KUEUE_GATE}` };
  const grove = str(labels[GROVE_GANG]);
  if (grove) return { kind: "grove", name: grove, by: GROVE_GANG };
  if (gates.includes(GROVE_GATE)) return { kind: "grove", name: "?", by: `scheduling gate ${GROVE_GATE}` };
  for (const key of VOLCANO_GROUP) {
    const v = str(ann[key]);
    if (v) return { kind: "volcano", name: v, by: key };
  }
  const kai = str(ann[KAI_GROUP]);
  if (kai) return { kind: "kai", name: kai, by: KAI_GROUP };
  for (const key of COSCHEDULING) {
    const v = str(labels[key]);
    if (v) return { kind: "coscheduling", name: v, by: key };
  }
  for (const key of YUNIKORN_GROUPS)
    if (str(ann[key]))
      return { kind: "yunikorn", name: str(labels["yunikorn.apache.org/app-id"]) ?? "?", by: key };
  const scheduler = str(spec.schedulerName);
  if (scheduler && GANG_SCHEDULERS[scheduler])
    return {
      kind: GANG_SCHEDULERS[scheduler],
      name: str(labels[KAI_QUEUE]) ?? "?",
      by: `schedulerName ${scheduler}`,
    };
  return undefined;
}

const LWS = "leaderworkerset.sigs.k8s.io/";
const RBG = "rbg.workloads.x-k8s.io/";
const RBG_V1ALPHA1 = "component.rolebasedgroup.workloads.x-k8s.io/";
const POD_INDEX = "apps.kubernetes.io/pod-index";
const JOB_INDEX = "batch.kubernetes.io/job-completion-index";
const RAY = "ray.io/";
const GROVE_SCALING_GROUP = "grove.io/podcliquescalinggroup";
const GROVE_POD_INDEX = "grove.io/podclique-pod-index";

const moreThanOne = (v: string | undefined): boolean => v !== undefined && /^\d+$/.test(v) && Number(v) > 1;

/** The rank of a multi-node group a pod serves, when it is one. */
export function groupOf(pod: V1Pod, main?: V1Container): Group | undefined {
  const labels = labelsOf(pod);
  const ann = annotationsOf(pod);
  // LeaderWorkerSet (kubernetes-sigs/lws): the controller writes the name label and the size
  // annotation into both templates; the worker template alone has leader-name. A worker's pod
  // index is its worker index (its StatefulSet counts from 1); a leader's is its group's index.
  const lws = str(labels[`${LWS}name`]);
  if (lws && moreThanOne(str(ann[`${LWS}size`]))) {
    const worker = str(ann[`${LWS}leader-name`]) !== undefined;
    const rank = worker ? (str(labels[POD_INDEX]) ?? str(labels[`${LWS}worker-index`])) : "0";
    const index = worker
      ? str(labels[`${LWS}group-index`])
      : (str(labels[POD_INDEX]) ?? str(labels[`${LWS}group-index`]));
    return { kind: "lws", name: `${lws}/${index ?? "?"}`, ...(rank ? { rank } : {}), by: `label ${LWS}name` };
  }
  // RoleBasedGroup (sgl-project/rbg): its own leader/worker pattern, v1alpha2 and v1alpha1 keys.
  for (const [prefix, group] of [
    [RBG, str(labels[`${RBG}role-instance-name`]) ?? str(labels[`${RBG}group-name`])],
    [
      RBG_V1ALPHA1,
      str(labels["rolebasedgroup.workloads.x-k8s.io/group-unique-key"]) ??
        str(labels["rolebasedgroup.workloads.x-k8s.io/name"]),
    ],
  ] as const) {
    const size = str(labels[`${prefix}${prefix === RBG ? "component-size" : "size"}`]);
    if (!moreThanOne(size)) continue;
    const rank = str(labels[`${prefix}${prefix === RBG ? "component-index" : "index"}`]);
    return {
      kind: "rbg",
      name: group ?? "?",
      ...(rank ? { rank } : {}),
      by: `label ${prefix}${prefix === RBG ? "component-size" : "size"}`,
    };
  }
  // KubeRay (ray-project/kuberay): a head and its workers; a multi-host worker replica has a host index.
  const ray = str(labels[`${RAY}cluster`]);
  if (ray) {
    const type = str(labels[`${RAY}node-type`]);
    const host = str(labels[`${RAY}replica-host-index`]);
    const rank =
      type === "head" ? "head" : `worker/${str(labels[`${RAY}group`]) ?? "?"}${host ? `/${host}` : ""}`;
    return { kind: "ray", name: ray, rank, by: `label ${RAY}cluster` };
  }
  const c = main ?? firstContainer(pod);
  const env = c ? literalEnv(c) : new Map<string, string>();
  const tokens = c ? argvTokens(c) : [];
  // Grove (ai-dynamo/grove): a scaling group is one multi-node instance of a leader clique and a
  // worker clique, each indexed from 0; Dynamo gives each its rank in `--node-rank`.
  const pcsg = str(labels[GROVE_SCALING_GROUP]);
  if (pcsg) {
    const replica = str(labels[`${GROVE_SCALING_GROUP}-replica-index`]);
    const rank = rankOf(tokens, pod, c) ?? str(labels[GROVE_POD_INDEX]);
    return {
      kind: "grove",
      name: `${pcsg}/${replica ?? "?"}`,
      ...(rank ? { rank } : {}),
      by: `label ${GROVE_SCALING_GROUP}`,
    };
  }
  // KAITO (kaito-project/kaito): distributed inference is one StatefulSet whose pods read their
  // rank from POD_INDEX (the pod-index label); single-node workspaces have no POD_INDEX.
  const kaito = str(labels["kaito.sh/workspace"]);
  if (kaito && c && listOf(c.env).some((e) => isRecord(e) && e.name === "POD_INDEX")) {
    const rank = str(labels[POD_INDEX]);
    return {
      kind: "kaito",
      name: kaito,
      ...(rank ? { rank } : {}),
      by: "label kaito.sh/workspace with POD_INDEX",
    };
  }
  // The engines' own multi-node flags (SGLang, vLLM, torchrun, Ray, MPI), on any controller.
  const by = c ? engineMultiNode(tokens, env) : undefined;
  if (by) {
    const rank =
      rankOf(tokens, pod, c) ??
      str(labels[POD_INDEX]) ??
      str(labels[`${LWS}worker-index`]) ??
      str(labels[GROVE_POD_INDEX]) ??
      str(labels[`${RBG}component-index`]) ??
      str(labels[JOB_INDEX]) ??
      str(ann[JOB_INDEX]);
    return { kind: "engine", name: ownerOf(pod), ...(rank ? { rank } : {}), by };
  }
  return undefined;
}

const NODE_RANK = new Set(["--node-rank", "-r"]);
/** Flags that only the ranks of a multi-node engine take. */
const MULTI_NODE_FLAGS = new Set([
  "--dist-init-addr",
  "--nccl-init-addr",
  "--node-rank",
  "--master-addr",
  "--headless",
  "--data-parallel-start-rank",
  "--data-parallel-address",
  "--rdzv-endpoint",
]);
const MULTI_NODE_WORDS = new Set(["mpirun", "trtllm-llmapi-launch", "multi-node-serving.sh"]);

/** Why the engine's command line makes it a rank (a flag, or a launcher), or undefined. */
function engineMultiNode(tokens: readonly ArgvToken[], env: ReadonlyMap<string, string>): string | undefined {
  const nnodes = flagValue(tokens, new Set(["--nnodes", "--num-nodes"]));
  // One node said outright: whatever else it takes, nothing joins it.
  if (nnodes?.text.trim() === "1") return undefined;
  if (nnodes) return `flag --nnodes ${nnodes.text}`;
  for (const t of tokens) {
    if (t.op) continue;
    const flag = (t.text.split("=")[0] ?? "").replace(/_/g, "-");
    if (MULTI_NODE_FLAGS.has(flag)) return `flag ${flag}`;
    const word = t.text.slice(t.text.lastIndexOf("/") + 1);
    if (MULTI_NODE_WORDS.has(word)) return `launcher ${word}`;
  }
  // `ray start --head` / `ray start --address=...`: the node joins a Ray cluster.
  if (tokens.some((t, i) => t.text === "ray" && tokens[i + 1]?.text === "start")) return "launcher ray start";
  const pet = env.get("PET_NNODES");
  if (pet !== undefined && pet.trim() !== "1") return `env PET_NNODES=${pet}`;
  return undefined;
}

/** Index env the orchestrators inject (maybe after this webhook), by the label each is read from. */
const INDEX_ENV: Record<string, readonly string[]> = {
  LWS_WORKER_INDEX: [`${LWS}worker-index`, POD_INDEX],
  GROVE_PCLQ_POD_INDEX: [GROVE_POD_INDEX],
  RBG_LWP_WORKER_INDEX: [`${RBG}component-index`],
  POD_INDEX: [POD_INDEX],
  JOB_COMPLETION_INDEX: [JOB_INDEX],
};

/**
 * The rank a multi-node engine's `--node-rank` says: a number, or an index variable, plain or with
 * an offset (`$(LWS_WORKER_INDEX)`, `$((GROVE_PCLQ_POD_INDEX + 1))`), read from the label its
 * value comes from. Undefined when it says nothing this pod knows.
 */
function rankOf(tokens: readonly ArgvToken[], pod: V1Pod, c: V1Container | undefined): string | undefined {
  const r = flagValue(tokens, NODE_RANK)?.text.trim();
  if (r === undefined) return undefined;
  if (/^\d+$/.test(r)) return r;
  const m = /^\$(?:\(\(\s*|\(|\{)?([A-Za-z_][A-Za-z0-9_]*)(?:\s*\+\s*(\d+))?\s*(?:\)\)|\)|\})?$/.exec(r);
  if (!m?.[1]) return undefined;
  const v = indexValue(m[1], pod, c);
  if (v === undefined || !/^\d+$/.test(v)) return undefined;
  return String(Number(v) + Number(m[2] ?? 0));
}

/** An index variable's value: its literal env, the label or annotation its env is read from, or the known orchestrators' labels. */
function indexValue(name: string, pod: V1Pod, c: V1Container | undefined): string | undefined {
  const labels = labelsOf(pod);
  const ann = annotationsOf(pod);
  const e = [...listOf(c?.env)].reverse().find((x) => isRecord(x) && x.name === name);
  if (e && typeof e.value === "string") return e.value;
  const path = e?.valueFrom?.fieldRef?.fieldPath;
  const ref = typeof path === "string" ? /^metadata\.(labels|annotations)\['([^']+)'\]$/.exec(path) : null;
  if (ref?.[2]) return str((ref[1] === "labels" ? labels : ann)[ref[2]]);
  for (const key of INDEX_ENV[name] ?? []) {
    const v = str(labels[key]) ?? str(ann[key]);
    if (v !== undefined) return v;
  }
  return undefined;
}

const firstContainer = (pod: V1Pod): V1Container | undefined => {
  const c = listOf(pod.spec?.containers)[0];
  return isRecord(c) ? c : undefined;
};

/** The pod's controller (kind/name), or its generateName: what its replicas share. */
function ownerOf(pod: V1Pod): string {
  const o = listOf(pod.metadata?.ownerReferences).find((r) => isRecord(r) && r.controller === true);
  if (o && str(o.name)) return `${str(o.kind) ?? "?"}/${o.name}`;
  return str(pod.metadata?.generateName) ?? str(pod.metadata?.name) ?? "?";
}

/** What waits for a pod: its gang, its group, its scheduler. */
export function membershipOf(pod: V1Pod, main?: V1Container): Membership {
  const gang = gangOf(pod);
  const group = groupOf(pod, main);
  const s = str(isRecord(pod.spec) ? pod.spec.schedulerName : undefined);
  return {
    ...(gang ? { gang } : {}),
    ...(group ? { group } : {}),
    ...(s && s !== DEFAULT_SCHEDULER ? { scheduler: s } : {}),
  };
}

/** How a follower of this pod's hash waits: gated (holding no node and no GPU), or running. */
export interface FollowerWait {
  mode: "gate" | "wait";
  why: string;
}

/**
 * The follower mode a pod gets (SPEC 1.3): never gated where something waits for it; gated where
 * that is safe (no gang, no group, the default scheduler), unless the configuration says `wait`.
 * `gate` is refused for gang members: one gated member holds the whole gang.
 */
export function followerWait(m: Membership, mode: FollowerMode): FollowerWait {
  if (m.gang)
    return {
      mode: "wait",
      why:
        `gang member (${m.gang.kind} ${m.gang.name}, ${m.gang.by}): one gated member would hold the whole gang` +
        (mode === "gate" ? "; election.followerMode=gate is refused for gang members" : ""),
    };
  if (mode === "wait") return { mode: "wait", why: "election.followerMode=wait" };
  if (mode === "gate") return { mode: "gate", why: "election.followerMode=gate" };
  if (m.group)
    return {
      mode: "wait",
      why: `rank ${m.group.rank ?? "?"} of multi-node group ${m.group.kind} ${m.group.name} (${m.group.by}): its other ranks wait for it`,
    };
  if (m.scheduler)
    return { mode: "wait", why: `scheduled by ${m.scheduler}, which may place it with others` };
  return { mode: "gate", why: "nothing waits for it (no gang, no group, the default scheduler)" };
}

/** The key that says two pods are ranks of one group (namespace, kind and name). */
export const groupKey = (namespace: string, g: Group): string => `${namespace}/${g.kind}/${g.name}`;
