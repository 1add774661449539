/**
 * The control plane's SQLite file: opened owner-only, in WAL mode, migrated to the current schema,
 * and written one transaction at a time. Queue notifications collected during a transaction go
 * out only after it commits, so a woken long poll always finds what woke it.
 */
import Database from "better-sqlite3";
import { chmodSync, closeSync, existsSync, mkdirSync, openSync, statSync } from "node:fs";
import { dirname } from "node:path";
import type { QueueName } from "./api.js";
import { SCHEMA, SCHEMA_VERSION } from "./store-schema.js";

export interface StoreOptions {
  path: string;
  /** Told when the database file had to be made owner-only. */
  onWarning?: (msg: string, detail: Record<string, unknown>) => void;
  now?: () => number;
  /** Called after a transaction commits that made messages visible on this cluster's queue. */
  onMessages?: (clusterId: string, queue: QueueName) => void;
}

export class StoreDatabase {
  private readonly db: Database.Database;
  readonly now: () => number;
  private readonly onMessages: (clusterId: string, queue: QueueName) => void;
  private readonly notify = new Set<string>();
  private depth = 0;

  constructor(opts: StoreOptions) {
    this.now = opts.now ?? Date.now;
    this.onMessages = opts.onMessages ?? ((): void => undefined);
    preparePrivateFile(opts.path, opts.onWarning ?? ((): void => undefined));
    this.db = new Database(opts.path);
    try {
      this.db.pragma("journal_mode = WAL");
      // WAL with synchronous=FULL: an acknowledged call survives power loss, not only a crash.
      this.db.pragma("synchronous = FULL");
      this.db.pragma("foreign_keys = ON");
      this.db.pragma("busy_timeout = 5000");
      this.db.exec(SCHEMA);
      const row = this.db.prepare("SELECT value FROM meta WHERE key = 'schema'").get() as
        { value: string } | undefined;
      if (!row) {
        this.db.prepare("INSERT INTO meta (key, value) VALUES ('schema', ?)").run(String(SCHEMA_VERSION));
      } else if (Number(row.value) > SCHEMA_VERSION) {
        throw new Error(
          `database schema ${row.value} is newer than this control plane understands (${SCHEMA_VERSION})`,
        );
      } else if (Number(row.value) < SCHEMA_VERSION) {
        this.db.transaction(() => {
          if (Number(row.value) < 2) this.db.exec("ALTER TABLE clusters ADD COLUMN namespaces TEXT");
          this.db.prepare("UPDATE meta SET value = ? WHERE key = 'schema'").run(String(SCHEMA_VERSION));
        })();
      }
    } catch (err) {
      this.db.close();
      throw new Error(`cannot open control plane database ${opts.path}: ${(err as Error).message}`, {
        cause: err,
      });
    }
  }

  close(): void {
    if (this.db.open) this.db.close();
  }

  /** One transaction; queue notifications go out only after it commits. */
  tx<T>(fn: () => T): T {
    this.depth++;
    try {
      const result = this.db.transaction(fn).immediate();
      if (this.depth === 1) this.flush();
      return result;
    } catch (err) {
      if (this.depth === 1) this.notify.clear();
      throw err;
    } finally {
      this.depth--;
    }
  }

  prepare(source: string): Database.Statement {
    return this.db.prepare(source);
  }

  /** Messages became visible on this cluster's queue: tell its waiters once the transaction commits. */
  notifyQueue(clusterId: string, queue: QueueName): void {
    this.notify.add(`${clusterId}\u0000${queue}`);
  }

  private flush(): void {
    const keys = [...this.notify];
    this.notify.clear();
    for (const k of keys) {
      const [clusterId, queue] = k.split("\u0000") as [string, QueueName];
      this.onMessages(clusterId, queue);
    }
  }
}

/**
 * The database file is owner-only: created 0600 (SQLite gives its -wal and -shm files the same
 * mode), in a folder created 0700. An existing file others can read is made owner-only, or
 * refused when that is not possible.
 */
function preparePrivateFile(
  path: string,
  warn: (msg: string, detail: Record<string, unknown>) => void,
): void {
  if (path === ":memory:") return;
  const dir = dirname(path);
  if (!existsSync(dir)) mkdirSync(dir, { recursive: true, mode: 0o700 });
  try {
    closeSync(openSync(path, "wx", 0o600));
    return;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
  }
  for (const file of [path, `${path}-wal`, `${path}-shm`, `${path}-journal`]) {
    let mode: number;
    try {
      mode = statSync(file).mode & 0o777;
    } catch {
      continue;
    }
    if ((mode & 0o077) === 0) continue;
    try {
      chmodSync(file, 0o600);
    } catch (err) {
      throw new Error(
        `control plane database ${file} is readable by other users (mode ${mode.toString(8)}) and cannot be made owner-only (${(err as Error).message}); chmod 600 it`,
        { cause: err },
      );
    }
    warn("database file was readable by other users; made it owner-only (0600)", {
      file,
      mode: mode.toString(8),
    });
  }
}
