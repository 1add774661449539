/**
 * What admission reads of a pod (the classifier, the hash, the group reading: what the webhook's
 * `decide` runs before it asks the cluster anything) costs time and memory linear in the pod,
 * whatever its references expand to and however its mounts, init containers, claims and launcher
 * words multiply. Pods are untrusted: each case here is an attack that once cost seconds,
 * hundreds of megabytes, or a RangeError (and so an admission without a decision).
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import type { V1Container, V1EnvVar, V1Pod } from "@kubernetes/client-node";
import { classifyPod, type Classification } from "./classify.js";
import { EXPANSION_BUDGET_BYTES } from "./env.js";
import { cacheHash } from "./hash.js";
import { membershipOf } from "./gangs.js";

const gpu = { limits: { "nvidia.com/gpu": "1" } };

/** What `decide` reads of a pod, synchronously, with its CPU time. */
function admit(pod: V1Pod): { c: Classification; hash?: string; ms: number } {
  const cpu = process.cpuUsage();
  const c = classifyPod(pod);
  const hash = c.downloader ? cacheHash(pod, c, { scope: "namespace/ns" }).hash : undefined;
  membershipOf(pod, pod.spec?.containers?.[c.containerIndex ?? 0]);
  const used = process.cpuUsage(cpu);
  return { c, hash, ms: (used.user + used.system) / 1000 };
}

/** The process's peak RSS so far, in MB (it only grows: what it grew by bounds what a call used). */
const peakMB = (): number => process.resourceUsage().maxRSS / 1024;

/** Env entries that double a 1 KiB base nine times: 512 KiB from a few hundred bytes. */
const doubled = (name: string): V1EnvVar[] => [
  { name: `${name}0`, value: "x".repeat(1024) },
  ...Array.from({ length: 9 }, (_, i) => ({
    name: `${name}${i + 1}`,
    value: `$(${name}${i})$(${name}${i})`,
  })),
];

const attacks: Array<{ what: string; pod: () => V1Pod; reason: RegExp }> = [
  {
    // 12 500 references to a 50 KB value in the model word: 625 MB, past Node's longest string.
    what: "the model word of a `sh -c` script, `$BIG` repeated to ~100 KB",
    pod: () => ({
      metadata: { name: "p" },
      spec: {
        containers: [
          {
            name: "m",
            image: "vllm/vllm-openai",
            resources: gpu,
            env: [{ name: "BIG", value: "y".repeat(50_000) }],
            command: ["sh", "-c", `vllm serve ${"$BIG".repeat(12_500)}`],
          },
        ],
      },
    }),
    reason: /vllm serve positional/,
  },
  {
    // `${VAR}` 800 times over a value `$(VAR)` doublings built: 400 MB from a 4 KB pod.
    what: "`${VAR}` references to a value built by `$(VAR)` doublings",
    pod: () => ({
      metadata: { name: "p" },
      spec: {
        containers: [
          {
            name: "m",
            image: "vllm/vllm-openai",
            resources: gpu,
            env: doubled("A"),
            command: ["sh", "-c", `exec vllm serve ${"${A9}".repeat(800)} --port 8000`],
          },
        ],
      },
    }),
    reason: /vllm serve positional/,
  },
  {
    // Every word of a storage initializer is expanded: 10 000 words of 512 KiB each, 5 GB.
    what: "a storage initializer's script of 10 000 words, each a reference to a large value",
    pod: () => ({
      metadata: { name: "p" },
      spec: {
        volumes: [{ name: "models", emptyDir: {} }],
        initContainers: [
          {
            name: "storage-initializer",
            image: "kserve/storage-initializer",
            env: doubled("B"),
            volumeMounts: [{ name: "models", mountPath: "/mnt/models" }],
            command: ["sh", "-c", `${Array<string>(10_000).fill("$B9").join(" ")} hf://org/m`],
          },
        ],
        containers: [
          {
            name: "m",
            image: "kserve/huggingfaceserver",
            resources: gpu,
            volumeMounts: [{ name: "models", mountPath: "/mnt/models" }],
            args: ["--model", "/mnt/models"],
          },
        ],
      },
    }),
    reason: /init container storage-initializer/,
  },
];

for (const a of attacks) {
  void test(`an attack pod is read in bounded time and memory: ${a.what}`, (t) => {
    const pod = a.pod();
    const n = JSON.stringify(pod).length;
    assert.ok(n < 120_000, `${n} bytes`);
    const peak = peakMB();
    admit(a.pod()); // warm the code paths
    const r = admit(pod);
    const grew = peakMB() - peak;
    t.diagnostic(`${n} bytes: ${r.ms.toFixed(0)} ms of CPU, peak RSS +${grew.toFixed(0)} MB`);
    // Unbounded, each took seconds and hundreds of megabytes, or threw a RangeError; bounded,
    // milliseconds. Room for a slow, loaded machine.
    assert.ok(r.ms < 750, `${r.ms.toFixed(0)} ms of CPU`);
    assert.ok(grew < 100, `peak RSS grew by ${grew.toFixed(0)} MB`);
    assert.equal(r.c.downloader, true);
    assert.match(r.c.reason, a.reason);
    assert.ok(
      (r.c.model?.length ?? 0) <= n + EXPANSION_BUDGET_BYTES,
      `a ${r.c.model?.length}-character model`,
    );
    assert.match(r.hash ?? "", /^[0-9a-f]{64}$/);
  });
}

/** CPU time, the best of three (the least a loaded machine's scheduling and a GC pause added). */
function cpuOf(pod: V1Pod): number {
  let best = Infinity;
  for (let i = 0; i < 3; i++) best = Math.min(best, admit(pod).ms);
  return best;
}

/** Pods of `n` repeated parts, compared at a small and a large `n`. */
const shapes: Array<{ what: string; small: number; large: number; pod: (n: number) => V1Pod }> = [
  {
    // Each mount of the main container was looked up against every other.
    what: "mounts of a main container that names no model",
    small: 250,
    large: 4000,
    pod: (n) => ({
      spec: {
        initContainers: [{ name: "i", volumeMounts: [{ name: "v", mountPath: "/x" }], args: ["cp a b"] }],
        containers: [
          {
            name: "m",
            resources: gpu,
            args: ["serve"],
            volumeMounts: Array.from({ length: n }, (_, i) => ({ name: "v", mountPath: `/m${i}` })),
          },
        ],
      },
    }),
  },
  {
    // Each launcher word walked the flags after it to the end.
    what: "launcher words followed by flags only",
    small: 500,
    large: 16_000,
    pod: (n) => ({
      spec: { containers: [{ name: "m", resources: gpu, args: Array<string>(n).fill("-/trtllm-serve") }] },
    }),
  },
  {
    // Each container's claims were looked up in every declared claim.
    what: "containers and declared DRA claims",
    small: 500,
    large: 16_000,
    pod: (n) => ({
      spec: {
        resourceClaims: Array.from({ length: n }, (_, i) => ({
          name: `c${i}`,
          resourceClaimTemplateName: "t",
        })),
        containers: Array.from({ length: n }, (): V1Container => ({
          name: "c",
          resources: { claims: [{ name: `c${n - 1}` }] },
        })),
      },
    }),
  },
];

for (const s of shapes) {
  void test(`admission's CPU grows linearly with the pod: ${s.what}`, (t) => {
    cpuOf(s.pod(s.small)); // warm the code paths
    const small = { n: JSON.stringify(s.pod(s.small)).length, ms: cpuOf(s.pod(s.small)) };
    const large = { n: JSON.stringify(s.pod(s.large)).length, ms: cpuOf(s.pod(s.large)) };
    const sizeRatio = large.n / small.n;
    t.diagnostic(`${small.n} bytes: ${small.ms.toFixed(1)} ms; ${large.n} bytes: ${large.ms.toFixed(1)} ms`);
    // Twice the size ratio plus a constant: room for a GC pause, never for the square of the size.
    assert.ok(
      large.ms <= 2 * sizeRatio * small.ms + 100,
      `${large.ms.toFixed(0)} ms vs ${small.ms.toFixed(1)} ms at ${sizeRatio.toFixed(0)}x the size`,
    );
  });
}
