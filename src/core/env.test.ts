import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { performance } from "node:perf_hooks";
import type { V1Container } from "@kubernetes/client-node";
import {
  EXPANSION_BUDGET_BYTES,
  expandKubeRefs,
  expandShellVars,
  expansionBudget,
  literalEnv,
  redactUrlCredentials,
} from "./env.js";

void describe("redactUrlCredentials", () => {
  void test("user and password, or a bare token, in a URL's user info", () => {
    assert.equal(
      redactUrlCredentials("https://user:tok3n@hub.local/org/m"),
      "https://<redacted>@hub.local/org/m",
    );
    assert.equal(
      redactUrlCredentials("https://hf_tok3n@hub.local/org/m"),
      "https://<redacted>@hub.local/org/m",
    );
    assert.equal(
      redactUrlCredentials("--model=s3://AKIA:secret@bucket/m"),
      "--model=s3://<redacted>@bucket/m",
    );
  });

  void test("credential query parameters of signed URLs", () => {
    assert.equal(
      redactUrlCredentials("https://b.s3.amazonaws.com/m.bin?X-Amz-Credential=AKIA&X-Amz-Signature=abc&x=1"),
      "https://b.s3.amazonaws.com/m.bin?X-Amz-Credential=<redacted>&X-Amz-Signature=<redacted>&x=1",
    );
    assert.equal(redactUrlCredentials("https://h/m?token=abc#f"), "https://h/m?token=<redacted>#f");
  });

  void test("plain URLs, paths and model names are left as they are; redaction is idempotent", () => {
    for (const v of ["https://hub.local/org/m", "org/model@v2", "/models/a", "meta-llama/Llama-3.1-8B"])
      assert.equal(redactUrlCredentials(v), v);
    const once = redactUrlCredentials("https://u:p@h/x?sig=1");
    assert.equal(redactUrlCredentials(once), once);
  });
});

void describe("$(VAR) expansion under attack", () => {
  /** A container of under 1 KB whose env entries each double the one before. */
  const doubling = (n: number): V1Container => ({
    name: "c",
    env: [
      { name: "A0", value: "xxxxxxxx" },
      ...Array.from({ length: n }, (_, i) => ({ name: `A${i + 1}`, value: `$(A${i})$(A${i})` })),
    ],
  });

  void test("a chain of self-doubling entries resolves fast and stays within the budget", () => {
    const c = doubling(40);
    assert.ok(JSON.stringify(c).length < 2_000);
    const t0 = performance.now();
    const env = literalEnv(c);
    const ms = performance.now() - t0;
    const total = [...env.values()].reduce((n, v) => n + v.length, 0);
    assert.ok(ms < 200, `${ms} ms`);
    assert.ok(total <= 2 * EXPANSION_BUDGET_BYTES + 40 * 20, `${total} bytes`);
    assert.equal(env.get("A3")?.length, 64, "entries within the budget resolve as the kubelet would");
    assert.match(env.get("A40")!, /^\$\(A39\)\$\(A39\)$/, "past it, a reference stays as written");
  });

  void test("the budget is shared by the container's args: many references to a large value stay bounded", () => {
    const env = literalEnv({
      name: "c",
      env: [{ name: "BIG", value: "y".repeat(64 * 1024) }],
    });
    const t0 = performance.now();
    let out = 0;
    for (let i = 0; i < 100_000; i++) out += expandKubeRefs("$(BIG)", env).length;
    assert.ok(performance.now() - t0 < 2_000);
    assert.ok(out <= EXPANSION_BUDGET_BYTES + 100_000 * 6, `${out} bytes`);
  });

  void test("`$VAR` and `${VAR}` draw from the same budget as `$(VAR)`: many references to a large value stay bounded", () => {
    const env = literalEnv({ name: "c", env: [{ name: "BIG", value: "y".repeat(64 * 1024) }] });
    const t0 = performance.now();
    let out = 0;
    for (let i = 0; i < 50_000; i++) out += expandShellVars("$BIG${BIG}", env).length;
    for (let i = 0; i < 50_000; i++) out += expandKubeRefs("$(BIG)", env).length;
    assert.ok(performance.now() - t0 < 2_000);
    assert.ok(out <= EXPANSION_BUDGET_BYTES + 50_000 * (10 + 6), `${out} bytes`);
    // Past the budget a reference stays as written, in either syntax.
    assert.equal(expandShellVars("$BIG/${BIG}", env), "$BIG/${BIG}");
    assert.equal(expandKubeRefs("$(BIG)", env), "$(BIG)");
  });

  void test("one word of many references is cut at the budget, never past Node's longest string", () => {
    const env = literalEnv({ name: "c", env: [{ name: "BIG", value: "y".repeat(50_000) }] });
    // 12 500 references: 625 MB unbounded, past Node's longest string (a RangeError).
    const word = "$BIG".repeat(12_500);
    const v = expandShellVars(word, env);
    assert.ok(v.length <= word.length + EXPANSION_BUDGET_BYTES, `${v.length} characters`);
    assert.ok(v.startsWith("y".repeat(50_000 * 20)), "references within the budget are expanded");
    assert.ok(v.endsWith("$BIG$BIG"), "those past it stay as written");
  });

  void test("one budget serves every container of one reading of a pod", () => {
    const budget = expansionBudget();
    const container = { name: "c", env: [{ name: "BIG", value: "y".repeat(300 * 1024) }] };
    const envs = Array.from({ length: 8 }, () => literalEnv(container, budget));
    let out = 0;
    for (const env of envs) out += expandShellVars("$BIG".repeat(8), env).length;
    // Unshared, eight containers would add 8 x 8 x 300 KiB.
    assert.ok(out <= EXPANSION_BUDGET_BYTES + 8 * 8 * 4, `${out} bytes`);
    assert.ok(budget.left >= 0 && budget.left < 300 * 1024);
  });

  void test("a shell reference to a value built by `$(VAR)` doublings stays within the one budget", () => {
    const env = literalEnv({
      name: "c",
      env: [
        { name: "A0", value: "x".repeat(1024) },
        ...Array.from({ length: 9 }, (_, i) => ({ name: `A${i + 1}`, value: `$(A${i})$(A${i})` })),
      ],
    });
    assert.equal(env.get("A9")?.length, 512 * 1024);
    // The doublings spent almost all of it: 800 references (400 MB unbounded) add nothing more.
    const v = expandShellVars("$A9".repeat(800), env);
    assert.ok(v.length <= 3 * 800 + EXPANSION_BUDGET_BYTES, `${v.length} characters`);
  });

  void test("ordinary references, escapes and unknown names are unchanged", () => {
    const env = literalEnv({
      name: "c",
      env: [
        { name: "MODEL", value: "org/m" },
        { name: "ARGS", value: "--model $(MODEL) --x $$(MODEL) $(NOPE)" },
      ],
    });
    assert.equal(env.get("ARGS"), "--model org/m --x $(MODEL) $(NOPE)");
    assert.equal(
      expandShellVars("$MODEL/${MODEL}:$NOPE ${NOPE} $$ $1", env),
      "org/m/org/m:$NOPE ${NOPE} $$ $1",
    );
  });
});

void test("a user name holding an @ is redacted up to the authority's last @", () => {
  assert.equal(
    redactUrlCredentials("https://me@corp.example:t0ken@hub.local/org/m?x=1"),
    "https://<redacted>@hub.local/org/m?x=1",
  );
  assert.equal(
    redactUrlCredentials("s3://bucket/path/with@sign gs://a@b/c"),
    "s3://bucket/path/with@sign gs://<redacted>@b/c",
    "an @ in a path is no user info",
  );
});
