#!/usr/bin/env node
// Runs every test: unit tests (pure logic, in-process servers, real filesystem) and then the
// integration tests against a real local cluster (started here unless KUBECONFIG points at one).
// Usage: node scripts/test.mjs [--unit | --integration] [name-filter...]
import { spawn, spawnSync } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { join, relative } from "node:path";

const root = new URL("..", import.meta.url).pathname;
const args = process.argv.slice(2);
const only = args.find((a) => a === "--unit" || a === "--integration");
const filters = args.filter((a) => !a.startsWith("--"));

function find(dir, out = []) {
  if (!existsSync(dir)) return out;
  for (const e of readdirSync(dir)) {
    const p = join(dir, e);
    if (statSync(p).isDirectory()) find(p, out);
    else if (e.endsWith(".test.js")) out.push(p);
  }
  return out;
}
// A compiled test whose source is gone (moved or deleted since an earlier build) is stale output.
const hasSource = (f) => existsSync(join(root, relative(join(root, "dist"), f).replace(/\.js$/, ".ts")));
const pick = (files) =>
  files
    .filter(hasSource)
    .filter((f) => filters.length === 0 || filters.some((x) => f.includes(x)))
    .sort();
// Unit tests sit beside what they test: the product's under src/, the tools' under tools/ and
// bench/.
const unit = pick([
  ...find(join(root, "dist/src")),
  ...find(join(root, "dist/tools")),
  ...find(join(root, "dist/bench")),
]);
const integration = pick(find(join(root, "dist/test")));

const totals = { pass: 0, fail: 0, skipped: 0 };
function runNodeTest(files, extra, env) {
  return new Promise((resolve) => {
    const child = spawn(
      process.execPath,
      [
        "--test",
        "--test-reporter=spec",
        "--enable-source-maps",
        ...extra,
        ...files.map((f) => relative(root, f)),
      ],
      { cwd: root, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "inherit"] },
    );
    let out = "";
    child.stdout.on("data", (d) => {
      process.stdout.write(d);
      out += d.toString();
    });
    child.on("close", (code) => {
      for (const k of Object.keys(totals)) {
        const m = out.match(new RegExp(`^ℹ ${k} (\\d+)$`, "m"));
        if (m) totals[k] += Number(m[1]);
      }
      resolve(code ?? 1);
    });
  });
}

let failed = false;
if (only !== "--integration" && unit.length) {
  console.log(`\n== unit tests (${unit.length} files)`);
  // Not `failed ||= await …`: that would skip the run once something has failed.
  if ((await runNodeTest(unit, [], {})) !== 0) failed = true;
}

if (only !== "--unit" && integration.length) {
  console.log(`\n== integration tests (${integration.length} files) against a real API server`);
  let started = false;
  const env = {};
  if (!process.env.KUBECONFIG) {
    const bin = join(root, "bin/warmstart");
    const before = spawnSync(process.execPath, [bin, "cluster", "status", "-o", "json"], {
      encoding: "utf8",
    });
    const wasRunning = before.status === 0 && JSON.parse(before.stdout).running;
    // Three real nodes: replication between nodes is tested on three kubelets (about 280 MiB each).
    const up = spawnSync(process.execPath, [bin, "cluster", "up", "--real-nodes", "3"], {
      stdio: ["ignore", "inherit", "inherit"],
    });
    if (up.status !== 0) {
      console.error("could not start the local cluster");
      process.exit(1);
    }
    started = !wasRunning;
    const st = JSON.parse(
      spawnSync(process.execPath, [bin, "cluster", "status", "-o", "json"], { encoding: "utf8" }).stdout,
    );
    env.KUBECONFIG = st.kubeconfig;
    env.WARMSTART_LOCAL_CLUSTER = "1";
  }
  // One file at a time: some tests change cluster-wide things (node GPUs, stopping a role).
  if ((await runNodeTest(integration, ["--test-concurrency=1"], env)) !== 0) failed = true;
  if (started && !process.env.WARMSTART_KEEP_CLUSTER) {
    spawnSync(process.execPath, [join(root, "bin/warmstart"), "cluster", "down"], { stdio: "inherit" });
  }
}

console.log(`\ntests: ${totals.pass} passed, ${totals.fail} failed, ${totals.skipped} skipped`);
process.exit(failed || totals.fail > 0 ? 1 : 0);
