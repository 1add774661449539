import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { lstatSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { V1Container, V1EnvVar, V1Pod } from "@kubernetes/client-node";
import jsonpatch from "fast-json-patch";
import { classifyPod } from "./classify.js";
import {
  ANN_ELECTION_ID,
  ANN_HASH,
  ANN_INJECTED_ENV,
  ANN_REASON,
  ANN_ROLE,
  ANN_TREE,
  ENV_TREE,
  CACHE_VOLUME,
  INIT_PREWARM,
  INIT_SEED,
  LABEL_CAPTURE,
  LABEL_GATED,
  LABEL_HASH,
  RO_VOLUME,
  SCHEDULING_GATE,
  SHADOW_VOLUME,
} from "./contract.js";
import {
  DEFAULT_CACHE_ROOT,
  DEFAULT_RO_PATH,
  decorateCold,
  decorateFollower,
  decorateLeader,
  decorateRestore,
  jsonPatch,
  type FollowerOptions,
} from "./decorate.js";
import { cacheHash } from "./hash.js";

const HASH = "ab".repeat(32);
const SHORT = HASH.slice(0, 16);
const IMAGE = "ghcr.io/example/warmstart:0.1.0";
const TREE_EXPR = `$(${ENV_TREE})`;

function pod(env: V1EnvVar[] = [], extra: Partial<V1Pod["spec"]> = {}): V1Pod {
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { generateName: "llama-", namespace: "team-a", labels: { app: "llama" } },
    spec: {
      initContainers: [{ name: "user-init", image: "busybox", command: ["true"] }],
      containers: [
        { name: "proxy", image: "envoy:1.30" },
        {
          name: "main",
          image: "vllm/vllm-openai:v0.9.0",
          command: ["vllm", "serve", "Qwen/Qwen3-0.6B"],
          args: ["--port", "8000"],
          env,
          resources: { limits: { "nvidia.com/gpu": "1" } },
          volumeMounts: [{ name: "shm", mountPath: "/dev/shm" }],
        },
      ],
      volumes: [{ name: "shm", emptyDir: { medium: "Memory" } }],
      securityContext: { runAsUser: 1234, runAsNonRoot: true },
      ...extra,
    },
  };
}
const main = (p: V1Pod): V1Container => p.spec?.containers[1] as V1Container;
const envOf = (c: V1Container): Record<string, string | undefined> =>
  Object.fromEntries(
    (c.env ?? []).map((e) => [e.name, e.value ?? `valueFrom:${JSON.stringify(e.valueFrom)}`]),
  );
const inits = (p: V1Pod): V1Container[] => p.spec?.initContainers ?? [];
const initNames = (p: V1Pod): string[] => inits(p).map((c) => c.name);
const init = (p: V1Pod, name: string): V1Container => {
  const c = inits(p).find((x) => x.name === name);
  assert.ok(c, `init container ${name}`);
  return c;
};
const leader = (p: V1Pod): V1Pod =>
  decorateLeader(p, { hash: HASH, electionId: "e-123", sizeLimit: "100Gi" });
const restoreOpts = { hash: HASH, prewarm: true, prewarmParallelism: 6, image: IMAGE };
const follower = (p: V1Pod, o: Partial<FollowerOptions> = {}): V1Pod =>
  decorateFollower(p, { ...restoreOpts, ...o });

void describe("decorateLeader", () => {
  void test("capture volume, mount, cache env, labels and annotations", () => {
    const d = leader(pod());
    assert.deepEqual(
      d.spec?.volumes?.find((v) => v.name === CACHE_VOLUME),
      { name: CACHE_VOLUME, emptyDir: { sizeLimit: "100Gi" } },
    );
    assert.deepEqual(main(d).volumeMounts, [
      { name: "shm", mountPath: "/dev/shm" },
      { name: CACHE_VOLUME, mountPath: DEFAULT_CACHE_ROOT },
    ]);
    assert.deepEqual(envOf(main(d)), {
      HF_HOME: `${DEFAULT_CACHE_ROOT}/model/huggingface`,
      NIM_CACHE_PATH: `${DEFAULT_CACHE_ROOT}/model/nim`,
      TORCHINDUCTOR_CACHE_DIR: `${DEFAULT_CACHE_ROOT}/cache/torchinductor`,
      TRITON_CACHE_DIR: `${DEFAULT_CACHE_ROOT}/cache/triton`,
      VLLM_CACHE_ROOT: `${DEFAULT_CACHE_ROOT}/cache/vllm`,
      CUDA_CACHE_PATH: `${DEFAULT_CACHE_ROOT}/cache/nv`,
      HOME: `${DEFAULT_CACHE_ROOT}/cache/home`,
    });
    assert.equal(d.metadata?.labels?.[LABEL_CAPTURE], "true");
    assert.equal(d.metadata?.labels?.[LABEL_HASH], SHORT);
    assert.equal(d.metadata?.labels?.app, "llama");
    assert.equal(d.metadata?.annotations?.[ANN_HASH], HASH);
    assert.equal(d.metadata?.annotations?.[ANN_ROLE], "leader");
    assert.equal(d.metadata?.annotations?.[ANN_ELECTION_ID], "e-123");
    // The sidecar, the pod's command and its init containers are untouched.
    assert.deepEqual(d.spec?.containers[0], pod().spec?.containers[0]);
    assert.deepEqual(main(d).command, ["vllm", "serve", "Qwen/Qwen3-0.6B"]);
    assert.deepEqual(main(d).args, ["--port", "8000"]);
    assert.deepEqual(d.spec?.initContainers, pod().spec?.initContainers);
    assert.ok(!("schedulingGates" in (d.spec ?? {})));
  });

  void test("env the pod sets itself is respected, in any form", () => {
    const own: V1EnvVar[] = [
      { name: "HF_HOME", value: "/data/hf" },
      { name: "HOME", valueFrom: { configMapKeyRef: { name: "c", key: "home" } } },
    ];
    const d = leader(pod(own));
    const env = envOf(main(d));
    assert.equal(env.HF_HOME, "/data/hf");
    assert.match(env.HOME ?? "", /^valueFrom:/);
    assert.equal(env.TRITON_CACHE_DIR, `${DEFAULT_CACHE_ROOT}/cache/triton`);
    assert.equal(main(d).env?.filter((e) => e.name === "HF_HOME").length, 1);
    // What was injected is known from the template: nothing on the pod records it.
    assert.equal(d.metadata?.annotations?.[ANN_INJECTED_ENV], undefined);
  });

  void test("a forged injected-env annotation removes none of the pod's own env", () => {
    const own: V1EnvVar[] = [
      { name: "HF_ENDPOINT", value: "https://mirror.local" },
      { name: "MY_SETTING", value: "x" },
      { name: "HF_HOME", value: "/data/hf" },
    ];
    const p = pod(own);
    p.metadata!.annotations = { [ANN_INJECTED_ENV]: "HF_ENDPOINT,MY_SETTING,HF_HOME" };
    for (const d of [leader(p), follower(p), decorateRestore(p, restoreOpts)]) {
      const env = envOf(main(d));
      assert.equal(env.HF_ENDPOINT, "https://mirror.local");
      assert.equal(env.MY_SETTING, "x");
      assert.equal(env.HF_HOME, "/data/hf", "the pod's own cache location is not overwritten");
    }
  });

  void test("a configurable root and template; HF_HUB_OFFLINE is never set, even when the template asks", () => {
    const d = decorateLeader(pod(), {
      hash: HASH,
      electionId: "e",
      sizeLimit: "1Gi",
      cacheRoot: "/c",
      cacheEnvTemplate: [
        { name: "HF_HOME", value: "{root}/model/hf" },
        { name: "HF_HUB_OFFLINE", value: "1" },
        { name: "XDG_CACHE_HOME", value: "{root}/cache/xdg" },
      ],
    });
    assert.deepEqual(envOf(main(d)), { HF_HOME: "/c/model/hf", XDG_CACHE_HOME: "/c/cache/xdg" });
    assert.deepEqual(main(d).volumeMounts?.at(-1), { name: CACHE_VOLUME, mountPath: "/c" });
    for (const p of [leader(pod()), follower(pod()), decorateRestore(pod(), restoreOpts)]) {
      assert.ok(!JSON.stringify(p).includes("HF_HUB_OFFLINE"));
    }
  });

  void test("the hash is the pod's as written: the same whatever template decorates it", () => {
    // The hash is composed once, before decoration; two templates decorate differently
    // but the stamp each carries is the hash of the pod as written.
    const p = pod([{ name: "MAX_LEN", value: "4096" }]);
    const h = cacheHash(p, classifyPod(p)).hash;
    const a = decorateLeader(p, { hash: h, electionId: "e", sizeLimit: "1Gi" });
    const b = decorateLeader(p, {
      hash: h,
      electionId: "e",
      sizeLimit: "1Gi",
      cacheEnvTemplate: [{ name: "HF_HOME", value: "{root}/hf" }],
    });
    assert.notDeepEqual(main(a).env, main(b).env);
    assert.equal(a.metadata?.annotations?.[ANN_HASH], h);
    assert.equal(b.metadata?.annotations?.[ANN_HASH], h);
    assert.equal(cacheHash(p, classifyPod(p)).hash, h, "decoration never changes the input pod");
  });

  void test("the capture volume's size limit is on the volume and in an annotation", () => {
    const d = decorateLeader(pod(), { hash: HASH, electionId: "e", sizeLimit: "750Gi" });
    assert.equal(d.spec?.volumes?.find((v) => v.name === CACHE_VOLUME)?.emptyDir?.sizeLimit, "750Gi");
    assert.equal(d.metadata?.annotations?.["warmstart.dev/capture-size-limit"], "750Gi");
  });

  void test("idempotent: decorating twice equals decorating once", () => {
    const once = leader(pod([{ name: "HF_HOME", value: "/mine" }]));
    assert.deepEqual(leader(once), once);
    assert.deepEqual(jsonPatch(once, leader(once)), []);
  });

  void test("a pod without metadata maps gets them", () => {
    const p = pod();
    delete p.metadata;
    const d = leader(p);
    assert.equal(d.metadata?.labels?.[LABEL_HASH], SHORT);
  });

  void test("a pod without containers is an error, not a crash", () => {
    assert.throws(() => leader({ spec: { containers: [] } }), /no containers/);
  });
});

void describe("decorateRestore", () => {
  void test("read-only claim, writable shadow, init containers in order, command untouched", () => {
    const d = decorateRestore(pod([{ name: "NIM_CACHE_PATH", value: "/opt/nim" }]), {
      ...restoreOpts,
      claimName: "rox-other",
    });
    assert.deepEqual(
      d.spec?.volumes?.find((v) => v.name === RO_VOLUME),
      {
        name: RO_VOLUME,
        persistentVolumeClaim: { claimName: "rox-other", readOnly: true },
      },
    );
    assert.deepEqual(
      d.spec?.volumes?.find((v) => v.name === SHADOW_VOLUME),
      { name: SHADOW_VOLUME, emptyDir: {} },
    );
    assert.deepEqual(main(d).volumeMounts, [
      { name: "shm", mountPath: "/dev/shm" },
      { name: RO_VOLUME, mountPath: DEFAULT_RO_PATH, readOnly: true, subPathExpr: TREE_EXPR },
      { name: SHADOW_VOLUME, mountPath: DEFAULT_CACHE_ROOT },
    ]);
    // The mount shows the tree whatever folder of the volume holds it: the annotation names it.
    assert.deepEqual(
      main(d).env?.find((e) => e.name === ENV_TREE),
      { name: ENV_TREE, valueFrom: { fieldRef: { fieldPath: `metadata.annotations['${ANN_TREE}']` } } },
    );
    assert.equal(d.metadata?.annotations?.[ANN_TREE], undefined, "no tree known: left to the release");
    assert.equal(
      decorateRestore(pod(), { ...restoreOpts, treePath: "abc" }).metadata?.annotations?.[ANN_TREE],
      "abc",
    );
    assert.equal(
      decorateRestore(pod(), { ...restoreOpts, treePath: "" }).metadata?.annotations?.[ANN_TREE],
      ".",
      "the volume root is '.': the kubelet refuses an empty expansion",
    );
    assert.deepEqual(initNames(d), [INIT_SEED, INIT_PREWARM, "user-init"]);
    assert.deepEqual(main(d).command, ["vllm", "serve", "Qwen/Qwen3-0.6B"]);
    assert.deepEqual(main(d).args, ["--port", "8000"]);
    assert.equal(d.metadata?.annotations?.[ANN_ROLE], "restore");
    assert.equal(d.metadata?.annotations?.[ANN_HASH], HASH);
    assert.equal(d.metadata?.labels?.[LABEL_HASH], SHORT);
    assert.equal(d.metadata?.labels?.[LABEL_CAPTURE], undefined);
    // The leader's cache env is replayed; the pod's own setting still wins.
    assert.equal(envOf(main(d)).HF_HOME, `${DEFAULT_CACHE_ROOT}/model/huggingface`);
    assert.equal(envOf(main(d)).NIM_CACHE_PATH, "/opt/nim");
  });

  void test("seed and prewarm run warmstart from the configured image, with the right mounts", () => {
    const d = decorateRestore(pod(), { ...restoreOpts, prewarmParallelism: 12 });
    const seed = init(d, INIT_SEED);
    assert.equal(seed.image, IMAGE);
    assert.deepEqual(
      [...(seed.command ?? []), ...(seed.args ?? [])],
      [
        "warmstart",
        "seed",
        "--from",
        DEFAULT_RO_PATH,
        "--to",
        DEFAULT_CACHE_ROOT,
        "--hash",
        HASH,
        "--wait",
        "600",
      ],
    );
    assert.deepEqual(seed.volumeMounts, [
      { name: RO_VOLUME, mountPath: DEFAULT_RO_PATH, readOnly: true, subPathExpr: TREE_EXPR },
      { name: SHADOW_VOLUME, mountPath: DEFAULT_CACHE_ROOT },
    ]);
    const pre = init(d, INIT_PREWARM);
    assert.equal(pre.image, IMAGE);
    assert.deepEqual(
      [...(pre.command ?? []), ...(pre.args ?? [])],
      ["warmstart", "prewarm", DEFAULT_RO_PATH, "--seeded", "--parallel", "12"],
    );
    assert.deepEqual(pre.volumeMounts, [
      { name: RO_VOLUME, mountPath: DEFAULT_RO_PATH, readOnly: true, subPathExpr: TREE_EXPR },
    ]);
    assert.equal(init(d, INIT_SEED).image, IMAGE);
  });

  void test("init containers run as the workload's UID, whichever security context names it", () => {
    const ours = (d: V1Pod): V1Container[] => inits(d).filter((x) => x.name.startsWith("warmstart-"));
    const fromPod = decorateRestore(pod(), restoreOpts);
    for (const c of ours(fromPod)) {
      assert.equal(c.securityContext?.runAsUser, 1234, c.name);
      assert.equal(c.securityContext?.runAsNonRoot, true, c.name);
      assert.equal(c.securityContext?.allowPrivilegeEscalation, false, c.name);
      assert.deepEqual(c.securityContext?.capabilities, { drop: ["ALL"] }, c.name);
    }
    assert.ok(!(init(fromPod, INIT_SEED).args ?? []).includes("--any-uid"), "UID known: plain seed");
    assert.deepEqual(fromPod.spec?.securityContext, { runAsUser: 1234, runAsNonRoot: true });

    // The main container's own context wins over the pod's.
    const p = pod();
    main(p).securityContext = { runAsUser: 2000, runAsGroup: 3000 };
    for (const c of ours(decorateRestore(p, restoreOpts))) {
      assert.equal(c.securityContext?.runAsUser, 2000, c.name);
      assert.equal(c.securityContext?.runAsGroup, 3000, c.name);
    }

    // No UID anywhere (it comes from the image's USER): the shadow is made for any UID.
    const unknown = pod();
    delete unknown.spec!.securityContext;
    const d = decorateRestore(unknown, restoreOpts);
    for (const c of ours(d)) {
      assert.equal(c.securityContext?.runAsUser, undefined, c.name);
      assert.equal(c.securityContext?.runAsNonRoot, true, c.name);
    }
    assert.deepEqual(init(d, INIT_SEED).args?.slice(-1), ["--any-uid"]);

    // A storage initializer that fills the model folder as another UID (its image's) sees the
    // shadow too: made for any UID, though the workload's own UID is known.
    const filled = pod();
    main(filled).securityContext = { runAsUser: 2000 };
    main(filled).volumeMounts = [{ name: "models", mountPath: "/mnt/models" }];
    filled.spec!.volumes = [{ name: "models", emptyDir: {} }];
    filled.spec!.initContainers = [
      {
        name: "storage-initializer",
        image: "kserve/storage-initializer",
        volumeMounts: [{ name: "models", mountPath: "/mnt/models" }],
      },
    ];
    const location = {
      path: "/mnt/models",
      kind: "model" as const,
      from: ["model path"],
      tree: "model/mnt",
      volume: "models",
    };
    const shared = decorateRestore(filled, { ...restoreOpts, locations: [location] });
    assert.deepEqual(
      init(shared, INIT_SEED).args?.slice(-1),
      ["--any-uid"],
      "the initializer's UID is not the workload's",
    );
    filled.spec!.initContainers[0]!.securityContext = { runAsUser: 2000 };
    const same = decorateRestore(filled, { ...restoreOpts, locations: [location] });
    assert.ok(!(init(same, INIT_SEED).args ?? []).includes("--any-uid"), "both run as 2000: the plain seed");
  });

  void test("WARMSTART_PREWARM as a literal decides at admission, either way", () => {
    const on = { ...restoreOpts, prewarm: true };
    const off = { ...restoreOpts, prewarm: false };
    assert.ok(initNames(decorateRestore(pod(), on)).includes(INIT_PREWARM));
    assert.ok(!initNames(decorateRestore(pod(), off)).includes(INIT_PREWARM));
    assert.ok(
      !initNames(decorateRestore(pod([{ name: "WARMSTART_PREWARM", value: "0" }]), on)).includes(
        INIT_PREWARM,
      ),
    );
    const forced = decorateRestore(pod([{ name: "WARMSTART_PREWARM", value: "1" }]), off);
    assert.ok(initNames(forced).includes(INIT_PREWARM));
    assert.ok(!(init(forced, INIT_PREWARM).args ?? []).includes("--respect-env"));
  });

  void test("WARMSTART_PREWARM from valueFrom is resolved by the init container at run time", () => {
    const ref = { configMapKeyRef: { name: "tuning", key: "prewarm" } };
    for (const profile of [true, false]) {
      const d = decorateRestore(pod([{ name: "WARMSTART_PREWARM", valueFrom: ref }]), {
        ...restoreOpts,
        prewarm: profile,
      });
      const pre = init(d, INIT_PREWARM);
      assert.deepEqual(
        pre.env?.find((e) => e.name === "WARMSTART_PREWARM"),
        { name: "WARMSTART_PREWARM", valueFrom: ref },
      );
      assert.deepEqual(pre.args?.slice(-4), [
        "--respect-env",
        "WARMSTART_PREWARM",
        "--default",
        profile ? "on" : "off",
      ]);
    }
  });

  void test("the prewarm init container decides from the resolved env at run time", () => {
    const bin = fileURLToPath(new URL("../../../bin/warmstart", import.meta.url));
    assert.equal(spawnSync(process.execPath, [bin, "prewarm", "--help"]).status, 0, "prewarm runs");
    const dir = mkdtempSync(join(tmpdir(), "warmstart-ro-"));
    try {
      writeFileSync(join(dir, "weights.bin"), "x".repeat(1000));
      const ref = { configMapKeyRef: { name: "tuning", key: "prewarm" } };
      const d = decorateRestore(pod([{ name: "WARMSTART_PREWARM", valueFrom: ref }]), {
        ...restoreOpts,
        prewarm: false,
        roPath: dir,
        warmstartCommand: [process.execPath, bin],
      });
      const pre = init(d, INIT_PREWARM);
      // What the kubelet would resolve the reference to, or leave unset.
      const run = (value: string | undefined): string => {
        const env = { ...process.env };
        delete env.WARMSTART_PREWARM;
        if (value !== undefined) env.WARMSTART_PREWARM = value;
        const r = spawnSync(pre.command?.[0] ?? "", [...(pre.command ?? []).slice(1), ...(pre.args ?? [])], {
          encoding: "utf8",
          env,
        });
        assert.equal(r.status, 0, String(r.stderr));
        return String(r.stdout);
      };
      const on = run("1");
      assert.match(on, /^prewarm: /m, "it ran");
      assert.doesNotMatch(on, /skipped/);
      assert.match(run("0"), /skipped/);
      assert.match(run(undefined), /skipped/, "unset: the profile (off) decides");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  void test("every init container runs the warmstart command of the configured image", () => {
    const d = decorateRestore(pod(), { ...restoreOpts, warmstartCommand: ["/app/bin/warmstart"] });
    for (const c of inits(d).filter((x) => x.name.startsWith("warmstart-"))) {
      assert.deepEqual(c.command, ["/app/bin/warmstart"], c.name);
      assert.equal(c.image, IMAGE, c.name);
    }
    assert.deepEqual(init(d, INIT_SEED).args?.slice(-2), ["--wait", "600"]);
  });

  void test("idempotent, and re-deciding the prewarm replaces the old init containers", () => {
    const once = decorateRestore(pod(), restoreOpts);
    assert.deepEqual(decorateRestore(once, restoreOpts), once);
    const off = decorateRestore(once, { ...restoreOpts, prewarm: false });
    assert.deepEqual(initNames(off), [INIT_SEED, "user-init"]);
    assert.equal(off.spec?.volumes?.filter((v) => v.name === RO_VOLUME).length, 1);
    assert.equal(main(off).volumeMounts?.filter((m) => m.name === SHADOW_VOLUME).length, 1);
    assert.equal(main(off).env?.filter((e) => e.name === "HF_HOME").length, 1);
  });
});

void describe("decorateFollower", () => {
  void test("restore against rox-<short>, the gate, the gated label and the follower role", () => {
    const d = follower(pod());
    assert.deepEqual(d.spec?.schedulingGates, [{ name: SCHEDULING_GATE }]);
    assert.equal(d.metadata?.labels?.[LABEL_GATED], "true");
    assert.equal(d.metadata?.labels?.[LABEL_HASH], SHORT);
    assert.equal(d.metadata?.annotations?.[ANN_ROLE], "follower");
    assert.equal(d.metadata?.annotations?.[ANN_HASH], HASH);
    assert.equal(
      d.spec?.volumes?.find((v) => v.name === RO_VOLUME)?.persistentVolumeClaim?.claimName,
      `rox-${SHORT}`,
    );
    assert.deepEqual(initNames(d), [INIT_SEED, INIT_PREWARM, "user-init"]);
  });

  void test("keeps gates the pod already has and adds ours once", () => {
    const d = follower(pod([], { schedulingGates: [{ name: "other.io/gate" }] }));
    assert.deepEqual(d.spec?.schedulingGates, [{ name: "other.io/gate" }, { name: SCHEDULING_GATE }]);
    assert.deepEqual(follower(d), d);
  });

  void test("the first init container refuses to start the workload until the ready marker exists", () => {
    // Runs the init container's own argv against the built command, as the kubelet would: it waits
    // for the marker (failing when it does not come, so the kubelet retries), then seeds.
    const bin = fileURLToPath(new URL("../../../bin/warmstart", import.meta.url));
    const base = mkdtempSync(join(tmpdir(), "warmstart-ro-"));
    const dir = join(base, "tree");
    const root = join(base, "shadow");
    try {
      const d = follower(pod(), {
        roPath: dir,
        cacheRoot: root,
        waitTimeoutSeconds: 1,
        warmstartCommand: [process.execPath, bin],
      });
      const first = inits(d)[0] as V1Container;
      assert.equal(first.name, INIT_SEED);
      assert.deepEqual(first.volumeMounts, [
        { name: RO_VOLUME, mountPath: dir, readOnly: true, subPathExpr: TREE_EXPR },
        { name: SHADOW_VOLUME, mountPath: root },
      ]);
      const run = (argv: string[]): ReturnType<typeof spawnSync> =>
        spawnSync(argv[0] ?? "", argv.slice(1), { encoding: "utf8", timeout: 20_000 });
      const argv = [...(first.command ?? []), ...(first.args ?? [])];
      const missing = run(argv);
      assert.notEqual(missing.status, 0, "no marker: fails so the kubelet retries");
      assert.match(String(missing.stderr), /timed out after 1s waiting for .*ready/);
      // A committed tree of the cache this pod was admitted against (the marker is written last).
      const src = join(base, "src");
      mkdirSync(join(src, "model"), { recursive: true });
      writeFileSync(join(src, "model", "weights.bin"), "w");
      const captured = run([process.execPath, bin, "capture", src, dir, "--hash", HASH, "--no-sync"]);
      assert.equal(captured.status, 0, String(captured.stderr));
      const ready = run(argv);
      assert.equal(ready.status, 0, `marker present: starts (${String(ready.stderr)})`);
      assert.match(String(ready.stdout), /is ready\n.*seeded/s);
      assert.ok(
        lstatSync(join(root, "model", "weights.bin")).isSymbolicLink(),
        "the model is linked in place",
      );
    } finally {
      rmSync(base, { recursive: true, force: true });
    }
  });
});

void describe("decorateCold", () => {
  void test("stamps hash, role and reason only", () => {
    const p = pod();
    const d = decorateCold(p, { hash: HASH, reason: "cache not ready for restore-from" });
    assert.equal(d.metadata?.annotations?.[ANN_ROLE], "cold");
    assert.equal(d.metadata?.annotations?.[ANN_REASON], "cache not ready for restore-from");
    assert.equal(d.metadata?.annotations?.[ANN_HASH], HASH);
    assert.equal(d.metadata?.labels?.[LABEL_HASH], SHORT);
    assert.deepEqual(d.spec, p.spec);
    assert.ok(jsonPatch(p, d).every((op) => op.path.startsWith("/metadata/")));
  });
});

void describe("jsonPatch", () => {
  const cases: Array<[string, (p: V1Pod) => V1Pod]> = [
    ["leader", leader],
    ["follower", (p) => follower(p)],
    ["restore", (p) => decorateRestore(p, restoreOpts)],
    ["cold", (p) => decorateCold(p, { hash: HASH, reason: "r" })],
  ];
  for (const [name, decorate] of cases) {
    void test(`${name}: the patch applied to the original gives the decorated pod`, () => {
      for (const original of [
        pod(),
        { ...pod([{ name: "HF_HOME", value: "/x" }]), metadata: {} },
        { spec: pod().spec },
      ]) {
        const decorated = decorate(original);
        const ops = jsonPatch(original, decorated);
        assert.ok(ops.length > 0);
        const applied = jsonpatch.applyPatch(structuredClone(original), ops, true, false).newDocument;
        assert.deepEqual(applied, decorated);
      }
    });
  }

  void test("nothing changed: an empty patch; the inputs are not mutated", () => {
    const p = pod();
    const copy = structuredClone(p);
    assert.deepEqual(jsonPatch(p, structuredClone(p)), []);
    leader(p);
    follower(p);
    assert.deepEqual(p, copy);
  });
});
