/** The stamps on an engine's log lines: the kubelet's CRI prefix, kubectl's, and each engine's own. */

// A CRI log line (the kubelet's file): "<RFC 3339 nano> stdout|stderr F|P <text>"; also the
// `kubectl logs --timestamps` form, "<RFC 3339> <text>".
const RFC3339 = String.raw`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?(?:Z|[+-]\d\d:\d\d)`;
export const CRI = new RegExp(`^(${RFC3339}) (?:stdout|stderr) ([FP]) `);
// Not TGI's own stamp: that one is followed by its level, right-aligned in five ("  INFO", " ERROR").
export const KUBECTL_TIMESTAMP = new RegExp(`^(${RFC3339}) (?! |ERROR |DEBUG |TRACE )`);
export const ANSI = /\x1b\[[0-9;]{0,20}m/g;
const TGI_TIME = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?Z) /;
const TGI_JSON_TIME = /"timestamp": ?"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,9})?Z)"/;
const SGLANG_TIME = /^\[(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?: ([^\]]{1,40}))?\]/;
const VLLM_PROCESS = /^\(([^()]{1,80})\) /;
const TGI_RANK = /\brank"?[=:] ?(\d{1,5})\b/;
const VLLM_TIME =
  /(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:[.,](\d{1,6}))? \[/;

/** Parses an RFC 3339 time (nanoseconds cut to milliseconds), NaN when it is not one. */
export function rfc3339(s: string): number {
  return Date.parse(s.replace(/(\.\d{3})\d{1,6}/, "$1"));
}

/**
 * Which process wrote a line: vLLM's "(Worker_TP0 pid=57) " tag, SGLang's "TP0" in its stamp,
 * TGI's "rank=0" field ("" when the line names none).
 */
export function rankOf(line: string): string {
  if (line.startsWith("(")) return VLLM_PROCESS.exec(line)?.[1] ?? "";
  if (line.startsWith("[")) return SGLANG_TIME.exec(line)?.[7] ?? "";
  return TGI_RANK.exec(line)?.[1] ?? "";
}

/** The engine's own timestamp on a line: TGI's (text or JSON), SGLang's, or vLLM's (no year). */
export function ownTime(line: string): { ms: number; zone: boolean; vllm: boolean } | undefined {
  const tgi = TGI_TIME.exec(line) ?? (line.startsWith("{") ? TGI_JSON_TIME.exec(line) : null);
  if (tgi) {
    const t = rfc3339(tgi[1]!);
    return Number.isNaN(t) ? undefined : { ms: t, zone: true, vllm: false };
  }
  const sg = SGLANG_TIME.exec(line);
  if (sg) {
    const [y, mo, d, h, mi, s] = sg.slice(1, 7).map(Number) as [
      number,
      number,
      number,
      number,
      number,
      number,
    ];
    return { ms: Date.UTC(y, mo - 1, d, h, mi, s), zone: false, vllm: false };
  }
  if (!line.includes(" [")) return undefined;
  const v = VLLM_TIME.exec(line);
  if (!v) return undefined;
  const [mo, d, h, mi, s] = v.slice(1, 6).map(Number) as [number, number, number, number, number];
  const frac = v[6] ? Number(`0.${v[6]}`) * 1000 : 0;
  // A leap year, so that 02-29 exists.
  return { ms: Date.UTC(2000, mo - 1, d, h, mi, s) + frac, zone: false, vllm: true };
}
