/**
 * Queue credentials: the one installed set, guarded so an older response can never replace a
 * newer one, and its copy in a Secret so a restarted agent resumes without registering first.
 */
import * as k8s from "@kubernetes/client-node";
import { z } from "zod";
import { InventoryItem } from "../control-plane/api.js";
import { apiError, isAlreadyExists, isConflict, isNotFound } from "../common/kube.js";

export interface InstalledCredentials {
  token: string;
  /** Epoch ms; the control plane refuses the token from then on. */
  expiresAt: number;
  renewBeforeMs: number;
  /**
   * Order in which the request that produced these was started (taken inside the gate). Only a
   * higher generation may replace the installed set.
   */
  generation: number;
  /** The capacity the control plane accepted when these were issued (empty: capacity zero). */
  capacity: InventoryItem[];
  /** Which control plane issued them: credentials from another one are never reused. */
  issuer: string;
  /** How long they were valid for when they arrived (renewal never waits past half of it). */
  lifetimeMs: number;
}

/** The guard against stale responses: a strictly newer request wins, nothing else does. */
export function isNewer(
  candidate: InstalledCredentials,
  installed: InstalledCredentials | undefined,
): boolean {
  return installed === undefined || candidate.generation > installed.generation;
}

const Persisted = z.object({
  token: z.string().min(1),
  expiresAt: z.coerce.number().int().positive(),
  renewBeforeMs: z.coerce.number().int().nonnegative(),
  generation: z.coerce.number().int().nonnegative(),
  capacity: z.string().transform((s, ctx) => {
    try {
      return z.array(InventoryItem).parse(JSON.parse(s));
    } catch {
      ctx.addIssue({ code: "custom", message: "capacity is not an inventory" });
      return z.NEVER;
    }
  }),
  issuer: z.string().min(1),
  /** Absent in Secrets written before it was kept: the time left is the best guess then. */
  lifetimeMs: z.coerce.number().int().nonnegative().optional(),
});

export const MANAGED_BY = "warmstart-cluster-agent";

/** The Secret that carries the installed credentials across restarts. */
export class SecretStore {
  constructor(
    private readonly core: k8s.CoreV1Api,
    readonly namespace: string,
    readonly name: string,
  ) {}

  /** The persisted credentials, or undefined when absent or unreadable (a broken copy is ignored). */
  async load(): Promise<InstalledCredentials | undefined> {
    let secret: k8s.V1Secret;
    try {
      secret = await this.core.readNamespacedSecret({ name: this.name, namespace: this.namespace });
    } catch (err) {
      if (isNotFound(err)) return undefined;
      throw apiError(`read Secret ${this.namespace}/${this.name}`, err);
    }
    const data = Object.fromEntries(
      Object.entries(secret.data ?? {}).map(([k, v]) => [k, Buffer.from(v, "base64").toString("utf8")]),
    );
    const parsed = Persisted.safeParse(data);
    if (!parsed.success) return undefined;
    const { lifetimeMs, ...rest } = parsed.data;
    return { ...rest, lifetimeMs: lifetimeMs ?? Math.max(0, rest.expiresAt - Date.now()) };
  }

  /**
   * Write `creds` unless the Secret already holds a newer generation (then the newer copy stays).
   * Optimistic concurrency on resourceVersion, so a concurrent writer is never silently overwritten.
   */
  async save(creds: InstalledCredentials): Promise<void> {
    const body: k8s.V1Secret = {
      apiVersion: "v1",
      kind: "Secret",
      type: "Opaque",
      metadata: {
        name: this.name,
        namespace: this.namespace,
        labels: { "app.kubernetes.io/managed-by": MANAGED_BY },
      },
      stringData: {
        token: creds.token,
        expiresAt: String(creds.expiresAt),
        renewBeforeMs: String(creds.renewBeforeMs),
        generation: String(creds.generation),
        capacity: JSON.stringify(creds.capacity),
        issuer: creds.issuer,
        lifetimeMs: String(creds.lifetimeMs),
      },
    };
    for (let attempt = 0; attempt < 5; attempt++) {
      let current: k8s.V1Secret | undefined;
      try {
        current = await this.core.readNamespacedSecret({ name: this.name, namespace: this.namespace });
      } catch (err) {
        if (!isNotFound(err)) throw apiError(`read Secret ${this.namespace}/${this.name}`, err);
      }
      try {
        if (!current) {
          await this.core.createNamespacedSecret({ namespace: this.namespace, body });
          return;
        }
        const stored = Number(Buffer.from(current.data?.generation ?? "", "base64").toString("utf8"));
        const sameIssuer =
          Buffer.from(current.data?.issuer ?? "", "base64").toString("utf8") === creds.issuer;
        if (sameIssuer && Number.isFinite(stored) && stored > creds.generation) return;
        await this.core.replaceNamespacedSecret({
          name: this.name,
          namespace: this.namespace,
          body: {
            ...body,
            data: {},
            metadata: { ...body.metadata, resourceVersion: current.metadata?.resourceVersion },
          },
        });
        return;
      } catch (err) {
        if (isAlreadyExists(err) || isConflict(err)) continue;
        throw apiError(`write Secret ${this.namespace}/${this.name}`, err);
      }
    }
    throw new Error(`write Secret ${this.namespace}/${this.name}: kept conflicting`);
  }
}
