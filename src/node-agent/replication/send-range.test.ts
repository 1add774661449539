import assert from "node:assert/strict";
import { EventEmitter } from "node:events";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { open } from "node:fs/promises";
import type { ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test, type TestContext } from "node:test";
import { chunkBuffers } from "./buffer-pool.js";
import { sendRange } from "./send-range.js";

const MiB = 1024 * 1024;

/**
 * A response whose writes go out only when the test says, as through a socket pushing back: it
 * finishes, then closes, once ended with every write out; a write that fails never finishes it.
 */
class HeldResponse extends EventEmitter {
  readonly pending: ((err?: Error | null) => void)[] = [];
  writableFinished = false;
  private ended = false;
  write(_chunk: Buffer, cb: (err?: Error | null) => void): boolean {
    this.pending.push(cb);
    return false;
  }
  end(cb?: () => void): this {
    if (cb) this.once("finish", cb);
    this.ended = true;
    this.finishIfDone();
    return this;
  }
  /** The oldest held write goes out (or fails). */
  complete(err?: Error): void {
    this.pending.shift()?.(err ?? null);
    if (!err) this.finishIfDone();
  }
  private finishIfDone(): void {
    if (!this.ended || this.pending.length > 0 || this.writableFinished) return;
    setImmediate(() => {
      this.writableFinished = true;
      this.emit("finish");
      this.emit("close");
    });
  }
}

async function fileOf(t: TestContext, bytes: number): Promise<Parameters<typeof sendRange>[0]> {
  const dir = mkdtempSync(join(tmpdir(), "ws-send-range-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  writeFileSync(join(dir, "f"), Buffer.alloc(bytes, 7));
  const file = await open(join(dir, "f"), "r");
  t.after(() => file.close());
  return file;
}

async function until(what: string, check: () => boolean): Promise<void> {
  for (let i = 0; i < 400 && !check(); i++) await new Promise((r) => setTimeout(r, 5));
  assert.ok(check(), what);
}

void test("a peer that goes away while the last two writes of a range are out ends the send (nothing held for good)", async (t) => {
  const file = await fileOf(t, 2 * MiB);
  const res = new HeldResponse();
  let sent = 0;
  const outcome = sendRange(file, res as unknown as ServerResponse, 0, 2 * MiB - 1, (n) => (sent += n)).then(
    () => "resolved",
    (err: Error) => `rejected: ${err.message}`,
  );
  // Both buffers read and written: the send waits for its answer to end.
  await until("two writes out", () => res.pending.length === 2);
  assert.equal(sent, 2 * MiB);
  res.complete(); // the one before last goes out
  res.emit("close"); // then the peer goes away with the last one still held
  res.complete(new Error("write EPIPE"));
  const settled = await Promise.race([
    outcome,
    new Promise((r) => setTimeout(() => r("still waiting"), 2_000)),
  ]);
  assert.match(String(settled), /^rejected/);
});

void test("a range whose writes all go out ends when its answer has finished", async (t) => {
  const bytes = 3 * MiB + 5;
  const file = await fileOf(t, bytes);
  const res = new HeldResponse();
  const sending = sendRange(file, res as unknown as ServerResponse, 0, bytes - 1, () => undefined);
  for (let out = 0; out < 4; out++) {
    await until(`write ${out + 1} held`, () => res.pending.length > 0);
    res.complete();
  }
  await sending;
  assert.ok(res.writableFinished);
});

void test("a finished range's buffers serve the next one; a buffer whose write failed is never reused", async (t) => {
  const file = await fileOf(t, 2 * MiB);
  const written: Buffer[] = [];
  const sendOnce = async (fail: boolean): Promise<void> => {
    const res = new HeldResponse();
    const write = res.write.bind(res);
    res.write = (chunk, cb) => (written.push(chunk), write(chunk, cb));
    const sending = sendRange(file, res as unknown as ServerResponse, 0, 2 * MiB - 1, () => undefined);
    await until("two writes out", () => res.pending.length === 2);
    res.complete();
    if (fail) {
      res.complete(new Error("write EPIPE"));
      res.emit("close");
      await assert.rejects(sending);
    } else {
      res.complete();
      await sending;
    }
  };
  await sendOnce(false);
  const first = written.splice(0).map((b) => b.buffer);
  await sendOnce(false);
  const second = written.splice(0).map((b) => b.buffer);
  assert.deepEqual(new Set(second), new Set(first), "the second range read into the first one's buffers");
  await sendOnce(true);
  const failed = written.splice(0).map((b) => b.buffer)[1];
  await sendOnce(false);
  const after = written.splice(0).map((b) => b.buffer);
  assert.ok(!after.includes(failed as ArrayBufferLike), "the buffer of the failed write did not come back");
  assert.ok(chunkBuffers.kept <= 32 << 20);
});
