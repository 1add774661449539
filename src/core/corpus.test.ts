/**
 * The compatibility corpus (test/corpus/): pods rendered from public charts and operators, with
 * what each engine really does written down before Warmstart ran on them. For every pod: the
 * classification, the model identity, the cold reason; that a leader's capture volume is mounted
 * where the engine writes its weights and compile caches; that a restore presents the same folder
 * of the tree at the same path. For every pair: hash equal or different.
 */
import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { readdirSync, readFileSync } from "node:fs";
import { join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import type { V1Container, V1Pod, V1VolumeMount } from "@kubernetes/client-node";
import { parse } from "yaml";
import { classifyPod, type Classification } from "./classify.js";
import { CACHE_VOLUME, SHADOW_VOLUME } from "./contract.js";
import { DEFAULT_CACHE_ROOT, decorateLeader, decorateRestore } from "./decorate.js";
import { literalEnv } from "./env.js";
import { followerWait, membershipOf } from "./gangs.js";
import { cacheHash } from "./hash.js";
import { normalisePath } from "./locations.js";

const CORPUS = fileURLToPath(new URL("../../../test/corpus/", import.meta.url));

interface Expect {
  downloader: boolean;
  reason?: string;
  model?: string;
  modelIncludes?: string[];
  cold?: string;
  weights?: string;
  compile?: string;
  /** The gang scheduler that places it (gangs.ts kind), if any. */
  gang?: string;
  /** The multi-node group it is a rank of: its kind, and its rank when the pod says it. */
  group?: { kind: string; rank?: string };
  /** How a follower of its hash waits under `election.followerMode: auto`. */
  follower?: "gate" | "wait";
}
interface CorpusPod {
  id: string;
  namespace?: string;
  expect: Expect;
  pod: V1Pod;
}
interface CorpusFile {
  project: string;
  source: { repository: string; path: string; commit: string };
  engine: string;
  pods: CorpusPod[];
  pairs?: Array<{ a: string; b: string; equal: boolean; why?: string }>;
}

function corpusFiles(dir: string, out: string[] = []): string[] {
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (e.isDirectory()) corpusFiles(join(dir, e.name), out);
    else if (e.name.endsWith(".yaml")) out.push(join(dir, e.name));
  }
  return out.sort();
}

const files = corpusFiles(CORPUS).map((f) => ({
  name: relative(CORPUS, f),
  file: parse(readFileSync(f, "utf8")) as CorpusFile,
}));

// --- where the engines put their files, by their own rules ---------------------------------

type Env = ReadonlyMap<string, string>;
const home = (env: Env): string => env.get("HOME") ?? "/root";
const xdgCache = (env: Env): string => env.get("XDG_CACHE_HOME") ?? `${home(env)}/.cache`;
/** The Hugging Face hub cache (huggingface_hub's constants): HF_HUB_CACHE, else HF_HOME/hub, else XDG. */
const hubCache = (env: Env): string =>
  env.get("HF_HUB_CACHE") ??
  env.get("HUGGINGFACE_HUB_CACHE") ??
  `${env.get("HF_HOME") ?? `${xdgCache(env)}/huggingface`}/hub`;

function flag(c: V1Container, name: string): string | undefined {
  const argv = [...(c.command ?? []), ...(c.args ?? [])].flatMap((a) => String(a).split(/\s+/));
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] as string;
    if (a === name) return argv[i + 1];
    if (a.startsWith(`${name}=`)) return a.slice(name.length + 1);
  }
  return undefined;
}

/** Where the engine downloads its weights in this (decorated) container. */
function weightsPath(engine: string, c: V1Container, cls: Classification): string {
  const env = literalEnv(c);
  if (engine === "nim") return env.get("NIM_CACHE_PATH") ?? "/opt/nim/.cache";
  if (cls.modelPath && cls.source) return cls.modelPath;
  if (engine.includes("vllm")) return flag(c, "--download-dir") ?? flag(c, "--download_dir") ?? hubCache(env);
  return hubCache(env);
}

/** Where vLLM (and torch.compile under it) keeps its compile cache in this container. */
function compilePath(c: V1Container): string {
  const env = literalEnv(c);
  return env.get("VLLM_CACHE_ROOT") ?? `${xdgCache(env)}/vllm`;
}

/** The mount of `volume` holding `path` in a container, and the folder of the volume it is at. */
function volumeFolder(c: V1Container, volume: string, path: string): string | undefined {
  let best: V1VolumeMount | undefined;
  for (const m of c.volumeMounts ?? []) {
    const mp = normalisePath(m.mountPath);
    if (!mp || !(path === mp || path.startsWith(`${mp}/`))) continue;
    if (!best || mp.length > (normalisePath(best.mountPath) ?? "").length) best = m;
  }
  if (!best || best.name !== volume) return undefined;
  const rest = path.slice((normalisePath(best.mountPath) ?? "").length).replace(/^\//, "");
  return [best.subPath ?? "", rest].filter(Boolean).join("/");
}

const HASH = "ab".repeat(32);

void describe("compatibility corpus", () => {
  test("holds at least 12 projects and 60 pods, each with its source", () => {
    const projects = new Set(files.map((f) => f.file.project));
    const pods = files.reduce((n, f) => n + f.file.pods.length, 0);
    assert.ok(projects.size >= 12, `${projects.size} projects: ${[...projects].join(", ")}`);
    assert.ok(pods >= 60, `${pods} pods`);
    for (const { name, file } of files) {
      assert.match(file.source.commit, /^[0-9a-f]{40}$/, `${name}: source commit`);
      assert.ok(file.source.repository && file.source.path, `${name}: source repository and path`);
    }
  });

  for (const { name, file } of files) {
    void describe(name, () => {
      for (const p of file.pods) {
        void test(`${p.id}: ${p.expect.downloader ? (p.expect.cold ? "cold" : "downloads") : "left alone"}`, () => {
          const c = classifyPod(p.pod);
          const e = p.expect;
          assert.equal(c.downloader, e.downloader, `downloader (reason: ${c.reason})`);
          const main = c.containerIndex !== undefined ? p.pod.spec?.containers[c.containerIndex] : undefined;
          const m = membershipOf(p.pod, main);
          if (e.gang !== undefined) assert.equal(m.gang?.kind, e.gang, `gang (${JSON.stringify(m.gang)})`);
          if (e.group !== undefined) {
            assert.equal(m.group?.kind, e.group.kind, `group (${JSON.stringify(m.group)})`);
            assert.equal(m.group?.rank, e.group.rank, `rank (${JSON.stringify(m.group)})`);
          }
          if (e.follower !== undefined)
            assert.equal(followerWait(m, "auto").mode, e.follower, followerWait(m, "auto").why);
          if (e.reason) assert.ok(c.reason.includes(e.reason), `reason "${c.reason}" has "${e.reason}"`);
          if (!e.downloader) return;
          if (e.model !== undefined) assert.equal(c.model, e.model, "model identity");
          for (const part of e.modelIncludes ?? [])
            assert.ok(c.model?.includes(part), `model ${c.model} has ${part}`);
          assert.equal(c.cold, e.cold, "cold reason");
          if (e.cold) return;

          const locations = c.locations?.locations ?? [];
          const opts = { hash: HASH, containerIndex: c.containerIndex, locations };
          const leader = decorateLeader(p.pod, { ...opts, electionId: "e", sizeLimit: "100Gi" });
          const restore = decorateRestore(p.pod, {
            ...opts,
            image: "warmstart:test",
            prewarm: true,
            prewarmParallelism: 6,
          });
          const idx = c.containerIndex ?? 0;
          const lc = leader.spec?.containers[idx] as V1Container;
          const rc = restore.spec?.containers[idx] as V1Container;
          const check = (
            what: string,
            expected: string | undefined,
            actual: (x: V1Container) => string,
          ): void => {
            if (expected === undefined || expected === "none") return;
            const path = normalisePath(actual(lc)) as string;
            // Where the pod names no location of its own, the engine's default is pointed into Warmstart's root.
            if (expected !== "engine-default" && !path.startsWith(`${DEFAULT_CACHE_ROOT}/`))
              assert.ok(
                path === expected || path.startsWith(`${expected}/`) || expected.startsWith(`${path}/`),
                `${what}: the engine writes ${path}, the corpus says ${expected}`,
              );
            const captured = volumeFolder(lc, CACHE_VOLUME, path);
            assert.ok(captured !== undefined, `${what} at ${path} is on the leader's capture volume`);
            assert.equal(
              normalisePath(actual(rc)),
              path,
              `${what}: a restore's engine looks at the same path`,
            );
            assert.equal(
              volumeFolder(rc, SHADOW_VOLUME, path),
              captured,
              `${what}: a restore presents the same folder of the tree there`,
            );
          };
          check("weights", e.weights, (x) => weightsPath(file.engine, x, c));
          if (file.engine.includes("vllm")) check("compile cache", e.compile, compilePath);
        });
      }
      for (const pair of file.pairs ?? []) {
        void test(`${pair.a} and ${pair.b} hash ${pair.equal ? "equal" : "apart"}`, () => {
          const pod = (id: string): V1Pod => {
            const found = file.pods.find((x) => x.id === id);
            if (!found) throw new Error(`no pod ${id}`);
            return found.pod;
          };
          const a = cacheHash(pod(pair.a), classifyPod(pod(pair.a)));
          const b = cacheHash(pod(pair.b), classifyPod(pod(pair.b)));
          if (pair.equal) assert.equal(a.hash, b.hash, pair.why);
          else assert.notEqual(a.hash, b.hash, pair.why);
        });
      }
    });
  }
});
