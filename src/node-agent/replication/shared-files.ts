/**
 * The files a replication is filling, each opened once for the chunks of it in flight together
 * and closed with the last of them: at small chunk sizes a chunk's own open and close cost more
 * CPU than its write.
 */
import { open, type FileHandle } from "node:fs/promises";

export class SharedFiles {
  private readonly files = new Map<number, { fh: Promise<FileHandle>; users: number }>();

  /** The open file `key` (at `path`); every acquire is matched by one release. */
  async acquire(key: number, path: Buffer | string): Promise<FileHandle> {
    let entry = this.files.get(key);
    if (!entry) this.files.set(key, (entry = { fh: open(path, "r+"), users: 0 }));
    entry.users++;
    try {
      return await entry.fh;
    } catch (err) {
      // A failed open is not kept: the next chunk of the file tries again.
      await this.release(key).catch(() => undefined);
      throw err;
    }
  }

  /** Closes file `key` once no chunk in flight uses it. */
  async release(key: number): Promise<void> {
    const entry = this.files.get(key);
    if (!entry || --entry.users > 0) return;
    this.files.delete(key);
    await (await entry.fh).close();
  }

  get openCount(): number {
    return this.files.size;
  }
}
