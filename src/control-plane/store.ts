/**
 * All control plane state in one SQLite file: clusters, credential hashes, requests and the
 * queues. Every state transition is one transaction, and queue visibility is stored as a point
 * in time, so a restart neither loses nor duplicates work: an unacknowledged message simply
 * becomes visible again when its visibility timeout runs out, restart or not.
 *
 * The Store is the one face of it; the parts behind it share one database and its transactions:
 * store-database.ts (the file, transactions, notifications), store-schema.ts (tables and rows),
 * store-clusters.ts, store-credentials.ts, store-requests.ts, store-scheduler.ts (placement) and
 * store-queues.ts.
 */
import type {
  AckResponse,
  ClusterView,
  Instance,
  Instruction,
  Inventory,
  QueueName,
  ReportedPhase,
  RequestStatus,
  RequestView,
} from "./api.js";
import { Clusters, type ClusterRegistration } from "./store-clusters.js";
import { QueueCredentials, type TokenIdentity } from "./store-credentials.js";
import { StoreDatabase, type StoreOptions } from "./store-database.js";
import { MessageQueues, type QueueDepth, type Received } from "./store-queues.js";
import { Requests, type NewRequest } from "./store-requests.js";
import { Scheduler } from "./store-scheduler.js";

export { hashToken, type TokenIdentity } from "./store-credentials.js";
export type { ClusterRegistration } from "./store-clusters.js";
export type { StoreOptions } from "./store-database.js";
export type { QueueDepth, Received } from "./store-queues.js";
export type { NewRequest } from "./store-requests.js";

export class Store {
  private readonly db: StoreDatabase;
  private readonly clusters: Clusters;
  private readonly credentials: QueueCredentials;
  private readonly requests: Requests;
  private readonly queues: MessageQueues;

  constructor(opts: StoreOptions) {
    this.db = new StoreDatabase(opts);
    this.queues = new MessageQueues(this.db);
    const scheduler = new Scheduler(this.db, this.queues);
    this.clusters = new Clusters(this.db, this.queues, scheduler);
    this.credentials = new QueueCredentials(this.db);
    this.requests = new Requests(this.db, this.queues, scheduler);
  }

  close(): void {
    this.db.close();
  }

  // --- clusters and credentials --------------------------------------------------------------

  register(input: ClusterRegistration): { created: boolean } {
    return this.clusters.register(input);
  }

  /**
   * A registration and the credential it returns, in one transaction: a crash between the two
   * would leave a cluster registered (and requests placed on it) that was never given credentials.
   */
  registerWithCredential(
    input: ClusterRegistration,
    ttlSeconds: number,
  ): { created: boolean; token: string; expiresAt: number } {
    return this.db.tx(() => ({
      ...this.clusters.register(input),
      ...this.credentials.issue(input.clusterId, ttlSeconds),
    }));
  }

  /** Issues a credential and returns the token; only its hash is stored. */
  issueCredential(clusterId: string, ttlSeconds: number): { token: string; expiresAt: number } {
    return this.credentials.issue(clusterId, ttlSeconds);
  }

  identifyCredential(token: string): TokenIdentity {
    return this.credentials.identify(token);
  }

  heartbeat(clusterId: string, hb: { inventory: Inventory; ready: boolean; paused: boolean }): Instruction {
    return this.clusters.heartbeat(clusterId, hb);
  }

  setInstruction(clusterId: string, instruction: Instruction): ClusterView {
    return this.clusters.setInstruction(clusterId, instruction);
  }

  hasCluster(id: string): boolean {
    return this.clusters.hasCluster(id);
  }

  listClusters(): ClusterView[] {
    return this.clusters.listClusters();
  }

  getCluster(id: string): ClusterView {
    return this.clusters.getCluster(id);
  }

  /** GPU types with a deploy queue: those registered with a count above zero. */
  deployQueues(clusterId: string): string[] {
    return this.clusters.deployQueues(clusterId);
  }

  // --- requests ------------------------------------------------------------------------------

  submit(input: NewRequest): RequestView {
    return this.requests.submit(input);
  }

  getRequest(id: string): RequestView {
    return this.requests.getRequest(id);
  }

  listRequests(status?: RequestStatus): RequestView[] {
    return this.requests.listRequests(status);
  }

  /** Withdraws the request's deploy message; the cluster that has it gets a termination message. */
  terminate(id: string): RequestView {
    return this.requests.terminate(id);
  }

  reportStatus(
    clusterId: string,
    requestId: string,
    report: { phase: ReportedPhase; message?: string | undefined; instances: Instance[] },
  ): RequestView {
    return this.requests.reportStatus(clusterId, requestId, report);
  }

  requestCounts(): { status: string; n: number }[] {
    return this.requests.requestCounts();
  }

  // --- queues --------------------------------------------------------------------------------

  receive(
    clusterId: string,
    queue: QueueName,
    opts: { gpuTypes?: string[] | undefined; maxMessages: number; visibilityTimeoutSeconds: number },
  ): Received {
    return this.queues.receive(clusterId, queue, opts);
  }

  ack(clusterId: string, receiptHandles: string[]): AckResponse {
    return this.queues.ack(clusterId, receiptHandles);
  }

  release(clusterId: string, receiptHandle: string, delaySeconds: number): boolean {
    return this.queues.release(clusterId, receiptHandle, delaySeconds);
  }

  queueDepths(): QueueDepth[] {
    return this.queues.queueDepths();
  }
}
