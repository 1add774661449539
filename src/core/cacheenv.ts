/**
 * The cache-env template: which env the webhook points into a decorated pod's cache
 * root. Built in, or ConfigMap `warmstart-cache-env` in the system namespace, one data key per env
 * name whose value is a path under `{root}`:
 *
 *   HF_HOME: "{root}/model/huggingface"
 *   TRITON_CACHE_DIR: "{root}/cache/triton"
 *
 * The template never enters the cache hash (what the webhook injects is out), so changing it
 * splits no cache; a restore replays the template its leader had, recorded on the ModelCache.
 */
import { posix } from "node:path";
import { ENV_PREWARM, ENV_TREE } from "./contract.js";
import type { CacheEnvTemplate } from "./decorate.js";

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
// Never injected: offline mode slows compile on restore; our own names are not the template's.
const RESERVED = new Set(["HF_HUB_OFFLINE", ENV_PREWARM, ENV_TREE]);

export interface ParsedTemplate {
  template: CacheEnvTemplate;
  /** One line per bad entry; any error means the whole template is refused. */
  errors: string[];
}

/** Checks one entry: a plain env name, and a value that stays inside the cache root. */
export function templateEntryError(name: string, value: unknown): string | undefined {
  if (!ENV_NAME.test(name)) return `${name}: not an env name`;
  if (RESERVED.has(name) || name.startsWith("WARMSTART_")) return `${name}: reserved, never injected`;
  if (typeof value !== "string") return `${name}: value is not a string`;
  if (value !== "{root}" && !value.startsWith("{root}/"))
    return `${name}: "${value}" must be {root} or a path under {root}/`;
  const rest = value.slice("{root}".length);
  if (rest.includes("{root}")) return `${name}: {root} may appear only at the start`;
  const normal = posix.normalize(`/r${rest}`);
  if (normal !== "/r" && !normal.startsWith("/r/")) return `${name}: "${value}" leaves the cache root`;
  if (rest.split("/").includes("..")) return `${name}: "${value}" has a .. component`;
  return undefined;
}

/** Parses a ConfigMap's data into a template; entries are sorted by name for a stable order. */
export function parseCacheEnvTemplate(data: Readonly<Record<string, unknown>> | undefined): ParsedTemplate {
  const entries = Object.entries(data ?? {});
  if (!entries.length) return { template: [], errors: ["no entries: at least one env name is needed"] };
  const errors: string[] = [];
  const template: { name: string; value: string }[] = [];
  for (const [name, value] of entries) {
    const err = templateEntryError(name, value);
    if (err) errors.push(err);
    else template.push({ name, value: value as string });
  }
  template.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  return { template, errors };
}

/** A template recorded as JSON (`[{name, value}]`), e.g. on a ModelCache; undefined when it is not a valid one. */
export function templateFromJson(text: string | undefined): CacheEnvTemplate | undefined {
  if (!text) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (!Array.isArray(value) || !value.length) return undefined;
  const out: { name: string; value: string }[] = [];
  for (const e of value as unknown[]) {
    const { name, value: v } = (e ?? {}) as { name?: unknown; value?: unknown };
    if (typeof name !== "string" || templateEntryError(name, v)) return undefined;
    out.push({ name, value: v as string });
  }
  return out;
}
