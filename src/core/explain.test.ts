import { after, describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { stringify } from "yaml";
import { classifyPod } from "./classify.js";
import {
  compare,
  explain,
  floatingImage,
  perRunValue,
  subjectFromText,
  subjectsFromText,
  type Comparison,
  type Explanation,
} from "./explain.js";
import type { V1Pod } from "@kubernetes/client-node";
import { cacheHash, hashInputs, hashOfInputs, sealInputs } from "./hash.js";

const podYaml = (opts: { args?: string; env?: string; image?: string; gpu?: boolean } = {}): string => `
apiVersion: v1
kind: Pod
metadata:
  name: worker
spec:
  containers:
    - name: main
      image: ${opts.image ?? "vllm/vllm-openai:v0.9.0"}
      command: ["python3", "-m", "dynamo.vllm"]
      args: [${opts.args ?? '"--model", "Qwen/Qwen3-0.6B"'}]
      env:
${opts.env ?? "        - {name: A, value: '1'}"}
${opts.gpu === false ? "" : "      resources:\n        limits:\n          nvidia.com/gpu: 1"}
`;

const deploymentYaml = `
apiVersion: v1
kind: Service
metadata: {name: llama}
spec: {ports: [{port: 80}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: llama}
spec:
  replicas: 3
  template:
    metadata: {labels: {app: llama}}
    spec:
      containers:
        - name: frontend
          image: nginx:1.27
        - name: vllm
          image: vllm/vllm-openai:v0.9.0
          command: ["/bin/sh", "-c"]
          args: ["exec vllm serve meta-llama/Llama-3.1-8B-Instruct --tp 1"]
          resources: {requests: {nvidia.com/gpu: "1"}, limits: {nvidia.com/gpu: "1"}}
`;

const single = (text: string): Explanation => explain(subjectFromText(text, "test.yaml"));
const pair = (a: string, b: string): Comparison =>
  compare(subjectFromText(a, "a.yaml"), subjectFromText(b, "b.yaml"));

void describe("explain: one pod or workload", () => {
  void test("a Pod in YAML", () => {
    const out = single(podYaml());
    assert.equal(out.downloader, true);
    assert.equal(out.reason, "model from --model flag");
    assert.equal(out.model, "Qwen/Qwen3-0.6B");
    assert.equal(out.container, "main");
    assert.match(out.hash ?? "", /^[0-9a-f]{64}$/);
    assert.equal(out.short, out.hash?.slice(0, 16));
    assert.deepEqual(out.warnings, []);
  });

  void test("the same Pod in JSON gives the same hash as in YAML and as the webhook would compute", () => {
    const subject = subjectFromText(podYaml(), "p.yaml");
    assert.equal(subject.kind, "pod");
    if (subject.kind !== "pod") return;
    const json = JSON.stringify(subject.pod, null, 2);
    assert.equal(single(json).hash, single(podYaml()).hash);
    assert.equal(single(json).hash, cacheHash(subject.pod, classifyPod(subject.pod)).hash);
  });

  void test("a Deployment (multi-document YAML): the first workload's template, its GPU container", () => {
    const out = single(deploymentYaml);
    assert.equal(out.downloader, true);
    assert.equal(out.model, "meta-llama/Llama-3.1-8B-Instruct");
    assert.equal(out.reason, "model from vllm serve positional");
    assert.equal(out.container, "vllm");
  });

  void test("a Job, a CronJob, a StatefulSet, a List, as JSON", () => {
    const template = {
      spec: {
        containers: [
          { name: "w", image: "x:1", args: ["--model", "m"], resources: { limits: { "nvidia.com/gpu": 1 } } },
        ],
      },
    };
    const docs = [
      { apiVersion: "batch/v1", kind: "Job", metadata: { name: "j" }, spec: { template } },
      {
        apiVersion: "batch/v1",
        kind: "CronJob",
        spec: { schedule: "* * * * *", jobTemplate: { spec: { template } } },
      },
      { apiVersion: "apps/v1", kind: "StatefulSet", spec: { template } },
      {
        apiVersion: "v1",
        kind: "List",
        items: [{ kind: "ConfigMap" }, { apiVersion: "apps/v1", kind: "DaemonSet", spec: { template } }],
      },
    ];
    const hashes = docs.map((d) => single(JSON.stringify(d)));
    for (const h of hashes) assert.equal(h.model, "m");
    assert.equal(new Set(hashes.map((h) => h.hash)).size, 1);
  });

  void test("a pod left alone has no hash, and says why", () => {
    const out = single(podYaml({ gpu: false }));
    assert.deepEqual(
      { ...out },
      {
        name: "Pod worker",
        downloader: false,
        reason: "no GPU requested",
        model: null,
        scope: "cluster",
        hash: null,
        short: null,
        container: null,
        warnings: [],
      },
    );
  });

  void test("per-run inputs show up as warnings", () => {
    const out = single(
      podYaml({
        image: "vllm/vllm-openai:latest",
        args: '"--model", "m", "--override-generation-config", "run-2024-06-01T10:22:33"',
        env: "        - {name: POD_INDEX, value: '3'}\n        - {name: RUN_ID, value: 0f8e2c1a-4b5d-4e6f-8a9b-1c2d3e4f5a6b}",
      }),
    );
    assert.deepEqual(
      out.warnings.map((w) => [w.input, w.value]),
      [
        ["image", "vllm/vllm-openai:latest"],
        ["argv[6]", "run-2024-06-01T10:22:33"],
        ["env.POD_INDEX", "3"],
        ["env.RUN_ID", "0f8e2c1a-4b5d-4e6f-8a9b-1c2d3e4f5a6b"],
      ],
    );
  });
});

void test("the hash is the one the webhook stamps under its sharing scope, in the pod's namespace", () => {
  const subject = subjectFromText(
    deploymentYaml.replace(
      "metadata: {name: llama}\nspec:\n  replicas",
      "metadata: {name: llama, namespace: team-a}\nspec:\n  replicas",
    ),
    "d.yaml",
  );
  if (subject.kind !== "pod") throw new Error("a pod");
  assert.equal(subject.namespace, "team-a", "the workload's namespace");
  const webhook = (scope: string): string => cacheHash(subject.pod, classifyPod(subject.pod), { scope }).hash;
  const cluster = explain(subject);
  assert.deepEqual([cluster.scope, cluster.hash], ["cluster", webhook("cluster")]);
  const ns = explain(subject, { sharingScope: "namespace" });
  assert.deepEqual([ns.scope, ns.hash], ["namespace:team-a", webhook("namespace:team-a")]);
  assert.notEqual(ns.hash, cluster.hash);
  const other = explain(subject, { sharingScope: "namespace", namespace: "team-b" });
  assert.equal(other.hash, webhook("namespace:team-b"));
  const group = explain(subject, { sharingScope: "group", shareGroup: "ml" });
  assert.deepEqual([group.scope, group.hash], ["group:ml", webhook("group:ml")]);
  // A namespace without the label is its own group, as in the webhook.
  assert.equal(explain(subject, { sharingScope: "group" }).hash, ns.hash);
  const bare = subjectFromText(podYaml(), "p.yaml");
  assert.equal(explain(bare, { sharingScope: "namespace" }).scope, "namespace:default");
});

void describe("explain: comparing two", () => {
  void test("equal when only role flags and GROVE_/DYN_ env differ", () => {
    const a = podYaml({
      args: '"--model", "m", "--is-prefill-worker"',
      env: "        - {name: GROVE_PCSG_INDEX, value: '0'}\n        - {name: DYN_COMPONENT, value: prefill}",
    });
    const b = podYaml({ args: '"--model", "m"', env: "        - {name: GROVE_PCSG_INDEX, value: '1'}" });
    const out = pair(a, b);
    assert.equal(out.equal, true);
    assert.equal(out.a.hash, out.b.hash);
    assert.deepEqual(out.differences, []);
    assert.deepEqual(out.perRun, []);
  });

  void test("names each differing input, item by item", () => {
    const a = podYaml({
      args: '"--model", "m", "--revision", "r1"',
      env: "        - {name: HF_HOME, value: /a}\n        - {name: X, value: '1'}",
    });
    const b = podYaml({
      image: "vllm/vllm-openai:v0.9.1",
      args: '"--model", "m", "--revision", "r2"',
      env: "        - {name: HF_HOME, value: /b}\n        - {name: HF_TOKEN, value: hf_abcdefgh}",
    });
    const out = pair(a, b);
    assert.equal(out.equal, false);
    assert.notEqual(out.a.hash, out.b.hash);
    assert.deepEqual(out.differences, [
      { input: "locations", a: "model/at/a/hub=/a/hub", b: "model/at/b/hub=/b/hub" },
      { input: "image", a: "vllm/vllm-openai:v0.9.0", b: "vllm/vllm-openai:v0.9.1" },
      { input: "argv[6]", a: "r1", b: "r2" },
      { input: "env.HF_HOME", a: "/a", b: "/b" },
      { input: "env.HF_TOKEN", a: null, b: "<credential, counted by name>" },
      { input: "env.X", a: "1", b: null },
    ]);
    assert.ok(!JSON.stringify(out).includes("hf_abcdefgh"));
  });

  void test("lists of different length show as one difference; models are compared too", () => {
    const out = pair(podYaml({ args: '"--model", "a"' }), podYaml({ args: '"--model", "b", "--tp", "2"' }));
    assert.deepEqual(
      out.differences.map((d) => d.input),
      ["model", "argv"],
    );
    assert.deepEqual(out.differences[1], {
      input: "argv",
      a: "python3 -m dynamo.vllm --model a",
      b: "python3 -m dynamo.vllm --model b --tp 2",
    });
  });

  void test("flags per-run inputs and says which pod has them", () => {
    const a = podYaml({
      env: "        - {name: JOB_COMPLETION_INDEX, value: '0'}\n        - {name: STARTED, value: '1718000000'}",
    });
    const b = podYaml({
      image: "vllm/vllm-openai",
      env: "        - {name: JOB_COMPLETION_INDEX, value: '1'}\n        - {name: STARTED, value: '1718000000'}",
    });
    const out = pair(a, b);
    assert.equal(out.equal, false);
    assert.deepEqual(
      out.perRun.map((f) => [f.input, f.value, f.pod]),
      [
        ["env.JOB_COMPLETION_INDEX", "0", "a"],
        ["env.STARTED", "1718000000", "both"],
        ["image", "vllm/vllm-openai", "b"],
        ["env.JOB_COMPLETION_INDEX", "1", "b"],
      ],
    );
    assert.ok(out.perRun.every((f) => f.why.length > 0));
  });

  void test("a pod against a cache record's inputs", () => {
    const subject = subjectFromText(podYaml(), "p.yaml");
    assert.equal(subject.kind, "pod");
    if (subject.kind !== "pod") return;
    const { hash, inputs } = cacheHash(subject.pod, classifyPod(subject.pod));
    const record = JSON.stringify({
      apiVersion: "warmstart.dev/v1alpha1",
      kind: "ModelCache",
      spec: { hash, inputs },
    });
    const same = pair(podYaml(), record);
    assert.equal(same.equal, true);
    assert.equal(same.b.hash, hash);
    const other = pair(podYaml({ args: '"--model", "other"' }), record);
    assert.equal(other.equal, false);
    assert.deepEqual(other.differences[0], { input: "model", a: "other", b: "Qwen/Qwen3-0.6B" });
  });

  void test("a record of another sharing scope, and a container that touches the cache, are named", () => {
    const subject = subjectFromText(podYaml(), "p.yaml");
    if (subject.kind !== "pod") throw new Error("a pod");
    const scoped = cacheHash(subject.pod, classifyPod(subject.pod), { scope: "namespace:team-a" });
    const record = JSON.stringify({
      apiVersion: "warmstart.dev/v1alpha1",
      kind: "ModelCache",
      spec: { hash: scoped.hash, inputs: sealInputs(scoped.inputs) },
    });
    const c = pair(podYaml(), record);
    assert.equal(c.equal, false);
    assert.deepEqual(c.differences, [{ input: "scope", a: "cluster", b: "namespace:team-a" }]);

    const withInit = (image: string): string =>
      podYaml().replace(
        "  containers:",
        `  initContainers:\n    - {name: fetch, image: ${image}, env: [{name: HF_HOME, value: /c}]}\n  containers:`,
      );
    const d = pair(withInit("fetch:1"), withInit("fetch:2"));
    assert.equal(d.equal, false);
    assert.deepEqual(d.differences, [{ input: "containers[0].image", a: "fetch:1", b: "fetch:2" }]);
  });
});

void describe("explain: per-run heuristics", () => {
  void test("values", () => {
    assert.match(perRunValue("job-0f8e2c1a-4b5d-4e6f-8a9b-1c2d3e4f5a6b") ?? "", /UUID/);
    assert.match(perRunValue("2024-06-01 10:22") ?? "", /timestamp/);
    assert.match(perRunValue("out-20240601T102233") ?? "", /timestamp/);
    assert.match(perRunValue("1718000000123") ?? "", /Unix/);
    assert.match(perRunValue("run-3fa9c02b7d1e44") ?? "", /hex/);
    for (const fine of [
      "meta-llama/Llama-3.1-8B",
      "Mistral-Small-24B-Instruct-2501",
      "8000",
      "0.9",
      "deadbeef",
      "fp8",
    ]) {
      assert.equal(perRunValue(fine), undefined, fine);
    }
  });

  void test("image tags", () => {
    assert.ok(floatingImage("vllm/vllm-openai"));
    assert.ok(floatingImage("vllm/vllm-openai:latest"));
    assert.ok(floatingImage("localhost:5000/img:nightly"));
    assert.equal(floatingImage("localhost:5000/img"), floatingImage("img"));
    assert.equal(floatingImage("vllm/vllm-openai:v0.9.0"), undefined);
    assert.equal(floatingImage("vllm/vllm-openai@sha256:abcd"), undefined);
  });

  void test("a pinned --revision is not a random id", () => {
    const out = single(
      podYaml({ args: '"--model", "m", "--revision", "3fa9c02b7d1e44aa90c1e2f3a4b5c6d7e8f90123"' }),
    );
    assert.deepEqual(out.warnings, []);
  });
});

void describe("explain: bad input", () => {
  const bad: Array<[string, string, RegExp]> = [
    ["broken YAML", "kind: Pod\nspec: [\n  - a\n b", /invalid YAML or JSON/],
    ["empty", "  \n", /empty input/],
    [
      "not a workload",
      "apiVersion: v1\nkind: ConfigMap\ndata: {a: b}\n",
      /no Pod, workload or ModelCache found \(found ConfigMap\)/,
    ],
    ["a scalar", "hello", /no Pod, workload or ModelCache/],
    ["a Pod without containers", "kind: Pod\nspec: {containers: []}\n", /has no containers/],
    [
      "a Deployment without a template",
      "kind: Deployment\nmetadata: {name: d}\nspec: {replicas: 1}\n",
      /Deployment d has no pod template/,
    ],
    ["a ModelCache without inputs", '{"kind":"ModelCache","spec":{"hash":"x"}}', /records no hash inputs/],
  ];
  for (const [name, text, re] of bad) {
    void test(name, () => {
      assert.throws(
        () => single(text),
        (err: unknown) =>
          err instanceof Error &&
          re.test(err.message) &&
          !err.message.includes("\n") &&
          err.message.startsWith("test.yaml"),
      );
    });
  }
});

void describe("warmstart explain (the command)", () => {
  const root = fileURLToPath(new URL("../../../", import.meta.url));
  const bin = join(root, "bin/warmstart");
  const dir = mkdtempSync(join(tmpdir(), "warmstart-explain-"));
  after(() => rmSync(dir, { recursive: true, force: true }));
  const run = (...args: string[]): ReturnType<typeof spawnSync> =>
    spawnSync(process.execPath, [bin, "explain", ...args], {
      encoding: "utf8",
      env: { ...process.env, WARMSTART_DEBUG: "" },
    });

  void test("prints the JSON view of a Deployment file", () => {
    const file = join(dir, "deploy.yaml");
    writeFileSync(file, deploymentYaml);
    const r = run(file);
    assert.equal(r.status, 0, String(r.stderr));
    const out = JSON.parse(String(r.stdout)) as Explanation;
    assert.equal(out.downloader, true);
    assert.equal(out.model, "meta-llama/Llama-3.1-8B-Instruct");
    assert.equal(out.hash, single(deploymentYaml).hash);
  });

  void test("reads stdin for -", () => {
    const r = spawnSync(process.execPath, [bin, "explain", "-"], { encoding: "utf8", input: podYaml() });
    assert.equal(r.status, 0, String(r.stderr));
    assert.equal((JSON.parse(String(r.stdout)) as Explanation).hash, single(podYaml()).hash);
  });

  void test("compares two files", () => {
    const a = join(dir, "a.json");
    const b = join(dir, "b.yaml");
    writeFileSync(
      a,
      JSON.stringify(subjectPod(podYaml({ args: '"--model", "m", "--disaggregation-mode", "prefill"' }))),
    );
    writeFileSync(b, podYaml({ args: '"--model", "m", "--disaggregation-mode", "decode"' }));
    const r = run(a, b);
    assert.equal(r.status, 0, String(r.stderr));
    const out = JSON.parse(String(r.stdout)) as Comparison;
    assert.equal(out.equal, true);
    assert.deepEqual(out.differences, []);
  });

  void test("--sharing-scope, --namespace and --share-group give the hash the webhook stamps", () => {
    const file = join(dir, "scoped.yaml");
    writeFileSync(file, podYaml());
    const subject = subjectFromText(podYaml(), "p.yaml");
    if (subject.kind !== "pod") throw new Error("a pod");
    const webhook = (scope: string): string =>
      cacheHash(subject.pod, classifyPod(subject.pod), { scope }).hash;
    const out = (...args: string[]): Explanation => {
      const r = run(file, ...args);
      assert.equal(r.status, 0, String(r.stderr));
      return JSON.parse(String(r.stdout)) as Explanation;
    };
    assert.equal(out().hash, webhook("cluster"));
    assert.equal(
      out("--sharing-scope", "namespace", "--namespace", "team-a").hash,
      webhook("namespace:team-a"),
    );
    assert.equal(out("--sharing-scope", "group", "--share-group", "ml").scope, "group:ml");
    assert.notEqual(run(file, "--sharing-scope", "everyone").status, 0);
    const misplaced = run(file, "--share-group", "ml");
    assert.notEqual(misplaced.status, 0);
    assert.match(String(misplaced.stderr), /--share-group applies to --sharing-scope group only/);
  });

  void test("bad input: non-zero exit and one line on stderr, no stack trace", () => {
    const broken = join(dir, "broken.yaml");
    writeFileSync(broken, "kind: Pod\nspec: [\n  - a\n b");
    for (const args of [[broken], [join(dir, "missing.yaml")], [dir]]) {
      const r = run(...args);
      assert.notEqual(r.status, 0);
      const err = String(r.stderr);
      assert.equal(err.trimEnd().split("\n").length, 1, err);
      assert.match(err, /^warmstart: /);
      assert.doesNotMatch(err, /\n\s+at /);
      assert.equal(String(r.stdout), "");
    }
    assert.match(String(run(join(dir, "missing.yaml")).stderr), /cannot read .*missing\.yaml: no such file/);
  });
});

function subjectPod(text: string): unknown {
  const s = subjectFromText(text, "x");
  return s.kind === "pod" ? s.pod : undefined;
}

// YAML written back by the yaml package reads the same (guards the JSON/YAML equivalence the command relies on).
void test("explain: YAML round-trip keeps the hash", () => {
  const p = subjectPod(deploymentYaml);
  assert.equal(single(stringify(p)).hash, single(deploymentYaml).hash);
});

test("a record keeps no arg or env value verbatim, and still compares with a pod input by input", () => {
  const pod = (model: string): string =>
    JSON.stringify({
      apiVersion: "v1",
      kind: "Pod",
      metadata: { name: "w" },
      spec: {
        containers: [
          {
            name: "vllm",
            image: "vllm/vllm-openai:v0.8.5",
            args: ["--model", model, "--api-key-file", "/etc/secret-value-in-args"],
            env: [{ name: "EXTRA_OPTS", value: "password=hunter2" }],
            resources: { limits: { "nvidia.com/gpu": "1" } },
          },
        ],
      },
    });
  const a = subjectFromText(pod("org/a"), "a.json");
  const inputs = hashInputs((a as { pod: V1Pod }).pod, classifyPod((a as { pod: V1Pod }).pod));
  const sealed = sealInputs(inputs);
  const text = JSON.stringify(sealed);
  assert.doesNotMatch(text, /hunter2|secret-value-in-args/);
  assert.equal(sealed.model, "org/a", "the model stays readable");
  const record = JSON.stringify({
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: "x" },
    spec: { hash: hashOfInputs(inputs), inputs: sealed },
  });
  const same = compare(subjectFromText(record, "mc.json"), a);
  assert.equal(same.equal, true);
  assert.deepEqual(same.differences, []);
  const other = compare(subjectFromText(record, "mc.json"), subjectFromText(pod("org/b"), "b.json"));
  assert.equal(other.equal, false);
  assert.ok(other.differences.some((d) => d.input === "model"));
  assert.ok(
    other.differences.some((d) => d.input === "argv[1]"),
    "the differing arg is named, digested",
  );
});

void describe("explain: the workloads real charts ship", () => {
  const container = (args: string[]): Record<string, unknown> => ({
    name: "vllm",
    image: "vllm/vllm-openai:v0.10.0",
    command: ["sh", "-c"],
    args,
    resources: { limits: { "nvidia.com/gpu": "8" } },
  });
  const lwsYaml = stringify({
    apiVersion: "leaderworkerset.x-k8s.io/v1",
    kind: "LeaderWorkerSet",
    metadata: { name: "vllm" },
    spec: {
      replicas: 2,
      leaderWorkerTemplate: {
        size: 2,
        leaderTemplate: {
          spec: { containers: [container(["ray start --head && vllm serve org/big --tp 8 --pp 2"])] },
        },
        workerTemplate: {
          spec: { containers: [container(["ray start --block --address=$(LWS_LEADER_ADDRESS):6379"])] },
        },
      },
    },
  });

  void test("a LeaderWorkerSet: its leader and worker templates, each named", () => {
    const subjects = subjectsFromText(lwsYaml, "lws.yaml");
    assert.deepEqual(
      subjects.map((s) => s.name),
      ["LeaderWorkerSet vllm (leader)", "LeaderWorkerSet vllm (worker)"],
    );
    const [leader, worker] = subjects.map((s) => explain(s));
    assert.equal(leader?.model, "org/big");
    assert.equal(worker?.downloader, false, "the worker names no model: it joins the leader's group");
    // Seen as the LeaderWorkerSet controller will create them: rank 0 and rank 1 of group 0.
    assert.deepEqual([leader?.group?.kind, leader?.group?.rank], ["lws", "0"]);
    assert.deepEqual([worker?.group?.kind, worker?.group?.rank], ["lws", "1"]);
    assert.equal(leader?.follower?.mode, "wait", "a rank is never gated");
    assert.match(leader?.follower?.why ?? "", /rank 0 of multi-node group lws vllm\/0/);
  });

  void test("explain shows a pod's gang and the follower mode the webhook's --follower-mode gives it", () => {
    const plain = single(podYaml());
    assert.equal(plain.gang, undefined);
    assert.equal(plain.follower?.mode, "gate");
    const kueue = single(
      podYaml().replace("  name: worker", "  name: worker\n  labels: {kueue.x-k8s.io/queue-name: q}"),
    );
    assert.equal(kueue.gang?.kind, "kueue");
    assert.equal(kueue.follower?.mode, "wait");
    const subject = subjectFromText(podYaml(), "pod.yaml");
    assert.equal(explain(subject, { followerMode: "wait" }).follower?.mode, "wait");
  });

  void test("a multi-document file: every workload, each named; the command prints them all", () => {
    const text = `${deploymentYaml}\n---\n${lwsYaml}`;
    assert.deepEqual(
      subjectsFromText(text, "all.yaml").map((s) => s.name),
      ["Deployment llama", "LeaderWorkerSet vllm (leader)", "LeaderWorkerSet vllm (worker)"],
    );
    const dir = mkdtempSync(join(tmpdir(), "explain-all-"));
    after(() => rmSync(dir, { recursive: true, force: true }));
    writeFileSync(join(dir, "all.yaml"), text);
    const bin = fileURLToPath(new URL("../../../bin/warmstart", import.meta.url));
    const r = spawnSync(bin, ["explain", join(dir, "all.yaml")], { encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
    const out = JSON.parse(r.stdout) as Explanation[];
    assert.deepEqual(
      out.map((e) => [e.name, e.downloader]),
      [
        ["Deployment llama", true],
        ["LeaderWorkerSet vllm (leader)", true],
        ["LeaderWorkerSet vllm (worker)", false],
      ],
    );
  });

  void test("the captured locations are shown: the pod's own folders, and what points into Warmstart's root", () => {
    const out = single(
      podYaml({
        env: "        - {name: HF_HOME, value: /tmp}\n        - {name: VLLM_CACHE_ROOT, value: /cache/vllm}",
      }),
    );
    assert.deepEqual(
      out.locations?.captured.map((l) => [l.path, l.kind, l.tree]),
      [
        ["/tmp/hub", "model", "model/at/tmp/hub"],
        ["/cache/vllm", "cache", "cache/at/cache/vllm"],
      ],
    );
    const injected = out.locations?.injected.map((e) => e.name) ?? [];
    assert.ok(
      !injected.includes("HF_HOME") && !injected.includes("VLLM_CACHE_ROOT"),
      "the pod's own names are kept",
    );
    assert.ok(injected.includes("TORCHINDUCTOR_CACHE_DIR"));
  });

  void test("a settings name ending in INDEX is not a pod index; a pod's place in its workload is", () => {
    const out = single(
      podYaml({
        env: "        - {name: NCCL_IB_GID_INDEX, value: '3'}\n        - {name: WORKER_INDEX, value: '1'}\n        - {name: NODE_RANK, value: '1'}",
      }),
    );
    assert.deepEqual(
      out.warnings.map((w) => w.input),
      ["env.NODE_RANK", "env.WORKER_INDEX"],
    );
  });
});

void test("a credential in the model URL, an e-mail address as its user included, never reaches explain's output", () => {
  const pod = `apiVersion: v1
kind: Pod
metadata: { name: p }
spec:
  containers:
    - name: vllm
      image: vllm/vllm-openai:v0.6.3
      args: ["--model", "https://jane.doe@example.com:hunter2@models.example.com/llama.tar"]
      resources: { limits: { nvidia.com/gpu: "1" } }
`;
  const view = single(pod);
  assert.equal(view.model, "https://<redacted>@models.example.com/llama.tar");
  assert.doesNotMatch(JSON.stringify(view), /hunter2|jane\.doe/);
});
