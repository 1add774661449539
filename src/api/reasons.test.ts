import assert from "node:assert/strict";
import { join } from "node:path";
import { test } from "node:test";
import { fileURLToPath, pathToFileURL } from "node:url";
import { ESLint } from "eslint";
import { CACHE_PHASES, PHASE } from "./names.js";
import { NOT_LEADER, REASON } from "./reasons.js";

const ROOT = join(fileURLToPath(new URL(".", import.meta.url)), "../../..");

test("PHASE names every phase, each by itself", () => {
  assert.deepEqual(Object.values(PHASE), [...CACHE_PHASES]);
  for (const [k, v] of Object.entries({ ...PHASE, ...REASON })) assert.equal(k, v);
  assert.equal(new Set(Object.values(NOT_LEADER)).size, Object.values(NOT_LEADER).length);
});

test("the lint rule knows every phase and reason of the API", async () => {
  const config = (await import(pathToFileURL(join(ROOT, "eslint.config.js")).href)) as {
    CACHE_WORDS: string[];
  };
  assert.deepEqual(
    [...config.CACHE_WORDS].sort(),
    [...Object.values(PHASE), ...Object.values(REASON)].sort(),
  );
});

test("a phase or reason literal outside src/api/ fails the lint; through PHASE and REASON it passes", async () => {
  // The rule alone, on syntax only: no type-checked program to build.
  const eslint = new ESLint({
    cwd: ROOT,
    ruleFilter: ({ ruleId }) => ruleId === "no-restricted-syntax",
    overrideConfig: { languageOptions: { parserOptions: { projectService: false } } },
  });
  // The lines the rule flags (the text stands in for a file of that folder).
  const lint = async (code: string, filePath: string): Promise<number[]> =>
    (await eslint.lintText(code, { filePath: join(ROOT, filePath) }))
      .flatMap((r) => r.messages)
      .filter((m) => m.ruleId === "no-restricted-syntax")
      .map((m) => m.line);
  const literal = [
    'export const a = (s?: { phase?: string }): boolean => s?.phase === "Promoting";',
    'export const b = { reason: "CaptureFailed" };',
    'export type C = "Ready" | "other";',
  ].join("\n");
  assert.deepEqual(await lint(literal, "src/node-agent/leader.ts"), [1, 2, 3]);
  assert.deepEqual(await lint(literal, "src/webhook/election.ts"), [1, 2, 3]);
  assert.deepEqual(await lint(literal, "src/api/names.ts"), []);
  const named = [
    'import { PHASE } from "../api/names.js";',
    'import { REASON } from "../api/reasons.js";',
    "export const a = (s?: { phase?: string }): boolean => s?.phase === PHASE.Promoting;",
    "export const b = { reason: REASON.CaptureFailed };",
    // A Kubernetes condition's type is no phase.
    'export const d = (c: { type: string }): boolean => c.type === "Ready";',
  ].join("\n");
  assert.deepEqual(await lint(named, "src/node-agent/leader.ts"), []);
});
