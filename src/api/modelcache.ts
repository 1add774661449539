/**
 * The ModelCache record, written once: its zod schema is the TypeScript type every role uses, the
 * validator of records read from the API server, and the source of the CRD's openAPIV3Schema
 * (`crd.ts`). Objects are loose: a field this version does not know (written by a newer one)
 * survives a read-modify-write.
 */
import type * as k8s from "@kubernetes/client-node";
import { z } from "zod";
import { CACHE_PHASES, MODELCACHE } from "./names.js";

const int64 = (): z.ZodInt => z.int().meta({ format: "int64" });
const dateTime = (): z.ZodString => z.string().meta({ format: "date-time" });

export const restoreRecordSchema = z
  .looseObject({
    namespace: z.string(),
    name: z.string(),
    uid: z.string(),
    role: z.string(),
    readySeconds: z.number().describe("release (follower) or admission (restore) to Ready"),
    at: dateTime(),
  })
  .describe("one restore counted on the record");

const phaseSeconds = z
  .looseObject({
    download: z.number().optional(),
    weightLoad: z.number().optional(),
    modelLoad: z.number().optional(),
    compile: z.number().optional(),
    cudaGraph: z.number().optional(),
    engineInit: z.number().optional(),
    ready: z.number().optional(),
  })
  .describe("seconds per start-up phase, as the engine's own log lines say");

export const startupRecordSchema = z
  .looseObject({
    namespace: z.string(),
    name: z.string(),
    uid: z.string(),
    role: z.string(),
    node: z.string(),
    engine: z.string().describe("vllm, sglang, tgi, or unknown"),
    seconds: phaseSeconds,
    compileCache: z.enum(["hit", "miss", "unknown"]),
    cause: z.string().describe("why the compile cache missed, where it can be told").optional(),
    gpuProduct: z.string().describe("the node's nvidia.com/gpu.product when the pod started").optional(),
    factors: z
      .record(z.string(), z.string())
      .describe("the engine container's compile-relevant environment: name to a digest of the value")
      .optional(),
    config: z
      .record(z.string(), z.string().max(64))
      .describe("the settings the engine printed that its compile cache is keyed on (vLLM's config line)")
      .optional(),
    at: dateTime(),
  })
  .describe("one pod's start, read from its engine's log by the node agent of its node");

/** Kubernetes-style condition (metav1.Condition's fields), derived from the phase (`conditions.ts`). */
export const conditionSchema = z.looseObject({
  type: z.string(),
  status: z.enum(["True", "False", "Unknown"]),
  reason: z.string().optional(),
  message: z.string().optional(),
  lastTransitionTime: dateTime().optional(),
  observedGeneration: int64().optional(),
});

export const modelCacheSpecSchema = z.looseObject({
  hash: z
    .string()
    .regex(/^[0-9a-f]{64}$/)
    .describe("full sha256 cache hash"),
  model: z.string().optional(),
  inputs: z
    .unknown()
    .meta({
      type: "object",
      description: "the secret-free inputs of the hash, for explain",
      "x-kubernetes-preserve-unknown-fields": true,
    })
    .optional(),
  electionId: z.string().optional(),
  leader: z
    .looseObject({
      namespace: z.string().optional(),
      name: z.string().optional(),
      uid: z.string().optional(),
      node: z.string().optional(),
    })
    .optional(),
});

export const modelCacheStatusSchema = z.looseObject({
  phase: z.enum(CACHE_PHASES).optional(),
  reason: z.string().optional(),
  message: z.string().optional(),
  backend: z.string().optional(),
  node: z.string().optional(),
  path: z.string().optional(),
  sizeBytes: int64().optional(),
  sizeHuman: z.string().optional(),
  files: z.int().optional(),
  modelBytes: int64().optional(),
  cacheBytes: int64().optional(),
  leaderReadySeconds: z.number().optional(),
  captureSeconds: z.number().optional(),
  manifestDigest: z
    .string()
    .regex(/^[0-9a-f]{64}$/)
    .describe(
      "sha256 of the committed tree's manifest file, written by the elected leader's node agent: a copy of the tree is checked against it",
    )
    .optional(),
  replicas: z
    .record(
      z.string(),
      z.object({
        url: z.string().describe("the node agent's peer server, https://host:port"),
        at: dateTime().describe("when this copy was found to match manifestDigest, or last reported filling"),
        filling: z
          .object({ doneBytes: int64(), totalBytes: int64() })
          .describe("present while the copy is being filled from peers: it serves the chunks it holds")
          .optional(),
      }),
    )
    .describe(
      "every node holding a committed copy of the tree (or filling one), by node name: where peers fetch it",
    )
    .optional(),
  namespaces: z.array(z.string()).optional(),
  electionId: z
    .string()
    .describe("the election this status was written for; what it says is void for any other")
    .optional(),
  leaderUid: z.string().describe("UID of that election's leader, recorded when first seen").optional(),
  failedCaptures: z
    .int()
    .describe(
      "elections whose capture or promote failed (leader deletions and deadlines do not count); admission goes cold past a limit, `warmstart cache retry` clears it",
    )
    .optional(),
  lastFailedElection: z.string().describe("the last election counted in failedCaptures").optional(),
  restores: z.int().describe("restores counted as they turned Ready").optional(),
  savedBytes: int64().describe("bytes the restores did not download").optional(),
  savedSeconds: z
    .number()
    .describe("sum over restores of (leader's time to Ready - the restore's)")
    .optional(),
  restoredReadySecondsTotal: z
    .number()
    .describe("sum of the restores' times to Ready (a follower's from its release, others' from admission)")
    .optional(),
  lastRestoredAt: dateTime().optional(),
  recentRestores: z.array(restoreRecordSchema).max(50).optional(),
  startups: z
    .array(startupRecordSchema)
    .max(50)
    .describe("the leader's start and the last restores' (phases, compile cache hit or miss and why)")
    .optional(),
  /** When the phase last changed. */
  lastTransitionTime: dateTime().optional(),
  conditions: z
    .array(conditionSchema)
    .meta({
      description: "Ready and Progressing, derived from the phase and its reason",
      "x-kubernetes-list-type": "map",
      "x-kubernetes-list-map-keys": ["type"],
    })
    .optional(),
});

export const modelCacheSchema = z.looseObject({
  apiVersion: z.string(),
  kind: z.string(),
  // The API server's own: not part of the CRD's schema, and not checked here.
  metadata: z.custom<k8s.V1ObjectMeta>((v) => typeof v === "object" && v !== null),
  spec: modelCacheSpecSchema,
  status: modelCacheStatusSchema.optional(),
});

/** The durable record of one cache (CRD `modelcaches.warmstart.dev`), as every role reads it. */
export type ModelCacheObject = z.infer<typeof modelCacheSchema>;
export type ModelCacheSpec = z.infer<typeof modelCacheSpecSchema>;
export type ModelCacheStatus = z.infer<typeof modelCacheStatusSchema>;
/** One restore counted on its cache's record (the last few are kept, for the views and for dedupe). */
export type RestoreRecord = z.infer<typeof restoreRecordSchema>;
export type StartupRecord = z.infer<typeof startupRecordSchema>;
export type Condition = z.infer<typeof conditionSchema>;

/**
 * A record as read from the API server, checked against the schema. Throws, naming the record and
 * the fields, when it does not match (the API server validated it against the same schema, so
 * this means the CRD installed is not this version's).
 */
export function parseModelCache(obj: unknown): ModelCacheObject {
  const r = modelCacheSchema.safeParse(obj);
  if (r.success) return r.data;
  const name = (obj as { metadata?: { name?: unknown } } | undefined)?.metadata?.name;
  throw new Error(
    `${MODELCACHE.kind} ${typeof name === "string" ? name : "(unnamed)"} does not match its schema: ${z.prettifyError(r.error)}`,
    { cause: r.error },
  );
}

/** A filling entry not written for this long is a fill that died with its agent, or gave up. */
export const STALE_FILLING_MS = 120_000;

/**
 * The copies of a tree the record lists that are worth anything now: committed ones, and filling
 * ones written within STALE_FILLING_MS (a live fill rewrites its entry every few seconds).
 */
export function liveReplicas(
  cache: ModelCacheObject | undefined,
  now: number,
): [node: string, replica: NonNullable<ModelCacheStatus["replicas"]>[string]][] {
  return Object.entries(cache?.status?.replicas ?? {}).filter(
    ([, r]) => !r.filling || now - Date.parse(r.at) <= STALE_FILLING_MS,
  );
}
