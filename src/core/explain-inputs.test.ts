// Manifest reading, per-run detection and input differences of `warmstart explain`, for the cases
// the end-to-end tests in explain.test.ts do not reach.
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  diffInputs,
  diffLists,
  explain,
  findSubjects,
  parseManifests,
  perRunInputs,
  subjectsFromText,
} from "./explain.js";
import { hashOfInputs, type HashInputs } from "./hash.js";

const inputs = (over: Partial<HashInputs> = {}): HashInputs => ({
  v: 2,
  image: "vllm/vllm-openai:v0.9.0",
  argv: ["vllm", "serve", "org/model"],
  env: [],
  envFrom: [],
  model: "org/model",
  gpus: { "nvidia.com/gpu": "1" },
  ...over,
});

const template = { spec: { containers: [{ name: "main", image: "i" }] } };

void test("every kind with a pod template is read: PodTemplate, and workload kinds it does not know by name", () => {
  const subjects = findSubjects(
    [
      { kind: "PodTemplate", metadata: { name: "pt", namespace: "team-a" }, template },
      { kind: "RayCluster", metadata: { name: "ray" }, spec: { template } },
    ],
    "f.yaml",
  );
  assert.deepEqual(
    subjects.map((s) => [s.kind, s.name, s.kind === "pod" ? s.namespace : undefined]),
    [
      ["pod", "PodTemplate pt", "team-a"],
      ["pod", "RayCluster ray", undefined],
    ],
  );
});

void test("a LeaderWorkerSet without a leader template runs its worker template as leader; without either it is an error", () => {
  const [leader, worker] = findSubjects(
    [
      {
        kind: "LeaderWorkerSet",
        metadata: { name: "lws" },
        spec: { leaderWorkerTemplate: { workerTemplate: template } },
      },
    ],
    "lws.yaml",
  );
  assert.equal(leader?.name, "LeaderWorkerSet lws (leader)");
  assert.equal(worker?.name, "LeaderWorkerSet lws (worker)");
  assert.deepEqual(leader?.kind === "pod" && leader.pod.spec, worker?.kind === "pod" && worker.pod.spec);
  assert.throws(
    () => findSubjects([{ kind: "LeaderWorkerSet", metadata: { name: "lws" }, spec: {} }], "lws.yaml"),
    /^Error: lws.yaml: LeaderWorkerSet lws has no leaderWorkerTemplate$/,
  );
  assert.throws(
    () => findSubjects([{ kind: "Deployment", metadata: { name: "d" }, spec: {} }], "d.yaml"),
    /d.yaml: Deployment d has no pod template/,
  );
  assert.throws(
    () => findSubjects([{ kind: "Pod", metadata: { name: "p" }, spec: { containers: [] } }], "p.yaml"),
    /p.yaml: Pod p has no containers/,
  );
});

void test("text that looks like JSON but is not strict JSON is read as YAML flow; an empty one is refused", () => {
  const [doc] = parseManifests("{kind: Pod, metadata: {name: p}}", "flow.yaml");
  assert.deepEqual(doc, { kind: "Pod", metadata: { name: "p" } });
  assert.throws(() => parseManifests("  \n", "empty.yaml"), /empty.yaml: empty input/);
  assert.throws(
    () => parseManifests("a: [1, 2", "bad.yaml"),
    /^Error: bad.yaml: invalid YAML or JSON: [^\n]*$/,
  );
});

void test("a record written by recipe v1 (command and args apart) is read as one argv, in status as in spec", () => {
  const v1 = { ...inputs(), command: ["vllm", "serve"], args: ["org/model"] } as Record<string, unknown>;
  delete v1.argv;
  const [fromStatus] = subjectsFromText(
    JSON.stringify({ kind: "ModelCache", metadata: { name: "c" }, status: { inputs: v1, hash: "h" } }),
    "c.json",
  );
  assert.equal(fromStatus?.kind, "cache");
  if (fromStatus?.kind !== "cache") return;
  assert.deepEqual(fromStatus.inputs.argv, ["vllm", "serve", "org/model"]);
  assert.equal(fromStatus.recordedHash, "h");
  // Its recorded hash does not match its inputs: said as a warning.
  const e = explain(fromStatus);
  assert.equal(e.hash, hashOfInputs(fromStatus.inputs));
  assert.deepEqual(e.warnings, [
    { input: "hash", value: "h", why: "the record's hash does not match its inputs" },
  ]);
  // A sealed record's own hash stands for its inputs.
  const [sealed] = subjectsFromText(
    JSON.stringify({ kind: "ModelCache", spec: { hash: "h", inputs: { ...inputs(), sealed: true } } }),
    "s.json",
  );
  assert.equal(sealed && explain(sealed).hash, "h");
  assert.deepEqual(sealed && explain(sealed).warnings, []);
});

void test("per-run inputs: a per-run model, pinned revisions, a pod's identity and index", () => {
  const flags = perRunInputs(
    inputs({
      model: "runs/2025-06-01T10:00:00",
      argv: [
        "serve",
        "--revision",
        "0123456789abcdef0123",
        "--code-revision=fedcba9876543210fedc",
        "--seed=1718000000",
      ],
      env: [
        { name: "POD_NAME", value: "vllm-0" },
        { name: "JOB_COMPLETION_INDEX", value: "3" },
        { name: "NCCL_IB_GID_INDEX", value: "3" },
        { name: "MODEL_REVISION", value: "0123456789abcdef0123" },
        { name: "TOKEN", from: "secret/x" },
      ],
    }),
  );
  assert.deepEqual(
    flags.map((f) => [f.input, f.why]),
    [
      ["model", "looks like a timestamp"],
      ["argv[4]", "looks like a Unix timestamp"],
      ["env.POD_NAME", "looks like a per-pod identity"],
      ["env.JOB_COMPLETION_INDEX", "looks like a pod index"],
    ],
  );
});

void test("differences: other containers added or removed, env values from references and credentials, lists of other lengths", () => {
  const a = inputs({
    env: [
      { name: "A", from: "configMap/x" },
      { name: "B", credential: true },
    ],
    containers: [{ kind: "init", image: "fetch:1", argv: [], env: [], envFrom: [], mounts: ["/c"] }],
  });
  const b = inputs({ env: [{ name: "A", value: "plain" }] });
  assert.deepEqual(diffInputs(a, b), [
    { input: "env.A", a: "valueFrom configMap/x", b: "plain" },
    { input: "env.B", a: "<credential, counted by name>", b: null },
    { input: "containers[0]", a: "init fetch:1", b: null },
  ]);
  assert.deepEqual(diffLists("argv", ["a", "b c"], ["a"]), [{ input: "argv", a: "a 'b c'", b: "a" }]);
  assert.deepEqual(diffLists("argv", ["a", "b"], ["a", "c"]), [{ input: "argv[1]", a: "b", b: "c" }]);
});
