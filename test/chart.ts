/**
 * The Helm chart in tests: the cached `helm` (built from its Go module with the local cluster's
 * binaries), rendering with values, and the RBAC the rendered chart grants each role.
 */
import { execFile } from "node:child_process";
import { join } from "node:path";
import { promisify } from "node:util";
import * as k8s from "@kubernetes/client-node";
import { parseAllDocuments } from "yaml";
import { ensureBinaries } from "../tools/localcluster/build.js";
import { PACKAGE_ROOT } from "../tools/localcluster/versions.js";
import { callKey, type ApiCall, type Scope } from "./rbac.js";

const run = promisify(execFile);

export const CHART = join(PACKAGE_ROOT, "deploy/helm/warmstart");

let helmPath: Promise<string> | undefined;

/** The cached helm binary (built once, like the control plane, when missing). */
export function helm(): Promise<string> {
  helmPath ??= ensureBinaries((line) => process.stderr.write(`[helm] ${line}\n`)).then((b) => b.helm!);
  return helmPath;
}

/** Runs helm; a failure carries its output. */
export async function runHelm(
  args: string[],
  env: NodeJS.ProcessEnv = {},
): Promise<{ stdout: string; stderr: string }> {
  const bin = await helm();
  try {
    return await run(bin, args, { env: { ...process.env, ...env }, maxBuffer: 64 << 20 });
  } catch (err) {
    const e = err as { stdout?: string; stderr?: string; message: string };
    throw new Error(`helm ${args.join(" ")} failed: ${e.stderr || e.message}\n${e.stdout ?? ""}`, {
      cause: err,
    });
  }
}

/** `--set`-style values as helm flags (strings with --set-string, the rest with --set-json). */
export function valueFlags(values: Record<string, unknown>): string[] {
  return Object.entries(values).flatMap(([k, v]) =>
    typeof v === "string" ? ["--set-string", `${k}=${v}`] : ["--set-json", `${k}=${JSON.stringify(v)}`],
  );
}

/** `helm template` of the chart: every rendered object. */
export async function renderChart(
  values: Record<string, unknown> = {},
  opts: { release?: string; namespace?: string; extra?: string[] } = {},
): Promise<k8s.KubernetesObject[]> {
  const { stdout } = await runHelm([
    "template",
    opts.release ?? "warmstart",
    CHART,
    "--namespace",
    opts.namespace ?? "warmstart-system",
    ...valueFlags(values),
    ...(opts.extra ?? []),
  ]);
  return parseManifests(stdout);
}

export function parseManifests(text: string): k8s.KubernetesObject[] {
  const out: k8s.KubernetesObject[] = [];
  for (const doc of parseAllDocuments(text)) {
    if (doc.errors.length) throw new Error(`rendered YAML does not parse: ${doc.errors[0]!.message}`);
    const obj = doc.toJS() as k8s.KubernetesObject | null;
    if (obj?.kind) out.push(obj);
  }
  return out;
}

export const objectName = (o: k8s.KubernetesObject): string =>
  `${o.kind}/${o.metadata?.namespace ? `${o.metadata.namespace}/` : ""}${o.metadata?.name}`;

/** One granted permission: a verb on a resource, cluster-wide or in one namespace, maybe for some names only. */
export interface Grant {
  /** Who: the ServiceAccount's name. */
  account: string;
  /** `cluster` for a ClusterRole bound cluster-wide, else the namespace of the Role. */
  where: string;
  group: string;
  resource: string;
  verb: string;
  names?: string[];
  /** The role object it comes from. */
  from: string;
}

interface Rule {
  apiGroups?: string[];
  resources?: string[];
  verbs: string[];
  resourceNames?: string[];
}

/** Every permission the rendered chart grants, per ServiceAccount, expanded to one verb on one resource. */
export function grants(objects: k8s.KubernetesObject[]): Grant[] {
  const roles = new Map<string, { rules: Rule[]; from: string }>();
  for (const o of objects) {
    if (o.kind === "ClusterRole" || o.kind === "Role") {
      const key = `${o.kind}/${o.kind === "Role" ? `${o.metadata!.namespace}/` : ""}${o.metadata!.name}`;
      roles.set(key, { rules: (o as k8s.V1Role).rules ?? [], from: key });
    }
  }
  const out: Grant[] = [];
  for (const o of objects) {
    if (o.kind !== "ClusterRoleBinding" && o.kind !== "RoleBinding") continue;
    const b = o as k8s.V1RoleBinding;
    const ref = b.roleRef;
    const key = ref.kind === "Role" ? `Role/${b.metadata!.namespace}/${ref.name}` : `ClusterRole/${ref.name}`;
    const role = roles.get(key);
    if (!role) throw new Error(`${objectName(o)} refers to ${key}, which the chart does not render`);
    const where = o.kind === "ClusterRoleBinding" ? "cluster" : b.metadata!.namespace!;
    for (const s of b.subjects ?? []) {
      if (s.kind !== "ServiceAccount") throw new Error(`${objectName(o)} binds a ${s.kind}`);
      for (const r of role.rules)
        for (const group of r.apiGroups ?? [""])
          for (const resource of r.resources ?? [])
            for (const verb of r.verbs)
              out.push({
                account: s.name,
                where,
                group,
                resource,
                verb,
                ...(r.resourceNames?.length ? { names: [...r.resourceNames].sort() } : {}),
                from: role.from,
              });
    }
  }
  return out;
}

/**
 * What is wrong between the calls a role's code makes and what the chart grants its
 * ServiceAccount: each call must be granted where it lands (cluster-wide for cluster-scoped
 * resources and calls in any namespace, the release namespace for the system namespace, each
 * workload namespace for the cluster agent's), and each grant must be needed by some call there.
 * A grant for fewer names covers a call only for those names; a grant for every name where every
 * call names its object is more than needed.
 */
export function compareRbac(
  calls: ApiCall[],
  granted: Grant[],
  places: { system: string; workloads: string[] },
): string[] {
  const problems: string[] = [];
  const wheres = (scope: Scope): string[] =>
    scope === "cluster" || scope === "any"
      ? ["cluster"]
      : scope === "system"
        ? [places.system]
        : places.workloads;
  const matches = (g: Grant, c: ApiCall): boolean =>
    g.group === c.group && g.resource === c.resource && g.verb === c.verb;
  const namesCover = (g: Grant, c: ApiCall): boolean =>
    !g.names ||
    c.names === "configured" ||
    (Array.isArray(c.names) && c.names.every((n) => g.names!.includes(n)));
  for (const c of calls) {
    for (const where of wheres(c.scope)) {
      const ok = granted.some(
        (g) => matches(g, c) && namesCover(g, c) && (g.where === where || g.where === "cluster"),
      );
      if (!ok)
        problems.push(
          `missing: ${callKey(c)}${Array.isArray(c.names) ? ` (${c.names.join(", ")})` : ""} in ${where} (${c.sites.join(", ")})`,
        );
    }
  }
  const restrictable = new Set(["get", "update", "patch", "delete"]);
  for (const g of granted) {
    const users = calls.filter((c) => matches(g, c) && wheres(c.scope).includes(g.where));
    const describe = `${g.where} ${g.group || "core"} ${g.resource} ${g.verb}${g.names ? ` (${g.names.join(", ")})` : ""} from ${g.from}`;
    if (users.length === 0) {
      problems.push(`not needed: ${describe}`);
      continue;
    }
    if (g.names) {
      const used = new Set(users.flatMap((c) => (Array.isArray(c.names) ? c.names : [])));
      const configured = users.some((c) => c.names === "configured");
      for (const n of g.names)
        if (!used.has(n) && !configured) problems.push(`not needed: name ${n} in ${describe}`);
    } else if (restrictable.has(g.verb) && users.every((c) => Array.isArray(c.names))) {
      const names = [...new Set(users.flatMap((c) => c.names as string[]))].sort();
      problems.push(`more than needed: ${describe} (only ${names.join(", ")} are used)`);
    }
  }
  return problems;
}

/**
 * A copy of the chart's ValidatingAdmissionPolicy whose name ends in `suffix`, with its binding,
 * installed as `name` for one test and removed after it; `matchResources` narrows the binding
 * (other tests share the cluster). Returns every object the chart rendered.
 */
export async function installPolicyCopy(
  t: { after: (fn: () => Promise<void>) => void },
  admission: k8s.AdmissionregistrationV1Api,
  o: {
    suffix: string;
    name: string;
    namespace: string;
    matchResources?: k8s.V1MatchResources;
    /** The chart's account names replaced (`from` -> `to`) in the copy's expressions. */
    renameUser?: { from: string; to: string };
  },
): Promise<k8s.KubernetesObject[]> {
  const objs = await renderChart({}, { namespace: o.namespace });
  const policy = objs.find(
    (x) => x.kind === "ValidatingAdmissionPolicy" && x.metadata?.name?.endsWith(o.suffix),
  ) as k8s.V1ValidatingAdmissionPolicy;
  const shipped = objs.find(
    (x) => x.kind === "ValidatingAdmissionPolicyBinding" && x.metadata?.name === policy.metadata?.name,
  ) as k8s.V1ValidatingAdmissionPolicyBinding;
  const { name } = o;
  const body = o.renameUser
    ? (JSON.parse(JSON.stringify(policy).split(o.renameUser.from).join(o.renameUser.to)) as typeof policy)
    : policy;
  await admission.createValidatingAdmissionPolicy({ body: { ...body, metadata: { name } } });
  t.after(() => admission.deleteValidatingAdmissionPolicy({ name }).then(() => undefined));
  const spec = {
    ...shipped.spec,
    policyName: name,
    ...(o.matchResources ? { matchResources: o.matchResources } : {}),
  };
  await admission.createValidatingAdmissionPolicyBinding({ body: { ...shipped, metadata: { name }, spec } });
  t.after(() => admission.deleteValidatingAdmissionPolicyBinding({ name }).then(() => undefined));
  return objs;
}
