/**
 * The units operators write in flags and env, parsed one way for every role: durations ("250ms",
 * "30s", "5m", "1h", "1m30s", or a bare number of seconds) to milliseconds, and byte quantities
 * in the Kubernetes forms ("500Gi", "2T", "1.5Gi", or bare bytes) to bytes.
 */
import { z } from "zod";
import { quantityBytes } from "../core/size.js";

const DURATION_UNIT: Readonly<Record<string, number>> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/** Milliseconds of a duration; throws a readable error for anything else (and for negatives). */
export function parseDurationMs(input: string | number): number {
  if (typeof input === "number") {
    if (!Number.isFinite(input) || input < 0) throw new Error(`not a duration: ${input}`);
    return Math.round(input * 1000);
  }
  const s = input.trim();
  if (s === "") throw new Error("not a duration: empty (use e.g. 500ms, 30s, 5m, 1h)");
  if (/^\d+(\.\d+)?$/.test(s)) return Math.round(Number(s) * 1000);
  let total = 0;
  let rest = s;
  while (rest !== "") {
    const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)/.exec(rest);
    if (!m) throw new Error(`not a duration: "${input}" (use e.g. 500ms, 30s, 5m, 1h)`);
    total += Number(m[1]) * DURATION_UNIT[m[2]!]!;
    rest = rest.slice(m[0].length);
  }
  return Math.round(total);
}

const DECIMAL: Readonly<Record<string, number>> = { k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18 };
const BINARY: Readonly<Record<string, number>> = {
  Ki: 2 ** 10,
  Mi: 2 ** 20,
  Gi: 2 ** 30,
  Ti: 2 ** 40,
  Pi: 2 ** 50,
  Ei: 2 ** 60,
};
// A Kubernetes byte quantity, with an optional space before the suffix and "B" after it ("500 GiB").
const BYTES = /^(\d+(?:\.\d+)?|\.\d+)\s*(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?B?$/;

/** Bytes of a size ("500Gi", "2T", "1.5Gi", "0", plain bytes); throws a readable error otherwise. */
export function parseBytes(input: string | number): number {
  if (typeof input === "number") {
    if (!Number.isFinite(input) || input < 0) throw new Error(`not a size: ${input}`);
    return Math.round(input);
  }
  const m = BYTES.exec(input.trim());
  if (!m) throw new Error(`not a size: "${input}" (use e.g. 500Gi, 2T or bytes)`);
  const unit = m[2] === undefined ? 1 : (BINARY[m[2]] ?? DECIMAL[m[2]]!);
  return Math.round(Number(m[1]) * unit);
}

/** Bytes of a strict Kubernetes quantity above zero ("200Gi", "1Ti"), as a pod's sizeLimit takes it. */
export { quantityBytes };

const fromParser = (parse: (v: string | number) => number): z.ZodType<number, string | number> =>
  z.union([z.number(), z.string()]).transform((v, ctx) => {
    try {
      return parse(v);
    } catch (err) {
      ctx.addIssue({ code: "custom", message: (err as Error).message });
      return z.NEVER;
    }
  });

/** A duration option, in milliseconds. */
export const durationMs = fromParser(parseDurationMs);
/** A duration option, in seconds (fractions kept: "1500ms" is 1.5). */
export const durationSeconds = fromParser((v) => parseDurationMs(v) / 1000);
/** A byte-size option, in bytes. */
export const byteSize = fromParser(parseBytes);
/** A Kubernetes quantity option kept as written ("200Gi"), for fields that carry it to the API. */
export const kubeQuantity = z
  .string()
  .trim()
  .refine((q) => quantityBytes(q) !== undefined, { message: "not a size (use e.g. 200Gi, 1Ti)" });

/** A CPU quantity as Kubernetes writes one: cores (`1`, `0.5`) or millicores (`250m`), above zero. */
export const cpuQuantity = z
  .string()
  .trim()
  .refine((q) => /^(\d+(\.\d+)?|\.\d+)m?$/.test(q) && Number.parseFloat(q) > 0, {
    message: "not a CPU quantity (use e.g. 50m, 0.5, 2)",
  });
