/**
 * Queue credentials: short-lived bearer tokens issued to a registered cluster. Only a token's hash
 * is stored; an expired one is kept a while so that its use is told "expired", not "unknown".
 */
import { createHash, randomBytes } from "node:crypto";
import type { StoreDatabase } from "./store-database.js";

export type TokenIdentity =
  | { kind: "queue"; clusterId: string; expiresAt: number }
  | { kind: "expired"; clusterId: string; expiresAt: number }
  | undefined;

/** How long an expired credential is kept, so its use is told "expired" rather than "unknown". */
const EXPIRED_CREDENTIAL_RETENTION_MS = 24 * 3600_000;

export function hashToken(token: string): string {
  return createHash("sha256").update(token).digest("hex");
}

export class QueueCredentials {
  constructor(private readonly db: StoreDatabase) {}

  /** Issues a credential and returns the token; only its hash is stored. */
  issue(clusterId: string, ttlSeconds: number): { token: string; expiresAt: number } {
    return this.db.tx(() => {
      const now = this.db.now();
      const token = `wsq_${randomBytes(32).toString("base64url")}`;
      const expiresAt = now + ttlSeconds * 1000;
      this.db
        .prepare(
          "INSERT INTO credentials (token_hash, cluster_id, issued_at, expires_at) VALUES (?, ?, ?, ?)",
        )
        .run(hashToken(token), clusterId, now, expiresAt);
      this.db
        .prepare("DELETE FROM credentials WHERE expires_at < ?")
        .run(now - EXPIRED_CREDENTIAL_RETENTION_MS);
      return { token, expiresAt };
    });
  }

  identify(token: string): TokenIdentity {
    const row = this.db
      .prepare("SELECT cluster_id, expires_at FROM credentials WHERE token_hash = ?")
      .get(hashToken(token)) as { cluster_id: string; expires_at: number } | undefined;
    if (!row) return undefined;
    const kind = row.expires_at > this.db.now() ? "queue" : "expired";
    return { kind, clusterId: row.cluster_id, expiresAt: row.expires_at };
  }
}
