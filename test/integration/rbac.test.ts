/**
 * Least privilege, checked against the code: the API calls each role's code can make are derived
 * from its source (test/rbac.ts) and compared with the RBAC the chart grants that role's
 * ServiceAccount. A rule the code needs and the chart lacks fails, and so does a rule the chart
 * grants and no call needs.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import type * as k8s from "@kubernetes/client-node";
import { parseAllDocuments } from "yaml";
import { ApiCallDeriver, type ApiCall, type RoleEntry } from "../rbac.js";
import { compareRbac, grants, renderChart, type Grant } from "../chart.js";
import { PACKAGE_ROOT } from "../../tools/localcluster/versions.js";

const ROLES: RoleEntry[] = [
  { role: "webhook", file: "src/webhook/cli.ts", command: "webhook" },
  { role: "server", file: "src/server/cli.ts", command: "server" },
  { role: "node-agent", file: "src/node-agent/cli.ts", command: "node-agent" },
  { role: "cluster-agent", file: "src/cluster-agent/cli.ts", command: "cluster-agent" },
  { role: "control-plane", file: "src/control-plane/cli.ts", command: "control-plane" },
];

/** The data-path steps run in the workload's own pod, as its ServiceAccount: they call no API. */
const INIT_STEPS: RoleEntry[] = ["wait-ready", "seed", "prewarm", "capture"].map((command) => ({
  role: command,
  file: "src/datapath/cli.ts",
  command,
}));

/** Calls the chart's configuration never makes, and why. Each must still match a derived call. */
const NOT_CONFIGURED: { role: string; match: (c: ApiCall) => boolean; why: string }[] = [
  {
    role: "webhook",
    match: (c) =>
      c.resource === "mutatingwebhookconfigurations" || c.resource === "validatingwebhookconfigurations",
    why: "self-registration runs only with --register-url; the chart renders the configurations",
  },
];

/**
 * Calls only the snapshot-clone backend makes: granted with snapshots.enabled (listing always is),
 * the tree volume's writer pod in the system namespace included.
 */
const snapshotOnly = (c: ApiCall): boolean =>
  (c.group === "snapshot.storage.k8s.io" && c.verb !== "list") ||
  (c.group === "" &&
    c.resource === "pods" &&
    c.scope === "system" &&
    ["get", "create", "delete"].includes(c.verb));

const SYSTEM = "warmstart-system";
const WORKLOADS = ["models-a", "models-b"];
const VALUES = {
  "clusterAgent.enabled": true,
  "clusterAgent.clusterId": "c1",
  "clusterAgent.namespaces": WORKLOADS,
  "controlPlane.enabled": true,
};

let derived: Map<string, ApiCall[]> | undefined;
/** The derivation type-checks the whole source once (seconds); every test shares it. */
function derive(): Map<string, ApiCall[]> {
  if (derived) return derived;
  const d = new ApiCallDeriver(PACKAGE_ROOT);
  derived = new Map([...ROLES, ...INIT_STEPS].map((e) => [e.role, d.derive(e)]));
  return derived;
}

const accountOf = (role: string): string => `warmstart-${role}`;

function expected(role: string, snapshots: boolean): ApiCall[] {
  const skip = NOT_CONFIGURED.filter((x) => x.role === role);
  return derive()
    .get(role)!
    .filter((c) => !skip.some((x) => x.match(c)) && (snapshots || !snapshotOnly(c)));
}

function problems(objects: k8s.KubernetesObject[], snapshots: boolean): string[] {
  const all = grants(objects);
  const out: string[] = [];
  for (const { role } of ROLES) {
    const mine = all.filter((g) => g.account === accountOf(role));
    for (const p of compareRbac(expected(role, snapshots), mine, { system: SYSTEM, workloads: WORKLOADS }))
      out.push(`${role}: ${p}`);
  }
  const hooks = ["uninstall-caches", "uninstall-agent"].map(accountOf);
  const known = new Set([...ROLES.map((r) => accountOf(r.role)), ...hooks]);
  for (const g of all) if (!known.has(g.account)) out.push(`a grant to an unknown account ${g.account}`);
  return out;
}

void test("every role's code is derived: each makes API calls, the control plane and the init steps none", () => {
  const d = derive();
  for (const role of ["webhook", "server", "node-agent", "cluster-agent"]) {
    assert.ok(d.get(role)!.length > 5, `${role}: calls derived`);
  }
  assert.deepEqual(d.get("control-plane"), [], "the control plane talks to no API server");
  for (const e of INIT_STEPS) assert.deepEqual(d.get(e.role), [], `${e.role} runs with no API access`);
  // Spot checks that the derivation sees what each role is known to do, where it does it.
  const has = (role: string, key: string): boolean =>
    d.get(role)!.some((c) => `${c.scope} ${c.group || "core"} ${c.resource} ${c.verb}` === key);
  assert.ok(has("webhook", "system coordination.k8s.io leases create"), "the webhook wins an election");
  assert.ok(has("server", "any core pods/eviction create"), "the server evicts followers");
  assert.ok(has("server", "cluster core pods watch"), "the server watches pods");
  assert.ok(
    has("node-agent", "cluster warmstart.dev modelcaches/status patch"),
    "the node agent moves phases",
  );
  assert.ok(has("cluster-agent", "workloads apps deployments patch"), "the agent applies workloads");
  assert.ok(has("cluster-agent", "system core secrets get"), "the agent reads its credentials");
  for (const x of NOT_CONFIGURED)
    assert.ok(d.get(x.role)!.some(x.match), `the exclusion "${x.why}" still matches a call`);
});

void test("the chart grants each role exactly what its code uses (snapshot rights off and on)", async () => {
  for (const snapshots of [false, true]) {
    const objects = await renderChart({ ...VALUES, "snapshots.enabled": snapshots });
    assert.deepEqual(problems(objects, snapshots), [], `snapshots.enabled=${snapshots}`);
  }
});

void test("the standalone manifest deploy/cluster-agent.yaml grants the cluster agent exactly what its code uses", async () => {
  const text = await readFile(join(PACKAGE_ROOT, "deploy/cluster-agent.yaml"), "utf8");
  const objects = parseAllDocuments(text).map((d) => d.toJSON() as k8s.KubernetesObject);
  const mine = grants(objects).filter((g) => g.account === accountOf("cluster-agent"));
  assert.ok(mine.length > 0, "the manifest grants the agent's ServiceAccount something");
  assert.deepEqual(
    compareRbac(expected("cluster-agent", false), mine, { system: SYSTEM, workloads: ["model-serving"] }),
    [],
  );
});

void test("the stamps policy exempts exactly the roles whose code updates pods", async () => {
  const updaters = ROLES.filter((r) =>
    derive()
      .get(r.role)!
      .some((c) => c.group === "" && c.resource === "pods" && (c.verb === "patch" || c.verb === "update")),
  ).map((r) => `system:serviceaccount:${SYSTEM}:${accountOf(r.role)}`);
  assert.deepEqual(updaters, [`system:serviceaccount:${SYSTEM}:warmstart-server`]);
  const policy: k8s.V1ValidatingAdmissionPolicy | undefined = (await renderChart(VALUES)).find(
    (o) => o.kind === "ValidatingAdmissionPolicy" && o.metadata?.name?.endsWith("-stamps"),
  );
  const exempt = policy?.spec?.matchConditions?.map((m) => /username != '([^']+)'/.exec(m.expression)?.[1]);
  assert.deepEqual(exempt, updaters);
});

void test("no wildcard anywhere, no Secret readable cluster-wide, Secrets only by name where read", async () => {
  const objects = await renderChart({ ...VALUES, "snapshots.enabled": true, "uninstall.deleteData": true });
  for (const o of objects.filter((x) => x.kind === "Role" || x.kind === "ClusterRole")) {
    for (const r of (o as k8s.V1Role).rules ?? []) {
      for (const v of [...(r.apiGroups ?? []), ...(r.resources ?? []), ...r.verbs])
        assert.ok(!v.includes("*"), `${o.kind}/${o.metadata?.name}: no wildcard (${v})`);
    }
  }
  const all = grants(objects);
  assert.deepEqual(
    all.filter((g) => g.resource === "secrets" && g.where === "cluster"),
    [],
    "no cluster-wide Secret rights",
  );
  for (const g of all.filter((x) => x.resource === "secrets" && x.verb !== "create"))
    assert.ok(g.names?.length, `${g.account} ${g.verb}s Secrets by name only`);
  // The uninstall hooks delete the data and nothing else: cache records, then the agent's.
  const hook = (role: string): string[] =>
    all
      .filter((g) => g.account === accountOf(role))
      .map(
        (g) =>
          `${g.where} ${g.group || "core"} ${g.resource} ${g.verb}${g.names ? ` ${g.names.join(",")}` : ""}`,
      )
      .sort();
  assert.deepEqual(hook("uninstall-caches"), [
    "cluster warmstart.dev modelcaches delete",
    "cluster warmstart.dev modelcaches list",
  ]);
  assert.deepEqual(hook("uninstall-agent"), [
    `${SYSTEM} core configmaps delete`,
    `${SYSTEM} core configmaps list`,
    `${SYSTEM} core pods list`,
    `${SYSTEM} core secrets delete warmstart-cluster-agent-credentials`,
  ]);
});

void test("the check fails when a rule is removed from the chart or one is added", async () => {
  const objects = await renderChart(VALUES);
  assert.deepEqual(problems(objects, false), []);
  const edit = (
    name: string,
    kind: string,
    change: (rules: k8s.V1PolicyRule[]) => k8s.V1PolicyRule[],
  ): k8s.KubernetesObject[] =>
    structuredClone(objects).map((o) => {
      if (o.kind !== kind || o.metadata?.name !== name) return o;
      const role = o as k8s.V1Role;
      return { ...role, rules: change(role.rules ?? []) } as k8s.KubernetesObject;
    });

  // Removed: the server may no longer evict followers.
  const removed = edit("warmstart-server", "ClusterRole", (rules) =>
    rules.filter((r) => !r.resources?.includes("pods/eviction")),
  );
  assert.match(problems(removed, false).join("\n"), /server: missing: any core pods\/eviction create/);

  // Added: the webhook could read every Secret.
  const added = edit("warmstart-webhook", "ClusterRole", (rules) => [
    ...rules,
    { apiGroups: [""], resources: ["secrets"], verbs: ["get"] },
  ]);
  assert.match(problems(added, false).join("\n"), /webhook: not needed: cluster core secrets get/);

  // Widened: a ConfigMap read by name given for every name, or in the whole cluster.
  const widened = edit("warmstart-node-agent", "Role", (rules) =>
    rules.map((r) => (r.resources?.includes("configmaps") ? { ...r, resourceNames: undefined } : r)),
  );
  assert.match(problems(widened, false).join("\n"), /node-agent: more than needed: .* configmaps get/);
  const clusterWide = edit("warmstart-server", "Role", () => []);
  const moved = clusterWide.map((o) =>
    o.kind === "ClusterRole" && o.metadata?.name === "warmstart-server"
      ? ({
          ...o,
          rules: [
            ...((o as k8s.V1ClusterRole).rules ?? []),
            {
              apiGroups: ["coordination.k8s.io"],
              resources: ["leases"],
              verbs: ["get", "list", "watch", "delete"],
            },
          ],
        } as k8s.KubernetesObject)
      : o,
  );
  const movedProblems = problems(moved, false).join("\n");
  assert.match(movedProblems, /server: not needed: cluster coordination.k8s.io leases delete/);

  // A missing Role in one of the cluster agent's workload namespaces.
  const oneLess = objects.filter(
    (o) => !((o.kind === "Role" || o.kind === "RoleBinding") && o.metadata?.namespace === WORKLOADS[1]),
  );
  assert.match(
    problems(oneLess, false).join("\n"),
    /cluster-agent: missing: workloads apps deployments patch in models-b/,
  );
});

const VERB_ORDER = ["get", "list", "watch", "create", "update", "patch", "delete"];

/** What each role may do, as a Markdown table: one cell per place, `resource: verbs` per rule. */
function rbacTable(all: Grant[]): string {
  const cell = (gs: Grant[]): string => {
    const by = new Map<string, Set<string>>();
    for (const g of gs) {
      const key = `${g.group ? `${g.group}/` : ""}${g.resource}${g.names ? ` (${g.names.join(", ")})` : ""}`;
      by.set(key, (by.get(key) ?? new Set()).add(g.verb));
    }
    return (
      [...by]
        .sort(([a], [b]) => a.localeCompare(b))
        .map(([k, v]) => `${k}: ${VERB_ORDER.filter((x) => v.has(x)).join(", ")}`)
        .join("; ") || "-"
    );
  };
  const lines = [
    "| role | cluster-wide | release namespace | workload namespaces |",
    "| --- | --- | --- | --- |",
  ];
  for (const { role } of ROLES) {
    const mine = all.filter((g) => g.account === accountOf(role));
    lines.push(
      `| ${role} | ${cell(mine.filter((g) => g.where === "cluster"))} | ${cell(mine.filter((g) => g.where === SYSTEM))} | ${cell(mine.filter((g) => g.where === WORKLOADS[0]))} |`,
    );
  }
  return lines.join("\n");
}

void test("the README's table of what each role may do is the chart's", async () => {
  const readme = await readFile(join(PACKAGE_ROOT, "README.md"), "utf8");
  const block = /<!-- rbac:begin -->\n([\s\S]*?)\n<!-- rbac:end -->/.exec(readme)?.[1] ?? "";
  const table = rbacTable(grants(await renderChart(VALUES)));
  // Cell by cell: the formatter pads the columns.
  const cells = (md: string): string[][] =>
    md
      .trim()
      .split("\n")
      .map((l) =>
        l
          .split("|")
          .slice(1, -1)
          .map((c) => c.trim().replace(/^-+$/, "---")),
      );
  assert.deepEqual(
    cells(block),
    cells(table),
    `README.md, between <!-- rbac:begin --> and <!-- rbac:end -->, should read:\n${table}\n`,
  );
});
