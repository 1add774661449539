/**
 * What the property tests of admission share (test code only: nothing else imports it): how a
 * property is run, hostile text, and JSON no API server sends.
 *
 * Every property runs with a fixed seed and a bounded number of cases, so a suite stays a few
 * seconds long. WARMSTART_FUZZ_RUNS=N runs N cases per property, WARMSTART_FUZZ_SEED=S another
 * seed; a failure reports its seed and path (fast-check's replay), and the case count is printed.
 */
import type { TestContext } from "node:test";
import fc from "fast-check";

export const RUNS = Number(process.env.WARMSTART_FUZZ_RUNS) || undefined;
export const SEED = Number(process.env.WARMSTART_FUZZ_SEED) || 0x11_03;

/** Runs a property (its default number of cases unless WARMSTART_FUZZ_RUNS says) and reports the count. */
export async function holds<T>(
  t: TestContext,
  prop: fc.IProperty<T> | fc.IAsyncProperty<T>,
  defaultRuns: number,
): Promise<number> {
  const params = { seed: SEED, numRuns: RUNS ?? defaultRuns, includeErrorInReport: true };
  const details = prop.isAsync()
    ? await fc.check(prop as fc.IAsyncProperty<T>, params)
    : fc.check(prop as fc.IProperty<T>, params);
  if (details.failed) throw new Error(fc.defaultReportMessage(details) ?? "property failed");
  t.diagnostic(`${details.numRuns} cases (seed ${SEED})`);
  return details.numRuns;
}

/** Through JSON, as on the wire (fast-check may build objects without a prototype). */
export const wire = <T>(v: T): T => JSON.parse(JSON.stringify(v)) as T;

const FRAGMENTS = [
  ...["", " ", "\t", "\n", "\r\n", "'", '"', "\\", "\\\n", "$(", "${", ")", "}", "`", "#", "--", "-", "="],
  ...[";", "&&", "||", "|", "2>&1", "<<", "&", "$VAR", "$(A)", "$$", "\u0000", "\u202e", "\ud800", "\udfff"],
  ...["\ufeff", "😀", "👩‍👩‍👧", "é", "e\u0301", "İ", "ß", "ﬁ", "\u3000", "\u00a0", "\u2028"],
];

/** Text: printable, full unicode (graphemes), lone surrogates, and shell-meaningful fragments. */
export const text = fc.oneof(
  { weight: 3, arbitrary: fc.string({ maxLength: 12 }) },
  { weight: 1, arbitrary: fc.string({ unit: "grapheme", maxLength: 6 }) },
  { weight: 1, arbitrary: fc.string({ unit: "binary", maxLength: 6 }) },
  { weight: 2, arbitrary: fc.constantFrom(...FRAGMENTS) },
  { weight: 1, arbitrary: fc.array(fc.constantFrom(...FRAGMENTS), { maxLength: 8 }).map((a) => a.join("")) },
);

/** JSON values no API server sends: wrong types, and keys that are Object.prototype's names. */
export const junk: fc.Arbitrary<unknown> = fc.oneof(
  fc.jsonValue({ maxDepth: 2 }),
  fc.constantFrom<unknown>(null, 0, 5, -1, true, "", "x", [], {}, [null], [5], [{}], [[]]),
  fc
    .constantFrom(
      '{"toString":1}',
      '{"valueOf":{},"toString":{}}',
      '{"__proto__":{"polluted":1}}',
      '{"constructor":{"prototype":{"x":1}}}',
      '[{"toString":null}]',
      '[{"valueOf":{}}]',
      '{"name":{"toString":1}}',
    )
    .map((s) => JSON.parse(s) as unknown),
);

/** Replaces values at random paths of a JSON tree with junk (a copy; the input is kept). */
export function corrupt(value: unknown, hits: ReadonlyArray<{ path: number[]; with: unknown }>): unknown {
  const root: Record<string, unknown> = { v: structuredClone(value) };
  for (const hit of hits) {
    let holder: Record<string | number, unknown> = root;
    let key: string | number = "v";
    for (const step of hit.path) {
      const cur: unknown = holder[key];
      if (cur === null || typeof cur !== "object") break;
      const keys: Array<string | number> = Array.isArray(cur) ? cur.map((_, i) => i) : Object.keys(cur);
      if (keys.length === 0) break;
      holder = cur as Record<string | number, unknown>;
      key = keys[step % keys.length]!;
    }
    // An own property even for `__proto__`, and a copy: the junk values are shared between cases.
    Object.defineProperty(holder, key, {
      value: JSON.parse(JSON.stringify(hit.with)) as unknown,
      enumerable: true,
      writable: true,
      configurable: true,
    });
  }
  return root.v;
}
