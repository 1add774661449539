/** How two sets of hash inputs differ, input by input, for `warmstart explain`'s comparison. */
import type { ContainerInputs, HashInputs } from "./hash.js";
import { scopeOfInputs } from "./hash.js";
import { quoteShellWord } from "./shell.js";

export interface Difference {
  input: string;
  a: string | null;
  b: string | null;
}

/** The inputs that differ, named (`image`, `model`, `args[3]`, `env.HF_HOME`, ...), in input order. */
export function diffInputs(a: HashInputs, b: HashInputs): Difference[] {
  const out: Difference[] = [];
  const scalar = (input: string, x: string | null, y: string | null): void => {
    if (x !== y) out.push({ input, a: x, b: y });
  };
  scalar("v", String(a.v), String(b.v));
  scalar("scope", scopeOfInputs(a), scopeOfInputs(b));
  scalar("model", a.model, b.model);
  const gpus = (g: Record<string, string> | undefined): string | null =>
    g && Object.keys(g).length
      ? Object.keys(g)
          .sort()
          .map((k) => `${k}=${g[k]}`)
          .join(", ")
      : null;
  scalar("gpus", gpus(a.gpus), gpus(b.gpus));
  scalar("locations", a.locations?.join(", ") ?? null, b.locations?.join(", ") ?? null);
  out.push(...diffContainer("", a, b));
  const ca = a.containers ?? [];
  const cb = b.containers ?? [];
  for (let k = 0; k < Math.max(ca.length, cb.length); k++) {
    const x = ca[k];
    const y = cb[k];
    const prefix = `containers[${k}].`;
    if (!x || !y) {
      scalar(`containers[${k}]`, x ? `${x.kind} ${x.image}` : null, y ? `${y.kind} ${y.image}` : null);
      continue;
    }
    scalar(`${prefix}kind`, x.kind, y.kind);
    out.push(...diffContainer(prefix, x, y));
    scalar(`${prefix}mounts`, x.mounts.join(", ") || null, y.mounts.join(", ") || null);
  }
  return out;

  function diffContainer(prefix: string, x: ContainerInputs, y: ContainerInputs): Difference[] {
    const d: Difference[] = [];
    const sc = (input: string, p: string | null, q: string | null): void => {
      if (p !== q) d.push({ input: `${prefix}${input}`, a: p, b: q });
    };
    sc("image", x.image, y.image);
    d.push(...diffLists(`${prefix}argv`, x.argv, y.argv));
    const ea = new Map(x.env.map((e) => [e.name, envDisplay(e)]));
    const eb = new Map(y.env.map((e) => [e.name, envDisplay(e)]));
    for (const n of [...new Set([...ea.keys(), ...eb.keys()])].sort())
      sc(`env.${n}`, ea.get(n) ?? null, eb.get(n) ?? null);
    sc("envFrom", x.envFrom.join(", ") || null, y.envFrom.join(", ") || null);
    return d;
  }
}

/**
 * Lists are compared item by item when their lengths match (so one changed flag value shows as
 * `args[5]`), and as a whole otherwise.
 */
export function diffLists(name: string, a: readonly string[], b: readonly string[]): Difference[] {
  if (a.length !== b.length) return [{ input: name, a: joinList(a), b: joinList(b) }];
  const out: Difference[] = [];
  a.forEach((x, k) => {
    if (x !== b[k]) out.push({ input: `${name}[${k}]`, a: x, b: b[k] ?? null });
  });
  return out;
}

const joinList = (l: readonly string[]): string => l.map(quoteShellWord).join(" ");

function envDisplay(e: HashInputs["env"][number]): string {
  if (e.credential) return "<credential, counted by name>";
  if (e.from !== undefined) return `valueFrom ${e.from}`;
  return e.value ?? "";
}
