import assert from "node:assert/strict";
import { test } from "node:test";
import { Command } from "commander";
import { z } from "zod";
import { ConfigError, boolOption, defineOptions, intOption } from "./options.js";
import { durationMs } from "./units.js";

const opts = defineOptions(
  "test-role",
  {
    warmupMs: {
      flag: "--warmup <duration>",
      env: "WARMSTART_WARMUP",
      default: "30s",
      doc: "warm-up",
      schema: durationMs,
    },
    port: { flag: "--port <n>", env: "T_PORT", default: 8080, doc: "port", schema: intOption(0, 65535) },
    name: { flag: "--name <name>", env: "T_NAME", doc: "a name", schema: z.string().min(1) },
    durable: { flag: "--no-durable", default: true, doc: "skip flushes", schema: boolOption },
    internal: { default: "x", doc: "program only", schema: z.string() },
  },
  (s) => s.refine((c) => c.name !== "forbidden", { path: ["name"], message: "is forbidden" }),
);

void test("flag over env over default", () => {
  assert.deepEqual(opts.load({ name: "n" }, {}), {
    warmupMs: 30_000,
    port: 8080,
    name: "n",
    durable: true,
    internal: "x",
  });
  const env = { WARMSTART_WARMUP: "10s", T_NAME: "from-env", T_PORT: "" };
  assert.equal(opts.load({}, env).warmupMs, 10_000);
  assert.equal(opts.load({}, env).port, 8080, "an empty variable is unset");
  assert.equal(opts.load({ warmupMs: "2s" }, env).warmupMs, 2000);
  assert.equal(opts.load({}, env).name, "from-env");
});

void test("every problem is reported at once, each by flag and variable", () => {
  assert.throws(
    () => opts.load({ port: "http" }, { WARMSTART_WARMUP: "3x" }),
    (err: unknown) => {
      assert.ok(err instanceof ConfigError);
      assert.equal(err.problems.length, 3, err.message);
      for (const s of [
        "invalid test-role configuration:",
        '--warmup (WARMSTART_WARMUP): not a duration: "3x"',
        "--port (T_PORT): expected a whole number",
        "--name (T_NAME): is required",
      ])
        assert.ok(err.message.includes(s), `missing ${s} in:\n${err.message}`);
      return true;
    },
  );
  assert.throws(() => opts.load({ name: "forbidden" }, {}), /--name \(T_NAME\): is forbidden/);
});

void test("commander options with help, and only the values the command line gave", async () => {
  const program = new Command().exitOverride();
  const cmd = program.command("run");
  let seen: Record<string, unknown> = {};
  opts.register(cmd).action(() => {
    seen = opts.fromCommand(cmd);
  });
  const help = cmd.helpInformation();
  assert.match(help, /--warmup <duration>\s+warm-up \(default: 30s; env WARMSTART_WARMUP\)/);
  assert.match(help, /--no-durable/);
  assert.doesNotMatch(help, /internal/);
  await program.parseAsync(["node", "x", "run", "--warmup", "5s", "--no-durable"]);
  assert.deepEqual(seen, { warmupMs: "5s", durable: false });
  await program.parseAsync(["node", "x", "run"]);
  assert.deepEqual(seen, {}, "commander's own defaults are not the command line's");
});
