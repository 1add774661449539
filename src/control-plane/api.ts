/**
 * The control plane's wire contract: one set of zod schemas that validates input on the server,
 * parses responses in the client, types the cluster agent, and generates the OpenAPI document.
 * Change a schema here and all four follow.
 */
import { z } from "zod";

export const API_PREFIX = "/v1";

// ---------------------------------------------------------------------------------------------
// Building blocks

/** DNS-1123 label: what Kubernetes accepts as a Deployment, Service or namespace name. */
export const Dns1123Label = z
  .string()
  .min(1)
  .max(63)
  .regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, {
    message: "must be a DNS-1123 label: lowercase letters, digits and '-', starting and ending alphanumeric",
  });

export const ClusterId = z
  .string()
  .min(1)
  .max(63)
  .regex(/^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$/, {
    message: "must be 1-63 letters, digits, '.', '_' or '-', starting and ending alphanumeric",
  });

/** A GPU product name as nodes label it (`nvidia.com/gpu.product`), e.g. `NVIDIA-H100-80GB-HBM3`. */
export const GpuType = z
  .string()
  .min(1)
  .max(128)
  .regex(/^[A-Za-z0-9]([A-Za-z0-9._ -]*[A-Za-z0-9])?$/, {
    message: "must be 1-128 letters, digits, '.', '_', '-' or spaces, starting and ending alphanumeric",
  });

export const RequestId = z.uuid({ message: "must be a request id (UUID)" });

export const InventoryItem = z.object({
  gpuType: GpuType,
  count: z.int().min(0).max(1_000_000),
});
export type InventoryItem = z.infer<typeof InventoryItem>;

/** GPU capacity by type. Zero counts are allowed: a cluster without GPUs registers with capacity 0. */
export const Inventory = z
  .array(InventoryItem)
  .max(64)
  .refine((items) => new Set(items.map((i) => i.gpuType)).size === items.length, {
    message: "each gpuType may appear once",
  });
export type Inventory = z.infer<typeof Inventory>;

export const Credentials = z.object({
  token: z.string().min(1),
  /** ISO 8601; the credential is refused (401) from this instant. */
  expiresAt: z.iso.datetime(),
});
export type Credentials = z.infer<typeof Credentials>;

export const Instruction = z.enum(["none", "cordon", "drain"]);
export type Instruction = z.infer<typeof Instruction>;

export const QueueName = z.enum(["deploy", "termination"]);
export type QueueName = z.infer<typeof QueueName>;

/** Phases a cluster agent reports for a request. */
export const ReportedPhase = z.enum(["Accepted", "Deploying", "Running", "Failed", "Terminated"]);
export type ReportedPhase = z.infer<typeof ReportedPhase>;

/**
 * A request's status as the control plane shows it: `Pending` (no cluster has the GPUs yet),
 * `Queued` (on a cluster's queue), then what the agent reports; `Terminating` once deleted.
 */
export const RequestStatus = z.enum([
  "Pending",
  "Queued",
  "Accepted",
  "Deploying",
  "Running",
  "Failed",
  "Terminating",
  "Terminated",
]);
export type RequestStatus = z.infer<typeof RequestStatus>;

export const Instance = z.object({
  name: z.string().min(1).max(253),
  phase: z.enum(["Pending", "Running", "Succeeded", "Failed", "Unknown"]),
  ready: z.boolean(),
});
export type Instance = z.infer<typeof Instance>;

export const ErrorBody = z.object({
  error: z.string(),
  /** Field-level problems for a 400. */
  issues: z.array(z.object({ path: z.string(), message: z.string() })).optional(),
});
export type ErrorBody = z.infer<typeof ErrorBody>;

// ---------------------------------------------------------------------------------------------
// Cluster agent calls

export const RegisterRequest = z.object({
  clusterId: ClusterId,
  name: z.string().min(1).max(253).optional(),
  agentVersion: z.string().min(1).max(128).optional(),
  inventory: Inventory,
  /** The namespaces this cluster's agent deploys into; requests for others are not placed here. */
  namespaces: z
    .array(Dns1123Label)
    .min(1)
    .max(256)
    .refine((ns) => new Set(ns).size === ns.length, { message: "each namespace may appear once" })
    .optional(),
});
export type RegisterRequest = z.infer<typeof RegisterRequest>;

export const RegisterResponse = z.object({
  clusterId: ClusterId,
  credentials: Credentials,
  queues: z.object({
    /** GPU types with a deploy queue for this cluster (those registered with a count above zero). */
    deploy: z.array(GpuType),
    termination: z.literal(true),
  }),
  heartbeatIntervalSeconds: z.int().positive(),
  /** Renew this many seconds before `credentials.expiresAt`. */
  renewBeforeSeconds: z.int().positive(),
});
export type RegisterResponse = z.infer<typeof RegisterResponse>;

export const RenewResponse = z.object({
  clusterId: ClusterId,
  credentials: Credentials,
  renewBeforeSeconds: z.int().positive(),
});
export type RenewResponse = z.infer<typeof RenewResponse>;

export const HeartbeatRequest = z.object({
  inventory: Inventory,
  ready: z.boolean(),
  paused: z.boolean(),
});
export type HeartbeatRequest = z.infer<typeof HeartbeatRequest>;

export const HeartbeatResponse = z.object({ instruction: Instruction });
export type HeartbeatResponse = z.infer<typeof HeartbeatResponse>;

/** What a deploy message carries: everything the agent needs to create the workload. */
export const DeploymentRequest = z.object({
  kind: z.literal("deploy"),
  requestId: RequestId,
  name: Dns1123Label,
  namespace: Dns1123Label,
  model: z.string(),
  image: z.string(),
  /** The container args; when the submitter gave none: `["--model", model]`. */
  args: z.array(z.string()),
  /** GPUs per replica. */
  gpus: z.int().positive(),
  /** The GPU type this request was queued for on this cluster. */
  gpuType: GpuType,
  replicas: z.int().positive(),
  submittedAt: z.iso.datetime(),
});
export type DeploymentRequest = z.infer<typeof DeploymentRequest>;

export const TerminationRequest = z.object({
  kind: z.literal("terminate"),
  requestId: RequestId,
  name: Dns1123Label,
  namespace: Dns1123Label,
  requestedAt: z.iso.datetime(),
});
export type TerminationRequest = z.infer<typeof TerminationRequest>;

export const MessageBody = z.discriminatedUnion("kind", [DeploymentRequest, TerminationRequest]);
export type MessageBody = z.infer<typeof MessageBody>;

export const QueueMessage = z.object({
  /** Stable across redeliveries: de-duplicate by this. */
  messageId: z.string(),
  /** Changes on every delivery; only the latest one acknowledges or releases. */
  receiptHandle: z.string(),
  receiveCount: z.int().positive(),
  body: MessageBody,
});
export type QueueMessage = z.infer<typeof QueueMessage>;

export const ReceiveRequest = z.object({
  queue: QueueName,
  /** Deploy queue only: receive just these GPU types (those the agent has capacity for). */
  gpuTypes: z.array(GpuType).max(64).optional(),
  maxMessages: z.int().min(1).max(10).default(1),
  /** Long poll: wait up to this long for a message; returns as soon as one is available. */
  waitSeconds: z.int().min(0).max(20).default(0),
  /** How long received messages stay invisible; the server's default when absent. */
  visibilityTimeoutSeconds: z.int().min(0).max(43_200).optional(),
});
export type ReceiveRequest = z.input<typeof ReceiveRequest>;

export const ReceiveResponse = z.object({ messages: z.array(QueueMessage) });
export type ReceiveResponse = z.infer<typeof ReceiveResponse>;

export const AckRequest = z.object({ receiptHandles: z.array(z.string().min(1).max(256)).min(1).max(100) });
export type AckRequest = z.infer<typeof AckRequest>;

export const AckResponse = z.object({
  acknowledged: z.array(z.string()),
  /** Handles that no longer name a delivery: already acknowledged, redelivered, or released. */
  failed: z.array(z.object({ receiptHandle: z.string(), reason: z.string() })),
});
export type AckResponse = z.infer<typeof AckResponse>;

export const ReleaseRequest = z.object({
  receiptHandle: z.string().min(1).max(256),
  /** Keep it invisible this much longer instead of releasing at once (default 0). */
  delaySeconds: z.int().min(0).max(43_200).default(0),
});
export type ReleaseRequest = z.input<typeof ReleaseRequest>;

export const ReleaseResponse = z.object({
  released: z.boolean(),
  reason: z.string().optional(),
});
export type ReleaseResponse = z.infer<typeof ReleaseResponse>;

export const StatusReport = z.object({
  phase: ReportedPhase,
  message: z.string().max(4096).optional(),
  instances: z.array(Instance).max(1000).default([]),
});
export type StatusReport = z.input<typeof StatusReport>;

// ---------------------------------------------------------------------------------------------
// Operator calls

export const SubmitRequest = z.object({
  name: Dns1123Label,
  namespace: Dns1123Label.default("default"),
  model: z.string().min(1).max(512),
  image: z
    .string()
    .min(1)
    .max(512)
    .regex(/^\S+$/, { message: "must be an image reference without whitespace" }),
  args: z.array(z.string().max(8192)).max(256).optional(),
  gpus: z.int().min(1).max(1024).default(1),
  gpuType: GpuType.optional(),
  replicas: z.int().min(1).max(1000).default(1),
});
export type SubmitRequest = z.input<typeof SubmitRequest>;

export const SubmitResponse = z.object({ id: RequestId, status: RequestStatus });
export type SubmitResponse = z.infer<typeof SubmitResponse>;

export const RequestView = z.object({
  id: RequestId,
  name: z.string(),
  namespace: z.string(),
  model: z.string(),
  image: z.string(),
  args: z.array(z.string()),
  gpus: z.int(),
  /** The GPU type asked for; null means any. */
  gpuType: GpuType.nullable(),
  replicas: z.int(),
  status: RequestStatus,
  message: z.string().nullable(),
  clusterId: ClusterId.nullable(),
  /** The GPU type the request was queued for. */
  assignedGpuType: GpuType.nullable(),
  instances: z.array(Instance),
  createdAt: z.iso.datetime(),
  updatedAt: z.iso.datetime(),
});
export type RequestView = z.infer<typeof RequestView>;

export const RequestList = z.object({ requests: z.array(RequestView) });
export type RequestList = z.infer<typeof RequestList>;

export const ClusterView = z.object({
  clusterId: ClusterId,
  name: z.string().nullable(),
  agentVersion: z.string().nullable(),
  inventory: z.array(InventoryItem.extend({ allocated: z.int().min(0) })),
  /** Total GPUs registered. */
  capacity: z.int().min(0),
  /** GPUs held by requests assigned here and not terminated. */
  allocated: z.int().min(0),
  schedulable: z.boolean(),
  ready: z.boolean(),
  paused: z.boolean(),
  instruction: Instruction,
  /** The namespaces its agent deploys into; null when it did not say. */
  namespaces: z.array(z.string()).nullable().default(null),
  registeredAt: z.iso.datetime(),
  lastHeartbeatAt: z.iso.datetime().nullable(),
  queueDepth: z.object({ deploy: z.int().min(0), termination: z.int().min(0) }),
});
export type ClusterView = z.infer<typeof ClusterView>;

export const ClusterList = z.object({ clusters: z.array(ClusterView) });
export type ClusterList = z.infer<typeof ClusterList>;

export const SetInstructionRequest = z.object({ instruction: Instruction });
export type SetInstructionRequest = z.infer<typeof SetInstructionRequest>;

export const HealthResponse = z.object({ status: z.literal("ok") });
