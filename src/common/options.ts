/**
 * A role's options as one table: per option its flag, its environment variable, its default and
 * its help, and a zod schema. From the table a role gets its commander options (with help that
 * names the variable and the default) and its config: flag over env over default, validated once
 * at start, with every problem reported together by flag and variable.
 */
import { Option, type Command } from "commander";
import { z } from "zod";

export type RawValue = string | number | boolean | readonly string[];

export interface OptionDef<S extends z.ZodType = z.ZodType> {
  /** Commander's flag, e.g. `--warmup <duration>`; none: set only by the program (tests, embedding). */
  flag?: string;
  /** The environment variable read when the flag is not given. */
  env?: string;
  /** The value as an operator would write it, parsed by `schema` like any other. */
  default?: RawValue;
  /** The default as shown in help, when it is not a plain value ("the control plane's"). */
  defaultText?: string;
  doc: string;
  schema: S;
  /** Left out of `--help`. */
  hidden?: boolean;
  /** Commander's argument parser for a repeatable flag (e.g. collect into an array). */
  argParser?: (value: string, previous: unknown) => unknown;
}

export type OptionTable = Record<string, OptionDef>;

/** The config an option table parses to (before any role-level transform). */
export type OptionsOutput<T extends OptionTable> = { [K in keyof T]: z.output<T[K]["schema"]> };

/** One line per problem: `--flag (VARIABLE): message`. */
export class ConfigError extends Error {
  constructor(
    readonly role: string,
    readonly problems: readonly string[],
  ) {
    super(`invalid ${role} configuration:\n${problems.map((p) => `  ${p}`).join("\n")}`);
    this.name = "ConfigError";
  }
}

/** `--warmup (WARMSTART_WARMUP)`, `--host`, `WARMSTART_X` or the key, whichever the option has. */
export function optionName(key: string, def: OptionDef | undefined): string {
  if (!def) return key || "config";
  const flag = def.flag?.split(/[ ,]+/).find((f) => f.startsWith("--"));
  if (flag && def.env) return `${flag} (${def.env})`;
  return flag ?? def.env ?? key;
}

function attributeName(def: OptionDef): string | undefined {
  return def.flag ? new Option(def.flag).attributeName() : undefined;
}

export interface RoleOptions<T extends OptionTable, Out> {
  readonly table: T;
  /** The object schema of the table, before `refine`. */
  readonly schema: z.ZodType<OptionsOutput<T>>;
  /** Adds the table's flags to a command, each with its help, variable and default. */
  register(cmd: Command): Command;
  /** Values the command line gave (not commander's defaults), keyed by the table's keys. */
  fromCommand(cmd: Command): Partial<Record<keyof T, unknown>>;
  /** Flag over env over default, validated once; throws a ConfigError naming every problem. */
  load(flags?: Partial<Record<keyof T, unknown>>, env?: NodeJS.ProcessEnv): Out;
}

/**
 * Builds a role's options from its table. `refine` adds checks across options and derived
 * values; an issue whose path starts with an option's key is reported under its flag.
 */
export function defineOptions<T extends OptionTable, Out = OptionsOutput<T>>(
  role: string,
  table: T,
  refine?: (schema: z.ZodType<OptionsOutput<T>>) => z.ZodType<Out, unknown>,
): RoleOptions<T, Out> {
  const shape = Object.fromEntries(Object.entries(table).map(([k, d]) => [k, d.schema]));
  const schema = z.object(shape) as unknown as z.ZodType<OptionsOutput<T>>;
  const full = (refine ? refine(schema) : schema) as z.ZodType<Out, unknown>;
  return {
    table,
    schema,
    register(cmd) {
      for (const def of Object.values(table)) {
        if (!def.flag) continue;
        const notes = [
          def.defaultText !== undefined
            ? `default: ${def.defaultText}`
            : def.default !== undefined
              ? `default: ${String(def.default)}`
              : undefined,
          def.env ? `env ${def.env}` : undefined,
        ].filter(Boolean);
        const opt = new Option(def.flag, notes.length ? `${def.doc} (${notes.join("; ")})` : def.doc);
        if (def.argParser) opt.argParser(def.argParser);
        if (def.hidden) opt.hideHelp();
        cmd.addOption(opt);
      }
      return cmd;
    },
    fromCommand(cmd) {
      const out: Partial<Record<keyof T, unknown>> = {};
      for (const [k, def] of Object.entries(table)) {
        const attr = attributeName(def);
        if (attr === undefined || cmd.getOptionValueSource(attr) !== "cli") continue;
        out[k as keyof T] = cmd.getOptionValue(attr) as unknown;
      }
      return out;
    },
    load(flags = {}, env = process.env) {
      const raw: Record<string, unknown> = {};
      for (const [k, def] of Object.entries(table)) {
        const fromEnv = def.env ? env[def.env] : undefined;
        const v = flags[k] ?? (fromEnv === "" ? undefined : fromEnv) ?? def.default;
        if (v !== undefined) raw[k] = v;
      }
      const parsed = full.safeParse(raw);
      if (parsed.success) return parsed.data;
      const problems = parsed.error.issues.map((i) => {
        const key = String(i.path[0] ?? "");
        const message = i.code === "invalid_type" && raw[key] === undefined ? "is required" : i.message;
        return `${optionName(key, table[key])}: ${message}`;
      });
      throw new ConfigError(role, problems);
    },
  };
}

/** Commander's parser for a repeatable flag: each use adds a value. */
export const collect = (value: string, previous: unknown): string[] => [
  ...(Array.isArray(previous) ? (previous as string[]) : []),
  value,
];

/** Booleans as flags and env write them: true/false, 1/0, yes/no, on/off, or a bare flag. */
export const boolOption = z.union([z.boolean(), z.string()]).transform((v, ctx) => {
  if (typeof v === "boolean") return v;
  const s = v.trim().toLowerCase();
  if (["1", "true", "yes", "on"].includes(s)) return true;
  if (["0", "false", "no", "off"].includes(s)) return false;
  ctx.addIssue({ code: "custom", message: `expected true or false, got "${v}"` });
  return z.NEVER;
});

/** A whole number in [min, max], from a flag's text or a number. */
export const intOption = (min: number, max: number): z.ZodType<number, string | number> =>
  z.union([z.number(), z.string()]).transform((v, ctx) => {
    const n = typeof v === "number" ? v : /^\s*-?\d+\s*$/.test(v) ? Number(v) : Number.NaN;
    if (!Number.isInteger(n)) {
      ctx.addIssue({ code: "custom", message: `expected a whole number, got "${v}"` });
      return z.NEVER;
    }
    if (n < min || n > max) {
      ctx.addIssue({ code: "custom", message: `expected a whole number from ${min} to ${max}, got ${n}` });
      return z.NEVER;
    }
    return n;
  });

/** A comma-separated list (or an array), trimmed, empty entries dropped. */
export const listOption = z
  .union([z.array(z.string()), z.string()])
  .transform((v) => (Array.isArray(v) ? v : v.split(",")).map((s) => s.trim()).filter(Boolean));
