import assert from "node:assert/strict";
import { Writable } from "node:stream";
import { test } from "node:test";
import { createLogger } from "./log.js";

function sink(): { lines: () => Record<string, unknown>[]; stream: Writable } {
  const chunks: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb): void {
      chunks.push(chunk.toString());
      cb();
    },
  });
  return {
    stream,
    lines: () =>
      chunks
        .join("")
        .split("\n")
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Record<string, unknown>),
  };
}

void test("on a terminal without pino-pretty the logger writes JSON instead of throwing", () => {
  const out = sink();
  const log = createLogger("t", {
    tty: true,
    prettyAvailable: () => false,
    destination: out.stream,
    env: {},
  });
  log.info({ a: 1 }, "hello");
  const [line] = out.lines();
  assert.equal(line!.msg, "hello");
  assert.equal(line!.a, 1);
  assert.equal(line!.name, "t");
});

void test("not on a terminal, JSON whether or not pino-pretty is there", () => {
  const out = sink();
  let asked = false;
  const log = createLogger("t", {
    tty: false,
    prettyAvailable: () => (asked = true),
    destination: out.stream,
    env: {},
  });
  log.info("x");
  assert.equal(out.lines().length, 1);
  assert.equal(asked, false, "pino-pretty is looked for on a terminal only");
});

void test("an error under err keeps its type, stack and cause", () => {
  const out = sink();
  const log = createLogger("t", { tty: false, destination: out.stream, env: {} });
  const cause = new Error("socket hang up");
  log.error({ err: new TypeError("promote failed", { cause }) }, "failed");
  const err = out.lines()[0]!.err as { type: string; message: string; stack: string };
  assert.equal(err.type, "TypeError");
  assert.match(err.message, /promote failed/);
  assert.match(err.stack, /promote failed[\s\S]*log\.test/);
  assert.match(err.stack, /socket hang up/, "the cause's stack comes along");
});

void test("secrets are redacted and the level comes from the options, then LOG_LEVEL", () => {
  const out = sink();
  const log = createLogger("t", { tty: false, destination: out.stream, env: { LOG_LEVEL: "warn" } });
  log.info("dropped");
  log.warn({ token: "s3cr3t", req: { authorization: "Bearer x" } }, "kept");
  const lines = out.lines();
  assert.equal(lines.length, 1);
  assert.equal(lines[0]!.token, "[redacted]");
  assert.deepEqual(lines[0]!.req, { authorization: "[redacted]" });
});
