/**
 * The agent's calls to the control plane: registration and renewal with the cluster token, and
 * every queue call with the installed queue credentials. A 401 on a queue call means those
 * credentials are gone, and registration must run again.
 */
import type { GpuInventory } from "./inventory.js";
import { ControlPlaneClient, ControlPlaneError } from "../control-plane/client.js";
import type { AgentConfig } from "./config.js";
import type { IssuedCredentials } from "./registration.js";

export interface ControlPlaneLinkOptions {
  cfg: Pick<
    AgentConfig,
    "controlPlaneUrl" | "clusterToken" | "clusterId" | "clusterName" | "workloadNamespace" | "namespaces"
  >;
  version: string;
  fetch: typeof fetch | undefined;
  /** The installed queue token, if valid now. */
  token: () => string | undefined;
  /** The control plane refused this queue token. */
  rejected: (token: string) => void;
}

export class ControlPlaneLink {
  private heartbeatMs = 30_000;
  private readonly fetchImpl: typeof fetch | undefined;

  constructor(private readonly o: ControlPlaneLinkOptions) {
    this.fetchImpl = o.fetch;
  }

  /** The heartbeat interval the control plane asked for at the last registration (30 s before one). */
  get serverHeartbeatMs(): number {
    return this.heartbeatMs;
  }

  client(token: string): ControlPlaneClient {
    return new ControlPlaneClient({
      baseUrl: this.o.cfg.controlPlaneUrl,
      token,
      ...(this.fetchImpl ? { fetch: this.fetchImpl } : {}),
    });
  }

  async register(capacity: GpuInventory["byType"], signal: AbortSignal): Promise<IssuedCredentials> {
    const r = await this.client(this.o.cfg.clusterToken).register(
      {
        clusterId: this.o.cfg.clusterId,
        ...(this.o.cfg.clusterName ? { name: this.o.cfg.clusterName } : {}),
        agentVersion: this.o.version,
        inventory: capacity,
        // With one workload namespace for every request, any request namespace will do.
        ...(this.o.cfg.workloadNamespace ? {} : { namespaces: this.o.cfg.namespaces }),
      },
      { signal },
    );
    this.heartbeatMs = r.heartbeatIntervalSeconds * 1000;
    return {
      token: r.credentials.token,
      expiresAt: Date.parse(r.credentials.expiresAt),
      renewBeforeMs: r.renewBeforeSeconds * 1000,
    };
  }

  async renew(token: string, signal: AbortSignal): Promise<IssuedCredentials> {
    const r = await this.client(token).renew(this.o.cfg.clusterId, { signal });
    return {
      token: r.credentials.token,
      expiresAt: Date.parse(r.credentials.expiresAt),
      renewBeforeMs: r.renewBeforeSeconds * 1000,
    };
  }

  /** A queue-credential call; a 401 means the credentials are gone and registration must run again. */
  async withQueueToken<T>(fn: (c: ControlPlaneClient) => Promise<T>): Promise<T> {
    const token = this.o.token();
    if (!token) throw new ControlPlaneError("no valid queue credentials", 401, { retryable: true });
    try {
      return await fn(this.client(token));
    } catch (err) {
      if (err instanceof ControlPlaneError && err.status === 401) this.o.rejected(token);
      throw err;
    }
  }
}
