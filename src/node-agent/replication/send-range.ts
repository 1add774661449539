/**
 * The body of one file answer of the peer server (server.ts): a byte range of an open file,
 * written to the response at the socket's pace.
 */
import type { FileHandle } from "node:fs/promises";
import type { ServerResponse } from "node:http";
import { chunkBuffers } from "./buffer-pool.js";

const SEND_BYTES = 1024 * 1024;

/**
 * Sends bytes `start` to `end` of `file` as the body of `res`, with positional reads into two
 * buffers used in turn, each read again into once its write has gone out, and then kept for the
 * next answer (buffer-pool.ts): a fresh buffer per read (a read stream's way) made most of a
 * sending server's garbage collection. Two buffers
 * keep one read ahead of the socket; the socket's pace is the only one. Rejects when the peer
 * goes away or a write fails.
 */
export async function sendRange(
  file: FileHandle,
  res: ServerResponse,
  start: number,
  end: number,
  sent: (n: number) => void,
): Promise<void> {
  const size = Math.min(SEND_BYTES, end - start + 1);
  const free: Buffer[] = [chunkBuffers.take(size), chunkBuffers.take(size)];
  let failure: Error | undefined;
  let wake: (() => void) | undefined;
  const settle = (): void => {
    const w = wake;
    wake = undefined;
    w?.();
  };
  const closed = (): void => {
    failure ??= new Error("the peer went away");
    settle();
  };
  res.on("close", closed);
  try {
    for (let pos = start; pos <= end;) {
      while (free.length === 0 && !failure) await new Promise<void>((resolve) => (wake = resolve));
      if (failure) throw failure;
      const buf = free.pop() as Buffer;
      const { bytesRead } = await file.read(buf, 0, Math.min(buf.length, end + 1 - pos), pos);
      if (bytesRead === 0) throw new Error("the file ended before its size");
      pos += bytesRead;
      sent(bytesRead);
      res.write(buf.subarray(0, bytesRead), (err) => {
        // A buffer goes back only once its bytes are out: a failed write's is never reused.
        if (err) failure ??= err;
        else free.push(buf);
        settle();
      });
    }
    if (failure) throw failure;
    // 'close' comes last whether the answer went out or the peer went away ('finish' never
    // comes after a failed write, and a write's callback may wake nothing here).
    await new Promise<void>((resolve, reject) => {
      res.once("close", () =>
        res.writableFinished ? resolve() : reject(failure ?? new Error("the peer went away")),
      );
      res.end();
    });
  } finally {
    res.off("close", closed);
    // Only buffers whose writes are done: one still out may be read yet.
    for (const b of free) chunkBuffers.give(b);
  }
}
