/**
 * Durations as operators write them in flags and env (the node agent's options, the server's
 * `cache delete --timeout`): shared by the roles, so no role imports another's configuration.
 */
import { z } from "zod";

/** Durations like "30s", "1500ms", "2m" or plain seconds, in milliseconds. */
export const durationMs = z.union([z.number(), z.string()]).transform((v, ctx) => {
  if (typeof v === "number") return Math.round(v * 1000);
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(v.trim());
  if (!m) {
    ctx.addIssue({ code: "custom", message: `not a duration: "${v}" (use e.g. 500ms, 30s, 2m)` });
    return z.NEVER;
  }
  return Math.round(
    Number(m[1]) * { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[(m[2] ?? "s") as "ms" | "s" | "m" | "h"],
  );
});
