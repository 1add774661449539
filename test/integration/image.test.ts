/**
 * The Dockerfile and the local cluster's image build (tools/localcluster/images/build.ts) make the
 * same image: the same Node.js, entrypoint, user, working directory and environment, and the same
 * layout of files (the product alone in /opt/warmstart, without tools, tests or source maps; the
 * production dependencies only). The local build is what the install test runs on a real node, with a
 * read-only root file system; this test holds the Dockerfile to it.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { IMAGE_NODE_VERSION, WARMSTART_UID, buildImages } from "../../tools/localcluster/images/build.js";
import { PACKAGE_ROOT } from "../../tools/localcluster/versions.js";

const run = promisify(execFile);

interface Dockerfile {
  args: Record<string, string>;
  stages: { from: string; lines: string[] }[];
}

/** Instructions per stage, continuation lines joined. */
function parseDockerfile(text: string): Dockerfile {
  const lines = text
    .replace(/\\\n/g, " ")
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith("#"));
  const out: Dockerfile = { args: {}, stages: [] };
  for (const l of lines) {
    const [op, ...rest] = l.split(/\s+/);
    const value = rest.join(" ");
    if (op === "FROM") out.stages.push({ from: value, lines: [] });
    else if (op === "ARG" && out.stages.length === 0) {
      const [k, v] = value.split("=");
      out.args[k!] = v ?? "";
    } else out.stages.at(-1)?.lines.push(l);
  }
  return out;
}

const listTar = async (file: string): Promise<string[]> =>
  (await run("tar", ["-tf", file], { maxBuffer: 256 << 20 })).stdout
    .split("\n")
    .filter(Boolean)
    .map((p) => p.replace(/^\.\//, "").replace(/\/$/, ""));

void test("the Dockerfile builds the image the local cluster builds", async () => {
  const df = parseDockerfile(await readFile(join(PACKAGE_ROOT, "Dockerfile"), "utf8"));
  assert.equal(df.args.NODE_VERSION, IMAGE_NODE_VERSION, "the same Node.js");
  const runtime = df.stages.at(-1)!;
  assert.match(runtime.from, /^debian:\$\{DEBIAN_SUITE\}-slim$/);
  assert.equal(df.args.DEBIAN_SUITE, "bookworm");

  const images = await buildImages(() => undefined);
  const ref = images.refs.find((r) => r.name === images.warmstart)!;
  const config = ref.config as { Entrypoint: string[]; Env: string[]; User: string; WorkingDir: string };
  const instr = (op: string): string[] =>
    runtime.lines.filter((l) => l.startsWith(`${op} `)).map((l) => l.slice(op.length + 1));
  assert.deepEqual(JSON.parse(instr("ENTRYPOINT")[0]!), config.Entrypoint);
  assert.deepEqual(instr("USER"), [config.User]);
  assert.equal(config.User, `${WARMSTART_UID}:${WARMSTART_UID}`, "non-root");
  assert.deepEqual(instr("WORKDIR"), [config.WorkingDir]);
  assert.deepEqual(instr("ENV")[0]!.split(" ").sort(), [...config.Env].sort());

  // The layout: what the Dockerfile copies into the runtime stage is what the local layers hold.
  const copied = instr("COPY").map((c) => c.split(" ").at(-1)!.replace(/^\//, ""));
  const [base, node, deps, app] = await Promise.all(ref.layers.map((l) => listTar(l.file)));
  const all = new Set([...base!, ...node!, ...deps!, ...app!]);
  for (const path of copied) assert.ok(all.has(path), `${path}: in the local image too`);
  assert.ok(node!.includes("usr/local/bin/node"));
  assert.ok(all.has("usr/bin/python3"), "python3, as in the Dockerfile's packages");
  const appFiles = app!.filter((p) => p.startsWith("opt/warmstart/") || p.startsWith("usr/local/bin/"));
  const tops = new Set(appFiles.map((p) => p.split("/").slice(0, 3).join("/")));
  for (const top of tops)
    assert.ok(
      copied.some(
        (c) => top === c || top.startsWith(`${c}/`) || c.startsWith(`${top}/`) || top === "usr/local/bin",
      ),
      `${top}: the Dockerfile copies it too`,
    );
  assert.ok(!app!.some((p) => p.endsWith(".test.js") || p.endsWith(".map")), "no tests or source maps");
  // The product only: every built file is the output of a source under src/ (no tools, no tests).
  const built = app!.filter((f) => f.startsWith("opt/warmstart/dist/"));
  assert.ok(built.some((f) => f.endsWith(".js")));
  for (const p of built)
    assert.ok(
      ["opt/warmstart/dist", "opt/warmstart/dist/src"].includes(p) || p.startsWith("opt/warmstart/dist/src/"),
      `${p}: the product's build only`,
    );
  for (const p of built.filter((f) => f.endsWith(".js")))
    assert.ok(
      existsSync(join(PACKAGE_ROOT, p.slice("opt/warmstart/dist/".length).replace(/\.js$/, ".ts"))),
      `${p}: built from the product's sources`,
    );
  assert.ok(
    !deps!.some((p) => p.startsWith("opt/warmstart/node_modules/typescript/")),
    "production dependencies only",
  );
  assert.ok(
    deps!.some((p) => p.startsWith("opt/warmstart/node_modules/better-sqlite3/build/Release/")),
    "native modules built",
  );

  // The entrypoint script is the same text in both.
  const printf = /printf '([^']*)'/.exec(
    runtime.lines.find((l) => l.includes("/usr/local/bin/warmstart"))!,
  )![1]!;
  const { stdout: script } = await run("tar", ["-xOf", ref.layers[3]!.file, "./usr/local/bin/warmstart"]);
  assert.equal(printf.replace(/\\n/g, "\n"), script);

  // The build context holds what the Dockerfile copies from it, and nothing the build does not need.
  const ignore = (await readFile(join(PACKAGE_ROOT, ".dockerignore"), "utf8")).split("\n");
  const fromContext = df.stages[0]!.lines.filter(
    (l) => l.startsWith("COPY ") && !l.includes("--from"),
  ).flatMap((l) => l.slice(5).split(" ").slice(0, -1));
  for (const path of fromContext)
    assert.ok(ignore.includes(`!${path}`) || ignore.includes(`!${path}/`), `${path} is in the build context`);
  assert.equal(
    ignore.find((l) => l && !l.startsWith("#")),
    "*",
    "everything else stays out",
  );
});
