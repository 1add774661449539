/**
 * Fuzzing of the admission core with fast-check: the classifier, the shell splitter, the hash and
 * its role-flag stripper, and the patch builder. Pods come in two shapes: API-shaped (what the API
 * server sends: the right types, hostile strings) and hostile JSON (any type anywhere, keys such as
 * `toString` and `__proto__`), which only the never-throw properties take.
 *
 * Fixed seed, bounded runs (a few seconds); WARMSTART_FUZZ_RUNS=N and WARMSTART_FUZZ_SEED=S on
 * demand (test/support/fuzz.ts). A failure reports its seed and path; the case count is printed.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import fc from "fast-check";
import jsonpatch, { type Operation } from "fast-json-patch";
import type { V1Container, V1EnvVar, V1Pod } from "@kubernetes/client-node";
import { classifyPod } from "./classify.js";
import { cacheHash, isExcludedEnv, stripRoleArgs } from "./hash.js";
import { argvTokens } from "./argv.js";
import {
  EXPANSION_BUDGET_BYTES,
  expandKubeRefs,
  expandShellVars,
  isCredentialName,
  listOf,
  literalEnv,
} from "./env.js";
import { joinShell, splitShell } from "./shell.js";
import { stripStamps } from "./stamps.js";
import {
  decorateCold,
  decorateFollower,
  decorateLeader,
  decorateRestore,
  jsonPatch,
  type CacheEnvTemplate,
} from "./decorate.js";
import {
  ANN_ELECTION_ID,
  ANN_HASH,
  ANN_ROLE,
  ENV_PREWARM,
  ENV_TREE,
  INIT_PREWARM,
  INIT_SEED,
  LEGACY_INIT_WAIT_READY,
  LABEL_CAPTURE,
  LABEL_GATED,
  LABEL_HASH,
  SCHEDULING_GATE,
  type Role,
} from "./contract.js";
import { corrupt, holds, junk, text, wire } from "../../test/support/fuzz.js";

// ---------------------------------------------------------------------------------------------
// Words and models (text, junk and the property runner are shared: test/support/fuzz.ts).

/** A plain shell word: no whitespace, no quoting, not a flag. */
const word = fc.stringMatching(/^[A-Za-z0-9_.:/+][A-Za-z0-9_.:/+-]{0,15}$/);
const model = fc
  .tuple(
    fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,10}$/),
    fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9_.-]{0,12}$/),
  )
  .map(([org, name]) => `${org}/${name}`);
const hashOf = (p: V1Pod): string => cacheHash(p, classifyPod(p)).hash;
/** Single-quotes a word for a shell script (the test's own, not the code's quoting). */
const shq = (w: string): string => `'${w.replace(/'/g, `'\\''`)}'`;

// ---------------------------------------------------------------------------------------------
// Argv units: a model, ordinary flags, and disaggregation role flags (which the hash leaves out).

type Units = string[][];
const MODEL_FLAGS = ["--model", "--model-path", "--model-id", "--model_id"];
const modelUnit: fc.Arbitrary<string[]> = fc.oneof(
  fc.tuple(fc.constantFrom(...MODEL_FLAGS), model).map(([f, m]) => [f, m]),
  fc.tuple(fc.constantFrom(...MODEL_FLAGS), model).map(([f, m]) => [`${f}=${m}`]),
  fc.constant<string[]>(["--model", "$(HF_MODEL_ID)"]),
);
const keptUnit: fc.Arbitrary<string[]> = fc.oneof(
  fc
    .tuple(
      fc.constantFrom(
        "--tensor-parallel-size",
        "--max-model-len",
        "--revision",
        "--dtype",
        "--max-num-batched-token",
      ),
      word,
    )
    .map(([f, v]) => [f, v]),
  fc
    .tuple(fc.stringMatching(/^--[a-z][a-z-]{0,12}$/), word)
    .filter(([f]) => !["--host", "--port", "--served-model-name"].includes(f))
    .map(([f, v]) => [`${f}=${v}`]),
  fc.constantFrom<string[]>(["--trust-remote-code"], ["--enforce-eager"], ["--enable-prefix-caching"]),
);
const jsonText = fc
  .jsonValue({ maxDepth: 2 })
  .map((v) => JSON.stringify(v))
  .filter((s) => !s.startsWith("-"));
const roleUnit: fc.Arbitrary<string[]> = fc.oneof(
  fc.constantFrom<string[]>(["--is-prefill-worker"], ["--is-decode-worker"]),
  fc.tuple(fc.stringMatching(/^[a-z][a-z-]{0,10}$/), word).map(([k, v]) => [`--disaggregation-${k}`, v]),
  fc.tuple(fc.stringMatching(/^[a-z][a-z-]{0,10}$/), word).map(([k, v]) => [`--disaggregation-${k}=${v}`]),
  fc.tuple(fc.constantFrom("--kv-transfer-config", "--kv-events-config"), jsonText).map(([f, v]) => [f, v]),
  fc
    .tuple(fc.constantFrom("--kv-transfer-config", "--kv-events-config"), jsonText)
    .map(([f, v]) => [`${f}=${v}`]),
  // Serving-endpoint flags change neither download nor compiled result.
  fc.tuple(fc.constantFrom("--host", "--port"), word).map(([f, v]) => [f, v]),
  fc.tuple(fc.constantFrom("--host", "--port", "--served-model-name"), word).map(([f, v]) => [`${f}=${v}`]),
);
const LAUNCHERS: string[][] = [
  ["python3", "-m", "vllm.entrypoints.openai.api_server"],
  ["python3", "-m", "sglang.launch_server"],
  ["python3", "-m", "dynamo.vllm"],
  ["vllm", "serve"],
];

/**
 * How the argv is written: list items, "--flag value" items, one `sh -c` script, or split between
 * command (launcher and first unit) and args; a role pair right after the first unit straddles the two.
 */
type ArgvForm = "list" | "pairs" | "shell" | "split";
const argvForm = fc.constantFrom<ArgvForm>("list", "pairs", "shell", "split");

/** The container's command and args for units written in one form. */
function argv(
  launcher: string[],
  units: Units,
  form: ArgvForm,
  roles: ReadonlySet<string[]> = new Set(),
): { command: string[]; args: string[] } {
  const items = units.flat();
  switch (form) {
    case "list":
      return { command: launcher, args: items };
    case "pairs":
      // A "--flag value" pair in one item: split as a shell would, and read as the two words.
      return { command: launcher, args: units.map((u) => u.map((w, i) => (i ? shq(w) : w)).join(" ")) };
    case "shell":
      return { command: ["sh", "-c"], args: [[...launcher, ...items].map(shq).join(" ")] };
    case "split": {
      const [first = [], second, ...rest] = units;
      const command = [...launcher, ...first];
      if (!second) return { command, args: [] };
      if (!roles.has(second) || second.length !== 2) return { command, args: [second, ...rest].flat() };
      return { command: [...command, second[0]!], args: [second[1]!, ...rest.flat()] };
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Env, containers, pods.

const ENV_NAMES = [
  ...["HF_MODEL_ID", "MODEL_ID", "NIM_MODEL_NAME", "HF_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR", "HOME"],
  ...["HF_TOKEN", "NGC_API_KEY", "MY_API_KEY", "DB_PASSWORD", ENV_PREWARM, ENV_TREE, "HF_HUB_OFFLINE"],
  ...["DYN_NAMESPACE", "DYNAMO_PORT", "GROVE_PCLQ_POD_INDEX", "NATS_URL", "NATS_SERVER", "ETCD_ENDPOINTS"],
  ...["FOO", "BAR", "PATH", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES"],
];
const envName = fc.oneof(
  { weight: 3, arbitrary: fc.constantFrom(...ENV_NAMES) },
  { weight: 1, arbitrary: fc.stringMatching(/^[A-Za-z_][A-Za-z0-9_.-]{0,10}$/) },
);
/** A literal that refers to no other env (`$(NAME)` would make env order matter, as in the kubelet). */
const envValue = text.filter((v) => !/\$\([A-Za-z_]/.test(v));
const valueFrom = fc.oneof(
  fc.record({ secretKeyRef: fc.record({ name: word, key: word }) }),
  fc.record({ configMapKeyRef: fc.record({ name: word, key: word }) }),
  fc.record({ fieldRef: fc.record({ fieldPath: fc.constantFrom("metadata.name", "metadata.labels['x']") }) }),
);
const envVar: fc.Arbitrary<V1EnvVar> = fc.oneof(
  { weight: 4, arbitrary: fc.record({ name: envName, value: envValue }) },
  { weight: 1, arbitrary: fc.record({ name: envName, valueFrom }).map(wire) },
);
const gpuQuantity = fc.oneof(
  { weight: 4, arbitrary: fc.constantFrom("1", "2", "8", "0.5") },
  { weight: 1, arbitrary: fc.constantFrom("0", "", "x", "-1", "1e400") },
);
const resources: fc.Arbitrary<V1Container["resources"]> = fc.oneof(
  fc.record({ limits: fc.record({ "nvidia.com/gpu": gpuQuantity }) }),
  fc.record({ requests: fc.record({ "nvidia.com/gpu": gpuQuantity, cpu: fc.constant("1") }) }),
  fc.constant({ limits: { cpu: "2" } }),
);
const mounts = fc.array(
  fc.record({
    name: fc.constantFrom("warmstart-cache", "data", "warmstart-ro", "warmstart-shadow"),
    mountPath: fc.constantFrom("/cache", "/data", "/root/.cache"),
  }),
  { maxLength: 2 },
);
const stampKeys = fc.constantFrom(
  "warmstart.dev/hash",
  "warmstart.dev/role",
  "warmstart.dev/capture",
  "warmstart.dev/gated",
  "warmstart.dev/election-id",
  "warmstart.dev/tree",
  "warmstart.dev/restore-from",
  "warmstart.dev/skip",
  "app.kubernetes.io/name",
  "a~b/c",
  "x/y~1z",
);
const stringMap = fc.dictionary(fc.oneof(stampKeys, word), text, { maxKeys: 4 });

/** A GPU container that names a model, with argv units, env, mounts. */
const mainContainer = fc
  .record({
    name: fc.constantFrom("main", "vllm", "worker"),
    image: fc.constantFrom("vllm/vllm-openai:v0.6.3", "nvcr.io/nim/meta/llama3-8b:1.0", "img:latest", " x "),
    launcher: fc.constantFrom(...LAUNCHERS),
    units: fc.tuple(modelUnit, fc.array(keptUnit, { maxLength: 4 })).map(([m, k]) => [m, ...k]),
    form: argvForm,
    env: fc.array(envVar, { maxLength: 6 }),
    resources,
    volumeMounts: mounts,
    runAsUser: fc.option(fc.integer({ min: 0, max: 70000 }), { nil: undefined }),
  })
  .map((c): V1Container => {
    const { command, args } = argv(c.launcher, c.units, c.form);
    return {
      name: c.name,
      image: c.image,
      command,
      args,
      env: c.env,
      resources: c.resources,
      volumeMounts: c.volumeMounts,
      ...(c.runAsUser !== undefined ? { securityContext: { runAsUser: c.runAsUser } } : {}),
    };
  });
const sideContainer: fc.Arbitrary<V1Container> = fc.record({
  name: fc.constantFrom(
    "sidecar",
    "warmstart-seed-cache",
    "warmstart-prewarm",
    "init",
    "warmstart-wait-ready",
  ),
  image: fc.constantFrom("busybox", "alpine:3"),
  command: fc.array(text, { maxLength: 3 }),
  args: fc.array(text, { maxLength: 3 }),
  env: fc.array(envVar, { maxLength: 3 }),
  volumeMounts: mounts,
});

/** An API-shaped pod: the types the API server sends, hostile strings, forged stamps. */
const apiPod: fc.Arbitrary<V1Pod> = fc
  .record({
    name: fc.option(word, { nil: undefined }),
    labels: fc.option(stringMap, { nil: undefined }),
    annotations: fc.option(stringMap, { nil: undefined }),
    before: fc.array(sideContainer, { maxLength: 1 }),
    main: mainContainer,
    after: fc.array(sideContainer, { maxLength: 2 }),
    init: fc.option(fc.array(sideContainer, { maxLength: 3 }), { nil: undefined }),
    gates: fc.option(
      fc.array(fc.record({ name: fc.constantFrom(SCHEDULING_GATE, "other/gate") }), { maxLength: 2 }),
      {
        nil: undefined,
      },
    ),
    runAsUser: fc.option(fc.integer({ min: 0, max: 70000 }), { nil: undefined }),
    volumes: fc.option(
      fc.array(fc.record({ name: fc.constantFrom("data", "warmstart-cache"), emptyDir: fc.constant({}) })),
      {
        nil: undefined,
      },
    ),
  })
  .map((p): V1Pod => ({
    metadata: {
      ...(p.name !== undefined ? { name: p.name } : { generateName: "w-" }),
      ...(p.labels ? { labels: p.labels } : {}),
      ...(p.annotations ? { annotations: p.annotations } : {}),
    },
    spec: {
      containers: [...p.before, p.main, ...p.after],
      ...(p.init ? { initContainers: p.init } : {}),
      ...(p.gates ? { schedulingGates: p.gates } : {}),
      ...(p.volumes ? { volumes: p.volumes } : {}),
      ...(p.runAsUser !== undefined ? { securityContext: { runAsUser: p.runAsUser } } : {}),
    },
  }))
  .map(wire);

const hostilePod: fc.Arbitrary<unknown> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc
      .tuple(
        apiPod,
        fc.array(fc.record({ path: fc.array(fc.nat(), { maxLength: 6 }), with: junk }), {
          minLength: 1,
          maxLength: 4,
        }),
      )
      .map(([p, hits]) => corrupt(p, hits)),
  },
  { weight: 1, arbitrary: junk },
  { weight: 1, arbitrary: fc.jsonValue({ maxDepth: 5 }) },
);

// ---------------------------------------------------------------------------------------------
// The classifier and the hash never throw.

test("the classifier never throws on any JSON value, and cacheHash never on a pod it calls a downloader", async (t) => {
  await holds(
    t,
    fc.property(hostilePod, (pod) => {
      const c = classifyPod(pod as V1Pod);
      assert.equal(typeof c.reason, "string");
      assert.ok(c.reason.length > 0);
      if (c.downloader) {
        assert.equal(typeof c.model, "string");
        const h = cacheHash(pod as V1Pod, c);
        assert.match(h.hash, /^[0-9a-f]{64}$/);
      }
    }),
    1500,
  );
});

test("pods with the wrong types anywhere: classified or left alone, never a throw", () => {
  const gpu = { limits: { "nvidia.com/gpu": "1" } };
  const toStringKey = JSON.parse('{"toString":1}') as unknown;
  const cases: Array<[unknown, string]> = [
    // A list where a list belongs is iterated; anything else is no list (it threw "not iterable").
    [{ spec: { containers: [{ resources: gpu, command: 5 }] } }, "GPU container names no model"],
    [
      { spec: { containers: [{ resources: gpu, args: ["--model", "m"], env: 5 }] } },
      "model from --model flag",
    ],
    [{ spec: { containers: [{ resources: gpu, image: 5 }] } }, "GPU container names no model"],
    // An object whose `toString` JSON set to a number (String() threw "Cannot convert object").
    [{ spec: { containers: [{ resources: gpu, args: [toStringKey] }] } }, "GPU container names no model"],
    [
      { spec: { containers: [{ resources: gpu, env: [{ name: "MODEL_ID", value: toStringKey }] }] } },
      "model from env MODEL_ID",
    ],
    [null, "pod has no containers"],
    [7, "pod has no containers"],
  ];
  for (const [pod, reason] of cases)
    assert.equal(classifyPod(pod as V1Pod).reason, reason, JSON.stringify(pod));
  // The hash of a downloader with such fields is composed all the same.
  const odd = {
    spec: {
      containers: [
        {
          resources: gpu,
          image: toStringKey,
          args: ["--model=m", toStringKey],
          env: [{ name: "A", valueFrom: { secretKeyRef: { name: toStringKey, key: "k" } } }],
          envFrom: [{ configMapRef: { name: toStringKey }, prefix: toStringKey }],
          volumeMounts: [{ name: "warmstart-cache", mountPath: toStringKey, subPath: toStringKey }],
        },
      ],
    },
  } as unknown as V1Pod;
  assert.match(cacheHash(odd, classifyPod(odd)).hash, /^[0-9a-f]{64}$/);
});

// ---------------------------------------------------------------------------------------------
// Expansion: `$(VAR)`, `$VAR` and `${VAR}` anywhere (command, args, env values, `sh -c` scripts,
// a storage initializer's words), over env that refers to itself and doubles: one reading of a
// pod adds at most the budget, and costs time linear in the pod.

/** A name of the env below: few, so references meet definitions. */
const refName = fc.integer({ min: 0, max: 5 }).map((i) => `A${i}`);
const ref = fc
  .tuple(fc.constantFrom("kube", "shell", "brace"), refName)
  .map(([k, n]) => (k === "kube" ? `$(${n})` : k === "shell" ? `$${n}` : `\${${n}}`));
/** A run of references, repeated up to hundreds of times: R references to V bytes each, unbounded. */
const refRun = fc
  .tuple(fc.array(ref, { minLength: 1, maxLength: 3 }), fc.integer({ min: 1, max: 300 }), word)
  .map(([rs, k, w]) => `${w}${rs.join("").repeat(k)}`);
/**
 * Env over A0..A5: large literals, and values that refer to earlier entries or to the name's own
 * earlier definition (`A1=$(A1)$(A1)` doubles A1), in every syntax (only `$(VAR)` is the kubelet's).
 */
const refEnv: fc.Arbitrary<V1EnvVar[]> = fc.array(
  fc.record({
    name: refName,
    value: fc.oneof(
      fc.integer({ min: 1, max: 30_000 }).map((n) => "x".repeat(n)),
      fc.tuple(refName, fc.integer({ min: 2, max: 3 })).map(([n, k]) => `$(${n})`.repeat(k)),
      refRun,
      text,
    ),
  }),
  { minLength: 1, maxLength: 14 },
);
const refPod: fc.Arbitrary<V1Pod> = fc
  .record({
    env: refEnv,
    initEnv: refEnv,
    run: refRun,
    run2: refRun,
    words: fc.array(refRun, { maxLength: 40 }),
    form: fc.constantFrom("list", "flag", "script", "nested", "positional", "env", "initializer"),
  })
  .map(({ env, initEnv, run, run2, words, form }): V1Pod => {
    const main: V1Container = {
      name: "m",
      image: "vllm/vllm-openai:v0.6.3",
      resources: { limits: { "nvidia.com/gpu": "1" } },
      env: [...env, ...(form === "env" ? [{ name: "MODEL_ID", value: run }] : [])],
      volumeMounts: [{ name: "models", mountPath: "/mnt/models" }],
    };
    const script = `vllm serve ${run} --x ${run2} ${words.join(" ")}`;
    if (form === "list") main.args = ["--model", run, ...words];
    if (form === "flag") main.args = [`--model=${run}`, `--x=${run2}`];
    if (form === "script") main.command = ["sh", "-c", script];
    if (form === "nested") main.command = ["bash", "-lc", `exec sh -c ${shq(script)}`];
    if (form === "positional") main.command = ["vllm", "serve", run, run2, ...words];
    if (form === "initializer") main.args = ["--model", "/mnt/models"];
    return wire({
      metadata: { name: "p" },
      spec: {
        volumes: [{ name: "models", emptyDir: {} }],
        initContainers: [
          {
            name: "storage-initializer",
            image: "kserve/storage-initializer",
            env: initEnv,
            volumeMounts: [{ name: "models", mountPath: "/mnt/models" }],
            command: ["sh", "-c", `${words.join(" ")} ${run2} hf://org/m`],
          },
        ],
        containers: [main],
      },
    });
  });

test("`$(VAR)`, `$VAR` and `${VAR}` anywhere, self-references and doublings: one budget, linear time", async (t) => {
  const peak = process.resourceUsage().maxRSS;
  let worst = { ms: 0, n: 0 };
  await holds(
    t,
    fc.property(refPod, (pod) => {
      const n = JSON.stringify(pod).length;
      const cpu = process.cpuUsage();
      const c = classifyPod(pod);
      const inputs = c.downloader ? cacheHash(pod, c).inputs : undefined;
      const used = process.cpuUsage(cpu);
      const ms = (used.user + used.system) / 1000;
      if (ms > worst.ms) worst = { ms, n };
      // Unbounded, such pods cost seconds and gigabytes, or a RangeError (a pod admitted with no
      // decision). A generous constant for a loaded machine, and a linear term.
      assert.ok(ms <= 250 + n / 100, `${ms.toFixed(0)} ms of CPU for a ${n}-byte pod`);
      assert.ok((c.model?.length ?? 0) <= n + EXPANSION_BUDGET_BYTES, `a ${c.model?.length}-character model`);
      if (inputs) assert.ok(JSON.stringify(inputs).length <= 8 * n + 2 * EXPANSION_BUDGET_BYTES);
      // What one reading expands, the env and every word of the argv, adds at most the budget.
      for (const container of [pod.spec!.containers[0]!, pod.spec!.initContainers![0]!]) {
        const env = literalEnv(container);
        let written = listOf(container.env).reduce((k, e) => k + (e.value?.length ?? 0), 0);
        let expanded = [...env.values()].reduce((k, v) => k + v.length, 0);
        for (const tok of argvTokens(container)) {
          written += tok.text.length;
          expanded += expandShellVars(expandKubeRefs(tok.text, env), env).length;
        }
        assert.ok(expanded <= written + EXPANSION_BUDGET_BYTES, `${expanded} bytes from ${written}`);
      }
    }),
    200,
  );
  const grewMB = (process.resourceUsage().maxRSS - peak) / 1024;
  t.diagnostic(`worst: ${worst.ms.toFixed(0)} ms for ${worst.n} bytes; peak RSS +${grewMB.toFixed(0)} MB`);
  assert.ok(grewMB < 200, `peak RSS grew by ${grewMB.toFixed(0)} MB`);
});

// ---------------------------------------------------------------------------------------------
// Shell parsing: never throws, terminates in linear-ish time, and its canonical form is a fixed point.

const SHELL_CHARS = [..."'\"\\$(){}`;&|<># \t\n=-abc1", "$(", "${", "\\\n", "2>&1", "&&"];
const hostileScript = fc.oneof(
  text,
  fc.array(fc.constantFrom(...SHELL_CHARS), { maxLength: 200 }).map((a) => a.join("")),
  fc.string({ unit: "binary", maxLength: 200 }),
);

test("shell splitting never throws, and joining its tokens reads back as the same tokens", async (t) => {
  await holds(
    t,
    fc.property(hostileScript, (s) => {
      const tokens = splitShell(s);
      for (const tok of tokens) assert.equal(typeof tok.text, "string");
      assert.deepEqual(splitShell(joinShell(tokens)), tokens);
    }),
    3000,
  );
});

test("shell splitting stays linear on long hostile input (unbalanced quotes, deep nesting)", async (t) => {
  // Each pattern repeated to ~200k characters: a quadratic scan would take minutes, a linear one ms.
  const patterns = [
    "'",
    '"',
    "`",
    "$(",
    "${",
    '"$(',
    "$('",
    "\\",
    "a ",
    "((",
    "$(\"'`",
    '"\\',
    "#",
    "&&",
    "2>",
    "--model ",
  ];
  await holds(
    t,
    fc.property(fc.constantFrom(...patterns), fc.constantFrom("", "'", '"', ")", "}", "x"), (p, tail) => {
      const s = p.repeat(Math.ceil(200_000 / p.length)) + tail;
      const started = performance.now();
      splitShell(s);
      const ms = performance.now() - started;
      assert.ok(ms < 2000, `${JSON.stringify(p)} x ${s.length}: ${ms.toFixed(0)} ms`);
    }),
    40,
  );
  // `sh -c` nested ten deep, quoted at each level: the classifier and the stripper read scripts in
  // scripts (to a bounded depth) and stay fast.
  let script = "vllm serve org/m --is-prefill-worker";
  for (let i = 0; i < 10; i++) script = `sh -c ${shq(script)} --kv-transfer-config x`;
  const started = performance.now();
  const pod: V1Pod = {
    spec: {
      containers: [
        { name: "m", resources: { limits: { "nvidia.com/gpu": "1" } }, command: ["sh", "-c", script] },
      ],
    },
  };
  assert.equal(classifyPod(pod).downloader, false, "a model deeper than three shells is not looked for");
  assert.ok(stripRoleArgs(["sh", "-c"], [script]).args[0]!.length > 0);
  const ms = performance.now() - started;
  assert.ok(ms < 2000, `nested scripts of ${script.length} characters: ${ms.toFixed(0)} ms`);
});

// ---------------------------------------------------------------------------------------------
// The stripper: role flags go in every form, nothing else moves, hostile input never crashes it.

test("stripping removes exactly the role flags, in every form, and is idempotent", async (t) => {
  // Units marked as role or kept, interleaved; a role value flag may dangle at the very end.
  const stream = fc.tuple(
    fc.array(fc.tuple(fc.boolean(), fc.oneof(keptUnit, fc.array(word, { minLength: 1, maxLength: 2 }))), {
      maxLength: 6,
    }),
    fc.array(fc.tuple(fc.nat(), roleUnit), { maxLength: 4 }),
    fc.option(fc.constantFrom("--kv-transfer-config", "--kv-events-config", "--disaggregation-mode"), {
      nil: undefined,
    }),
    argvForm,
  );
  await holds(
    t,
    fc.property(stream, ([kept, roles, dangling, form]) => {
      const keptUnits = kept.map(([, u]) => u);
      const all: Units = [...keptUnits];
      for (const [at, u] of roles) all.splice(at % (all.length + 1), 0, u);
      if (dangling) all.push([dangling]);
      // A launcher, so that a script is never one word (a one-word script is kept as written).
      const launcher = ["python3", "-m", "x"];
      const withRoles = argv(launcher, all, form, new Set(roles.map(([, u]) => u)));
      const without = argv(launcher, keptUnits, form);
      const a = stripRoleArgs(withRoles.command, withRoles.args);
      const b = stripRoleArgs(without.command, without.args);
      assert.deepEqual([...a.command, ...a.args], [...b.command, ...b.args]);
      if (form === "list") assert.deepEqual(a, { command: launcher, args: keptUnits.flat() });
      assert.deepEqual(stripRoleArgs(a.command, a.args), a, "the stripped form is a fixed point");
    }),
    1500,
  );
});

test("stripping never crashes on hostile args: odd unicode, dangling value flags, huge lists and items", async (t) => {
  const flags = fc.constantFrom(
    "--is-prefill-worker",
    "--kv-transfer-config",
    "--kv-events-config",
    "--disaggregation-mode",
    "--disaggregation-",
    "--hf-token",
    "--api-key=",
    "-c",
    "sh",
  );
  const item = fc.oneof(text, flags, hostileScript);
  await holds(
    t,
    fc.property(fc.array(item, { maxLength: 20 }), fc.array(item, { maxLength: 20 }), (command, args) => {
      const out = stripRoleArgs(command, args);
      assert.ok(Array.isArray(out.command) && Array.isArray(out.args));
      assert.ok(out.command.length <= command.length && out.args.length <= args.length);
      assert.deepEqual(stripRoleArgs(command, args), out, "deterministic");
    }),
    2000,
  );
  // Huge: many items, and one item of megabytes (a value flag dangles at the end of each).
  const many = Array.from({ length: 50_000 }, (_, i) => (i % 3 === 0 ? "--kv-transfer-config" : `v${i}`));
  const big = `sh -c '${"--is-decode-worker x ".repeat(60_000)}' --kv-events-config`;
  const started = performance.now();
  const huge = stripRoleArgs(["python3"], [...many, "--disaggregation-mode"]);
  // Every third item is a value flag that takes the next one with it: the rest (i % 3 === 2) stay.
  assert.deepEqual(
    huge.args,
    many.filter((_, i) => i % 3 === 2),
  );
  assert.ok(stripRoleArgs([], [big]).args.length <= 1);
  t.diagnostic(`huge args stripped in ${(performance.now() - started).toFixed(0)} ms`);
});

test("a role flag's `=` value with spaces in it is stripped, as a list item and inside a script", () => {
  // JSON written with spaces after its colons is one flag value all the same: a Dynamo prefill and
  // decode worker of one model must hash together.
  const kv = (role: string): string => `{"kv_connector": "NixlConnector", "kv_role": "${role}"}`;
  const worker = (argv: Pick<V1Container, "command" | "args">): V1Pod => ({
    metadata: {},
    spec: {
      containers: [{ name: "w", image: "img:1", resources: { limits: { "nvidia.com/gpu": "1" } }, ...argv }],
    },
  });
  const asItem = (role?: string): V1Pod =>
    worker({
      command: ["python3", "-m", "dynamo.vllm"],
      args: ["--model", "org/m", ...(role ? [`--kv-transfer-config=${kv(role)}`] : [])],
    });
  const inScript = (role?: string): V1Pod =>
    worker({
      command: ["sh", "-c"],
      args: [`python3 -m dynamo.vllm --model org/m${role ? ` --kv-transfer-config='${kv(role)}'` : ""}`],
    });
  for (const form of [asItem, inScript]) {
    assert.equal(hashOf(form("kv_producer")), hashOf(form("kv_consumer")), form.name);
    assert.equal(hashOf(form("kv_producer")), hashOf(form()), form.name);
  }
});

// ---------------------------------------------------------------------------------------------
// The hash: deterministic; blind to what it leaves out (role flags, orchestration env); order of
// env only where names differ.

const downloader = apiPod.filter((p) => classifyPod(p).downloader);
const mainOf = (p: V1Pod): V1Container => p.spec!.containers[classifyPod(p).containerIndex!]!;

test("hashing is deterministic: the same pod, or a copy, always hashes the same", async (t) => {
  await holds(
    t,
    fc.property(downloader, (p) => {
      const copy = JSON.parse(JSON.stringify(p)) as V1Pod;
      assert.equal(hashOf(p), hashOf(p));
      assert.equal(hashOf(copy), hashOf(p));
    }),
    800,
  );
});

/** A permutation of a list, as a list of indexes drawn with it. */
const permuted = <T>(arb: fc.Arbitrary<T[]>): fc.Arbitrary<[T[], T[]]> =>
  arb.chain((xs) =>
    fc.shuffledSubarray(xs, { minLength: xs.length, maxLength: xs.length }).map((p) => [xs, p]),
  );

test("env order never changes the hash when the names are distinct (main and cache-touching containers)", async (t) => {
  const distinct = fc.uniqueArray(envVar, { selector: (e) => e.name, maxLength: 8 });
  await holds(
    t,
    fc.property(
      downloader,
      permuted(distinct),
      permuted(distinct),
      (p, [env, shuffled], [initEnv, initShuffled]) => {
        const a = structuredClone(p);
        const b = structuredClone(p);
        mainOf(a).env = env;
        mainOf(b).env = shuffled;
        // An init container that writes the cache counts too: what it writes is in the tree.
        const init = (e: V1EnvVar[]): V1Container => ({
          name: "fill",
          image: "busybox",
          env: e,
          volumeMounts: [{ name: "warmstart-cache", mountPath: "/c" }],
        });
        a.spec!.initContainers = [init(initEnv)];
        b.spec!.initContainers = [init(initShuffled)];
        assert.equal(hashOf(a), hashOf(b));
      },
    ),
    800,
  );
});

test("duplicate env names: the last definition wins, so only their relative order matters", async (t) => {
  const dupes = fc.array(envVar, { minLength: 2, maxLength: 8 });
  await holds(
    t,
    fc.property(downloader, dupes, fc.nat(), fc.nat(), (p, env, i, j) => {
      const a = structuredClone(p);
      mainOf(a).env = env;
      // Keeping only each name's last definition changes nothing.
      const last = env.filter((e, k) => !env.slice(k + 1).some((x) => x.name === e.name));
      const b = structuredClone(p);
      mainOf(b).env = last;
      assert.equal(hashOf(a), hashOf(b));
      // Swapping two definitions of one name changes the hash when that name counts by its value.
      const x = env[i % env.length]!;
      const y = env[j % env.length]!;
      const k1 = env.indexOf(x);
      const k2 = env.lastIndexOf(y);
      if (k1 >= k2 || x.name !== y.name || x.value === undefined || y.value === undefined) return;
      if (x.value === y.value || isExcludedEnv(x.name) || isCredentialName(x.name)) return;
      // Only the last two definitions of the name: swap them so the winner changes.
      const defs = env.map((e, k) => [e, k] as const).filter(([e]) => e.name === x.name);
      const [pa, pb] = defs.slice(-2) as [readonly [V1EnvVar, number], readonly [V1EnvVar, number]];
      if (pa[0].value === pb[0].value || pa[0].valueFrom || pb[0].valueFrom) return;
      const swapped = [...env];
      swapped[pa[1]] = pb[0];
      swapped[pb[1]] = pa[0];
      const c = structuredClone(p);
      mainOf(c).env = swapped;
      assert.notEqual(hashOf(c), hashOf(a));
    }),
    800,
  );
});

test("what the hash leaves out never changes it: role flags in every form, orchestration env", async (t) => {
  const wiring = fc.record({
    name: fc.oneof(
      fc.constantFrom("ETCD_ENDPOINTS", "NATS_SERVER", "NATS_URL", ENV_PREWARM),
      fc
        .tuple(fc.constantFrom("DYN_", "DYNAMO_", "GROVE_"), fc.stringMatching(/^[A-Z0-9_]{0,8}$/))
        .map(([a, b]) => a + b),
    ),
    value: envValue,
  });
  await holds(
    t,
    fc.property(
      fc.record({
        launcher: fc.constantFrom(...LAUNCHERS),
        units: fc.tuple(modelUnit, fc.array(keptUnit, { maxLength: 4 })).map(([m, k]) => [m, ...k]),
        roles: fc.array(fc.tuple(fc.nat(), roleUnit), { minLength: 1, maxLength: 4 }),
        form: argvForm,
        env: fc.array(envVar, { maxLength: 5 }),
        extraEnv: fc.array(fc.tuple(fc.nat(), wiring), { minLength: 1, maxLength: 4 }),
      }),
      (g) => {
        const pod = (units: Units, env: V1EnvVar[]): V1Pod => ({
          metadata: { generateName: "w-" },
          spec: {
            containers: [
              {
                name: "main",
                image: "img:1",
                ...argv(g.launcher, units, g.form, new Set(g.roles.map(([, u]) => u))),
                env,
                resources: { limits: { "nvidia.com/gpu": "1" } },
              },
            ],
          },
        });
        const units: Units = [...g.units];
        // Never inside the model unit's pair, and after the model for `vllm serve`'s positional.
        for (const [at, u] of g.roles) units.splice(1 + (at % units.length), 0, u);
        const env = [...g.env];
        for (const [at, e] of g.extraEnv) env.splice(at % (env.length + 1), 0, e);
        const plain = pod(g.units, g.env);
        const dressed = pod(units, env);
        assert.equal(classifyPod(dressed).model, classifyPod(plain).model);
        assert.equal(hashOf(dressed), hashOf(plain));
      },
    ),
    1000,
  );
});

test("credentials never split a cache and never reach the inputs, in any position", async (t) => {
  const secret = fc.stringMatching(/^[A-Za-z0-9]{16,24}$/);
  type Slot = (s: string) => Partial<V1Container>;
  const slots: Slot[] = [
    (s) => ({ env: [{ name: "HF_TOKEN", value: s }] }),
    (s) => ({ env: [{ name: "SOME_API_KEY", value: s }] }),
    (s) => ({ env: [{ name: "HF_ENDPOINT", value: `https://user:${s}@hub.example/` }] }),
    (s) => ({ env: [{ name: "SRC", value: `https://hub.example/m?token=${s}&x=1` }] }),
    (s) => ({ args: ["--hf-token", s] }),
    (s) => ({ args: [`--api-key=${s}`] }),
    (s) => ({ args: [`--hf-token ${s}`] }),
    (s) => ({ args: [`--model=https://${s}@hub.example/org/m`] }),
    (s) => ({ command: ["sh", "-c", `HF_TOKEN=${s} vllm serve org/m --api-key ${s}`] }),
    (s) => ({
      command: ["bash", "-lc", `export NGC_API_KEY=${s}; sh -c "python3 -m x --model org/m --token=${s}"`],
    }),
  ];
  await holds(
    t,
    fc.property(
      fc.subarray(
        slots.map((_, i) => i),
        { minLength: 1 },
      ),
      secret,
      secret,
      (chosen, s1, s2) => {
        fc.pre(s1 !== s2);
        const pod = (s: string): V1Pod => {
          const c: V1Container = {
            name: "main",
            image: "img:1",
            command: ["vllm", "serve"],
            args: ["org/m"],
            env: [],
            resources: { limits: { "nvidia.com/gpu": "1" } },
          };
          for (const i of chosen) {
            const part = slots[i]!(s);
            if (part.env) c.env = [...c.env!, ...part.env];
            if (part.args) c.args = [...c.args!, ...part.args];
            if (part.command) {
              c.command = part.command;
              c.args = [];
            }
          }
          return { metadata: {}, spec: { containers: [c] } };
        };
        const a = cacheHash(pod(s1), classifyPod(pod(s1)));
        const b = cacheHash(pod(s2), classifyPod(pod(s2)));
        assert.equal(a.hash, b.hash);
        const inputs = JSON.stringify(a.inputs);
        assert.ok(!inputs.includes(s1), `the secret reached the inputs: ${inputs}`);
      },
    ),
    600,
  );
});

// ---------------------------------------------------------------------------------------------
// The patch builder: a patch always applies to the pod it was built from and gives the decorated
// pod; the pod's own command and args are never touched; the pod's own env stays as written.

const template: fc.Arbitrary<CacheEnvTemplate> = fc.oneof(
  fc.constant(undefined as unknown as CacheEnvTemplate),
  fc.array(
    fc.record({
      name: fc.constantFrom("HF_HOME", "HF_HUB_OFFLINE", "HOME", "X_CACHE", "FOO"),
      value: fc.oneof(fc.constant("{root}/model"), text),
    }),
    { maxLength: 5 },
  ),
);
const decoration = fc.record({
  role: fc.constantFrom<Role>("leader", "follower", "restore", "cold"),
  hash: fc.stringMatching(/^[0-9a-f]{64}$/),
  reason: fc.option(text, { nil: undefined }),
  cacheRoot: fc.option(fc.constantFrom("/warmstart/cache-root", "/c", "/a b/ü"), { nil: undefined }),
  cacheEnvTemplate: template,
  electionId: word,
  sizeLimit: fc.constantFrom("200Gi", "1Ti", "10M"),
  prewarm: fc.boolean(),
  prewarmParallelism: fc.oneof(fc.integer({ min: -3, max: 64 }), fc.constantFrom(Number.NaN, 2.5, 1e9)),
  image: fc.constantFrom("ghcr.io/warmstart/warmstart:0.1.0", "w@sha256:" + "a".repeat(64)),
  treePath: fc.option(fc.constantFrom("", ".", "trees/abc", "x y"), { nil: undefined }),
  shadowSizeLimit: fc.option(fc.constantFrom("1Gi", ""), { nil: undefined }),
  waitTimeoutSeconds: fc.option(fc.integer({ min: 1, max: 10_000 }), { nil: undefined }),
});

type DecorationCase = typeof decoration extends fc.Arbitrary<infer T> ? T : never;

function decorate(pod: V1Pod, d: DecorationCase): V1Pod {
  const base = {
    hash: d.hash,
    reason: d.reason,
    cacheRoot: d.cacheRoot,
    cacheEnvTemplate: d.cacheEnvTemplate,
  };
  const restore = {
    ...base,
    image: d.image,
    prewarm: d.prewarm,
    prewarmParallelism: d.prewarmParallelism,
    shadowSizeLimit: d.shadowSizeLimit,
    waitTimeoutSeconds: d.waitTimeoutSeconds,
  };
  switch (d.role) {
    case "leader":
      return decorateLeader(pod, { ...base, electionId: d.electionId, sizeLimit: d.sizeLimit });
    case "follower":
      return decorateFollower(pod, restore);
    case "restore":
      return decorateRestore(pod, { ...restore, treePath: d.treePath });
    case "cold":
      return decorateCold(pod, { hash: d.hash, reason: d.reason ?? "" });
  }
}

/** The patch a webhook sends, through JSON as on the wire, applied with validation. */
function applyWire(original: V1Pod, ops: Operation[]): V1Pod {
  const wire = JSON.parse(JSON.stringify(ops)) as Operation[];
  return jsonpatch.applyPatch(structuredClone(original), wire, true, false).newDocument;
}

test("every decoration's patch applies to the pod it was built from and gives the decorated pod", async (t) => {
  await holds(
    t,
    fc.property(downloader, decoration, fc.boolean(), (sent, d, strip) => {
      const frozen = structuredClone(sent);
      // As the webhook does it: the author's stamps removed, then decorated.
      const pod = strip ? stripStamps(sent).pod : sent;
      const decorated = decorate(pod, d);
      assert.deepEqual(sent, frozen, "the pod it was given is never changed");

      const ops = jsonPatch(sent, decorated);
      assert.deepEqual(applyWire(sent, ops), JSON.parse(JSON.stringify(decorated)));

      // The pod's own containers keep their command and args exactly, and their own env in place.
      const argvOf = (cs: V1Container[] | undefined): unknown => (cs ?? []).map((c) => [c.command, c.args]);
      assert.deepEqual(argvOf(decorated.spec?.containers), argvOf(sent.spec?.containers));
      // Init containers: ours first (a restore), then the pod's own, untouched. An init container of
      // the pod's wearing one of our names is ours from an earlier decoration: it is replaced.
      const ours = [LEGACY_INIT_WAIT_READY, INIT_SEED, INIT_PREWARM];
      const theirs = (cs: V1Container[] | undefined): V1Container[] =>
        (cs ?? []).filter((c) => !ours.includes(c.name));
      assert.deepEqual(theirs(decorated.spec?.initContainers), theirs(sent.spec?.initContainers));
      if (d.role === "leader" || d.role === "cold")
        assert.deepEqual(decorated.spec?.initContainers, sent.spec?.initContainers);
      const before = mainOf(sent).env ?? [];
      const now = decorated.spec!.containers[classifyPod(sent).containerIndex!]!.env ?? [];
      before.forEach((e, i) => {
        if (e.name !== ENV_TREE) assert.deepEqual(now[i], e, `env ${e.name} moved or changed`);
      });
      const offline = (env: V1EnvVar[]): number => env.filter((e) => e.name === "HF_HUB_OFFLINE").length;
      assert.equal(offline(now), offline(before), "HF_HUB_OFFLINE is never injected");

      // The stamps say the decision, and only that decision's stamps are there.
      const labels = decorated.metadata?.labels ?? {};
      const annotations = decorated.metadata?.annotations ?? {};
      assert.equal(annotations[ANN_HASH], d.hash);
      assert.equal(labels[LABEL_HASH], d.hash.slice(0, 16));
      assert.equal(annotations[ANN_ROLE], d.role);
      if (strip) {
        assert.equal(labels[LABEL_CAPTURE] === "true", d.role === "leader");
        assert.equal(annotations[ANN_ELECTION_ID] !== undefined, d.role === "leader");
        assert.equal(labels[LABEL_GATED] === "true", d.role === "follower");
        const gates = (decorated.spec?.schedulingGates ?? []).filter((g) => g.name === SCHEDULING_GATE);
        assert.equal(gates.length, d.role === "follower" ? 1 : 0);
      }
      if (d.role === "restore" || d.role === "follower") {
        const names = (decorated.spec?.initContainers ?? []).map((c) => c.name);
        assert.equal(names[0], INIT_SEED);
        assert.ok(!names.includes(LEGACY_INIT_WAIT_READY));
      }
    }),
    800,
  );
});
