/**
 * Label selectors in the kubectl syntax (`pool=a,zone in (x,y),!spot`), parsed once so the same
 * selector both filters the nodes the agent counts and steers workloads onto those nodes.
 */
export type Operator = "In" | "NotIn" | "Exists" | "DoesNotExist";

export interface Requirement {
  key: string;
  operator: Operator;
  values?: string[];
}

// A qualified name with an optional DNS prefix, as Kubernetes allows for label keys.
const KEY =
  /^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$/;
const VALUE = /^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$/;

/** Parse a selector; throws with the offending term on bad syntax. An empty string selects everything. */
export function parseSelector(selector: string): Requirement[] {
  const out: Requirement[] = [];
  for (const term of splitTerms(selector)) {
    const t = term.trim();
    if (t === "") throw new Error(`empty term in label selector "${selector}"`);
    let m: RegExpMatchArray | null;
    if ((m = t.match(/^(\S+)\s+(in|notin)\s*\(([^)]*)\)$/))) {
      const values = m[3]!
        .split(",")
        .map((v) => v.trim())
        .filter((v) => v !== "");
      if (values.length === 0) throw new Error(`"${t}": a set needs at least one value`);
      out.push({
        key: checkKey(m[1]!, t),
        operator: m[2] === "in" ? "In" : "NotIn",
        values: values.map((v) => checkValue(v, t)),
      });
    } else if ((m = t.match(/^([^=!\s]+)\s*(==|=|!=)\s*(\S*)$/))) {
      out.push({
        key: checkKey(m[1]!, t),
        operator: m[2] === "!=" ? "NotIn" : "In",
        values: [checkValue(m[3]!, t)],
      });
    } else if ((m = t.match(/^!\s*(\S+)$/))) {
      out.push({ key: checkKey(m[1]!, t), operator: "DoesNotExist" });
    } else if (KEY.test(t)) {
      out.push({ key: t, operator: "Exists" });
    } else {
      throw new Error(`cannot parse "${t}" in label selector "${selector}"`);
    }
  }
  return out;
}

/** Whether a set of labels satisfies every requirement. */
export function matches(reqs: readonly Requirement[], labels: Record<string, string> | undefined): boolean {
  const l = labels ?? {};
  return reqs.every((r) => {
    const has = Object.hasOwn(l, r.key);
    switch (r.operator) {
      case "Exists":
        return has;
      case "DoesNotExist":
        return !has;
      case "In":
        return has && (r.values ?? []).includes(l[r.key]!);
      case "NotIn":
        return !has || !(r.values ?? []).includes(l[r.key]!);
    }
  });
}

/** The selector back in the API server's syntax (for list and watch calls). */
export function formatSelector(reqs: readonly Requirement[]): string {
  return reqs
    .map((r) => {
      const vs = r.values ?? [];
      switch (r.operator) {
        case "Exists":
          return r.key;
        case "DoesNotExist":
          return `!${r.key}`;
        case "In":
          return vs.length === 1 ? `${r.key}=${vs[0]}` : `${r.key} in (${vs.join(",")})`;
        case "NotIn":
          return vs.length === 1 ? `${r.key}!=${vs[0]}` : `${r.key} notin (${vs.join(",")})`;
      }
    })
    .join(",");
}

// Commas separate terms except inside a set's parentheses.
function splitTerms(s: string): string[] {
  if (s.trim() === "") return [];
  const terms: string[] = [];
  let depth = 0;
  let cur = "";
  for (const ch of s) {
    if (ch === "(") depth++;
    if (ch === ")") depth--;
    if (depth < 0) throw new Error(`unbalanced ")" in label selector "${s}"`);
    if (ch === "," && depth === 0) {
      terms.push(cur);
      cur = "";
    } else cur += ch;
  }
  if (depth !== 0) throw new Error(`unbalanced "(" in label selector "${s}"`);
  terms.push(cur);
  return terms;
}

function checkKey(key: string, term: string): string {
  if (!KEY.test(key) || key.length > 317) throw new Error(`"${term}": "${key}" is not a valid label key`);
  return key;
}

function checkValue(value: string, term: string): string {
  if (!VALUE.test(value)) throw new Error(`"${term}": "${value}" is not a valid label value`);
  return value;
}
