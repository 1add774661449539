/** A JSON object: not null and not an array (what a map must be before its keys are read). */
export const isRecord = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v);
