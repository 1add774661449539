/**
 * `npm run bench:swarm [-- --receivers 2,4,8,16 --size-mib 1024 --mbit 10 ...]`: N receivers
 * fill their stores with one committed tree, each node in its own network namespace behind a
 * link shaped to the same rate each way (swarm-net.ts), one Node.js process per node running
 * the node agent's peer server and receiver (swarm-node.ts). Side by side in one run, for each
 * N: every receiver pulling from the origin alone, and the swarm, where receivers serve the
 * chunks they hold while they fill and are announced to the others as the record would list
 * them (this process plays the record). It reports the last node's fill time, each receiver's
 * rate as a fraction of its link, the bytes the origin sent, CPU seconds per GiB moved and the
 * receivers' peak RSS: a table on stdout, JSON and a PNG plot in the output folder. Needs root
 * (namespaces, tc); every namespace, veth and process it makes is removed when it ends.
 */
import { type ChildProcess, spawn } from "node:child_process";
import { createHash, randomFillSync } from "node:crypto";
import { closeSync, mkdirSync, openSync, rmSync, writeFileSync, writeSync } from "node:fs";
import { cpus, loadavg } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";
import { createCA, issueCert } from "../src/common/certs.js";
import { shortHash } from "../src/core/contract.js";
import { capture } from "../src/datapath/capture.js";
import { manifestDigestOf } from "../src/node-agent/replication/server.js";
import { PREFIX, setup, teardown, type NetNode } from "./swarm-net.js";
import { plotSwarm, printSwarm, progressLine, type RunResult } from "./swarm-report.js";

const MiB = 2 ** 20;
const { values } = parseArgs({
  options: {
    receivers: { type: "string", default: "2,4,8,16" },
    "size-mib": { type: "string", default: "1024" },
    // 10 Mbit/s: at N = 16 the swarm moves 16 links' worth of TLS at once, which is what two
    // shared cores sustain (bench/README.md).
    mbit: { type: "string", default: "10" },
    // 64 KiB at 10 Mbit/s is 16 MiB (the node agent's chunk) at 2.5 Gbit/s: a chunk takes as
    // long to cross a link, relative to the link, as it does on a cluster's. Bigger chunks here
    // hold every hop of the relay back (bench/README.md).
    "chunk-kib": { type: "string", default: "64" },
    streams: { type: "string", default: "8" },
    // The origin alone at N = 16 on slow links gives each request a trickle: more than the
    // receiver's default 30 s without a byte happens, and would drop the only source.
    "stall-s": { type: "string", default: "120" },
    modes: { type: "string", default: "swarm,origin" },
    // How often a run says how far its receivers are (the origin alone at N = 16 takes an hour).
    "progress-s": { type: "string", default: "60" },
    out: { type: "string", default: ".bench/swarm" },
    // A V8 CPU profile of every node, one folder per run (`<mode>-<N>/<node>`), for finding what
    // a node spends its CPU on; the nodes then stop gracefully so that the profiles are written.
    "cpu-prof": { type: "string" },
    work: { type: "string", default: "/var/tmp/warmstart-bench-swarm" },
    // Another prefix (and --work) lets a second run share the machine without removing the
    // first one's namespaces.
    "netns-prefix": { type: "string", default: PREFIX },
  },
});
const counts = values.receivers.split(",").map((x) => Number(x.trim()));
if (counts.some((n) => !Number.isInteger(n) || n < 1))
  throw new Error(`--receivers: expected a list like 2,4,8, got "${values.receivers}"`);
const modes = values.modes.split(",").map((m) => m.trim()) as ("origin" | "swarm")[];
if (modes.some((m) => m !== "origin" && m !== "swarm")) throw new Error("--modes: origin and/or swarm");
const sizeBytes = Number(values["size-mib"]) * MiB;
const mbit = Number(values.mbit);
const linkBytesPerSecond = (mbit * 1e6) / 8;
const chunkBytes = Number(values["chunk-kib"]) * 1024;
const streams = Number(values.streams);
const stallMs = Number(values["stall-s"]) * 1000;
const progressMs = Number(values["progress-s"]) * 1000;
if (!(progressMs >= 1000)) throw new Error(`--progress-s: at least 1, got "${values["progress-s"]}"`);
const work = resolve(values.work);
const netnsPrefix = values["netns-prefix"];
if (!/^[a-z][a-z0-9-]{0,15}$/.test(netnsPrefix))
  throw new Error(`--netns-prefix: a short lower-case name, got "${netnsPrefix}"`);
const profileDir = values["cpu-prof"] === undefined ? undefined : resolve(values["cpu-prof"]);
/** How long a profiled node may take to write its profile and exit once its input ends. */
const PROFILE_EXIT_MS = 30_000;
/** The `ev` a line from a node that is not JSON is passed on as. */
const GARBLED = "garbled";
/** How long a node may take to send its figures (it answers at once unless it is stuck). */
const STATS_TIMEOUT_MS = 10_000;
const log = (line: string): void => void process.stderr.write(`[bench:swarm] ${line}\n`);
if (process.getuid?.() !== 0) throw new Error("bench:swarm needs root (network namespaces and tc)");

const children = new Set<ChildProcess>();
function cleanup(): void {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
  children.clear();
  teardown(netnsPrefix);
  // The tree, the stores and the keys: nothing of the run stays behind.
  rmSync(work, { recursive: true, force: true });
}
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const)
  process.on(sig, () => {
    cleanup();
    process.exit(130);
  });
process.on("exit", cleanup);

try {
  await main();
} finally {
  cleanup();
}

async function main(): Promise<void> {
  rmSync(work, { recursive: true, force: true });
  const { hash, treeBytes, originStore, digest } = await makeTree();
  const names = ["origin", ...Array.from({ length: Math.max(...counts) }, (_, i) => `r${i}`)];
  const net = setup(names, mbit, netnsPrefix);
  const tlsFiles = await certificates(names, net);
  log(`${names.length} namespaces, links at ${mbit} Mbit/s each way`);

  const loadBefore = loadavg();
  const started = Date.now();
  const results: RunResult[] = [];
  const failures: { receivers: number; mode: string; error: string }[] = [];
  // Mode by mode: the swarm's runs, which the CPUs pace, together and first (the default order),
  // then the origin alone, paced by its link and hours long at large N: other work on the
  // machine by then changes its figures least.
  for (const mode of modes)
    for (const n of counts) {
      log(`N=${n}, ${mode}`);
      try {
        const r = await runOnce(n, mode, { hash, treeBytes, originStore, digest, net, tlsFiles });
        results.push(r);
        log(`  last node ${r.lastFillSeconds.toFixed(1)} s, origin sent ${r.originTrees.toFixed(2)} trees`);
      } catch (err) {
        // A run that fails is reported as such; its processes and stores go, the next runs go on.
        failures.push({ receivers: n, mode, error: (err as Error).message });
        log(`  failed: ${(err as Error).message}`);
        for (const c of children) c.kill("SIGKILL");
        children.clear();
        rmSync(join(work, "run"), { recursive: true, force: true });
      }
    }
  results.sort((a, b) => a.receivers - b.receivers || modes.indexOf(a.mode) - modes.indexOf(b.mode));
  const machine = {
    cpus: cpus().length,
    loadBefore: loadBefore.map((x) => Number(x.toFixed(2))),
    loadAfter: loadavg().map((x) => Number(x.toFixed(2))),
    minutes: Number(((Date.now() - started) / 60_000).toFixed(1)),
  };
  const config = {
    sizeMiB: sizeBytes / MiB,
    treeBytes,
    mbit,
    chunkBytes,
    streams,
    stallMs,
    receivers: counts,
  };
  mkdirSync(values.out, { recursive: true });
  writeFileSync(
    join(values.out, "swarm.json"),
    JSON.stringify({ machine, config, results, failures }, null, 2),
  );
  writeFileSync(join(values.out, "swarm.png"), await plotSwarm(results));
  printSwarm(results);
  for (const f of failures) process.stdout.write(`failed: N=${f.receivers} ${f.mode}: ${f.error}\n`);
  process.stdout.write(
    `\nmachine: ${machine.cpus} CPUs, load ${machine.loadBefore.join(" ")} before, ` +
      `${machine.loadAfter.join(" ")} after; ${machine.minutes} min; tree ${(treeBytes / MiB).toFixed(0)} MiB, ` +
      `links ${mbit} Mbit/s, chunks ${chunkBytes / 1024} KiB, ${streams} streams per receiver\n` +
      `written: ${join(values.out, "swarm.json")}, ${join(values.out, "swarm.png")}\n`,
  );
}

/** A model-like tree (shards of up to 256 MiB and a few small files), captured with hashes. */
async function makeTree(): Promise<{ hash: string; treeBytes: number; originStore: string; digest: string }> {
  const src = join(work, "src");
  mkdirSync(join(src, "model"), { recursive: true });
  mkdirSync(join(src, "cache"), { recursive: true });
  const shard = Math.min(256 * MiB, sizeBytes);
  const block = Buffer.alloc(4 * MiB);
  const nShards = Math.ceil(sizeBytes / shard);
  for (let k = 0; k < nShards; k++) {
    const fd = openSync(join(src, "model", `model-${k + 1}-of-${nShards}.safetensors`), "w");
    for (let left = Math.min(shard, sizeBytes - k * shard); left > 0; left -= block.length) {
      randomFillSync(block);
      writeSync(fd, block, 0, Math.min(left, block.length));
    }
    closeSync(fd);
  }
  writeFileSync(join(src, "model", "config.json"), `${JSON.stringify({ model_type: "llama" })}\n`);
  writeFileSync(join(src, "model", "tokenizer.json"), Buffer.alloc(64 * 1024, "t"));
  const hash = createHash("sha256").update(`bench-swarm-${Date.now()}`).digest("hex");
  const originStore = join(work, "origin");
  const t0 = Date.now();
  const m = await capture({
    src,
    dest: join(originStore, shortHash(hash)),
    hash,
    model: "bench/swarm",
    progress: false,
    durable: false,
  });
  log(
    `captured ${(m.totalBytes / MiB).toFixed(0)} MiB (${m.digest}) in ${((Date.now() - t0) / 1000).toFixed(1)} s`,
  );
  rmSync(src, { recursive: true, force: true });
  return {
    hash,
    treeBytes: m.totalBytes,
    originStore,
    digest: manifestDigestOf(join(originStore, shortHash(hash))),
  };
}

async function certificates(names: string[], net: NetNode[]): Promise<string[]> {
  const ca = await createCA("warmstart node agents");
  const dir = join(work, "tls");
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  return Promise.all(
    names.map(async (name, k) => {
      const pem = await issueCert(ca, {
        commonName: name,
        usage: "both",
        ips: [(net[k] as NetNode).address],
      });
      const file = join(dir, `${name}.json`);
      writeFileSync(file, JSON.stringify({ ca: ca.cert, cert: pem.cert, key: pem.key }), { mode: 0o600 });
      return file;
    }),
  );
}

interface NodeProc {
  name: string;
  proc: ChildProcess;
  url: string;
  on: (ev: string, f: (m: Record<string, unknown>) => void) => void;
  once: (ev: string, f: (m: Record<string, unknown>) => void) => void;
  off: (ev: string, f: (m: Record<string, unknown>) => void) => void;
  send: (m: object) => void;
}

/** Ends a node: at once, or, when it is profiled, by closing its input (it then closes its server
 * and exits, and V8 writes the profile), killed only if it does not exit in time. */
async function stopNode(proc: ChildProcess): Promise<void> {
  proc.stdin!.end();
  if (profileDir && proc.exitCode === null && proc.signalCode === null) {
    const exited = new Promise<void>((done) => proc.once("exit", () => done()));
    const timer = setTimeout(() => proc.kill("SIGKILL"), PROFILE_EXIT_MS);
    await exited;
    clearTimeout(timer);
  } else proc.kill("SIGKILL");
  children.delete(proc);
}

/** Starts swarm-node.js in the node's namespace; resolves once its peer server listens. */
function startNode(name: string, net: NetNode, store: string, tls: string, run: string): Promise<NodeProc> {
  mkdirSync(store, { recursive: true });
  const script = join(import.meta.dirname, "swarm-node.js");
  const profile = profileDir ? ["--cpu-prof", `--cpu-prof-dir=${join(profileDir, run, name)}`] : [];
  const proc = spawn(
    "ip",
    [
      "netns",
      "exec",
      net.ns,
      process.execPath,
      ...profile,
      script,
      "--store",
      store,
      "--host",
      net.address,
      "--tls",
      tls,
    ],
    { stdio: ["pipe", "pipe", "inherit"] },
  );
  children.add(proc);
  const handlers = new Map<string, ((m: Record<string, unknown>) => void)[]>();
  createInterface({ input: proc.stdout }).on("line", (line) => {
    let m: Record<string, unknown>;
    try {
      const parsed: unknown = JSON.parse(line);
      if (typeof parsed !== "object" || parsed === null) throw new Error("not an object");
      m = parsed as Record<string, unknown>;
    } catch {
      // Not an answer: whoever waits on one is told (GARBLED), rather than the bench crashing.
      m = { ev: GARBLED, line };
    }
    for (const f of handlers.get(String(m.ev)) ?? []) f(m);
  });
  const node: NodeProc = {
    name,
    proc,
    url: "",
    on: (ev, f) => handlers.set(ev, [...(handlers.get(ev) ?? []), f]),
    once: (ev, f) => {
      const g = (m: Record<string, unknown>): void => {
        handlers.set(
          ev,
          (handlers.get(ev) ?? []).filter((h) => h !== g),
        );
        f(m);
      };
      handlers.set(ev, [...(handlers.get(ev) ?? []), g]);
    },
    off: (ev, f) =>
      void handlers.set(
        ev,
        (handlers.get(ev) ?? []).filter((h) => h !== f),
      ),
    send: (m) => void proc.stdin.write(`${JSON.stringify(m)}\n`),
  };
  return new Promise((res, rej) => {
    proc.once("exit", (code) => rej(new Error(`${name} exited (${code}) before it listened`)));
    node.on("ready", (m) => {
      node.url = String(m.url);
      res(node);
    });
  });
}

interface Usage {
  cpuSeconds: number;
  peakRssMiB: number;
  /** The tree bytes the node's fill has fetched so far (0 for the origin). */
  doneBytes: number;
}

/** A node's CPU seconds and peak RSS so far; fails after STATS_TIMEOUT_MS, or when the answer
 * does not parse (a figure missing or not a number, or a line that is not JSON). */
function stats(n: NodeProc): Promise<Usage> {
  return new Promise((res, rej) => {
    const done = (): void => {
      clearTimeout(timer);
      n.off("stats", onStats);
      n.off(GARBLED, onGarbled);
    };
    const onStats = (m: Record<string, unknown>): void => {
      done();
      const { cpuSeconds, peakRssMiB, doneBytes } = m;
      if (
        typeof cpuSeconds === "number" &&
        Number.isFinite(cpuSeconds) &&
        typeof peakRssMiB === "number" &&
        typeof doneBytes === "number"
      )
        res({ cpuSeconds, peakRssMiB, doneBytes });
      else rej(new Error(`${n.name} answered stats that do not parse: ${JSON.stringify(m)}`));
    };
    const onGarbled = (m: Record<string, unknown>): void => {
      done();
      rej(
        new Error(`${n.name} answered stats with a line that is not JSON: ${String(m.line).slice(0, 200)}`),
      );
    };
    const timer = setTimeout(() => {
      done();
      rej(new Error(`${n.name} sent no stats within ${STATS_TIMEOUT_MS / 1000} s`));
    }, STATS_TIMEOUT_MS);
    n.on("stats", onStats);
    n.on(GARBLED, onGarbled);
    n.send({ op: "stats" });
  });
}

/** Runs `tick` every `ms`, one at a time; its failures are logged, never thrown. `stop` ends it
 * once the tick under way, if any, has ended. */
function every(ms: number, tick: () => Promise<void>): { stop: () => Promise<void> } {
  let running: Promise<void> = Promise.resolve();
  let stopped = false;
  const timer = setInterval(() => {
    running = running.then(() =>
      stopped ? undefined : tick().catch((err: unknown) => log(`  (no progress: ${(err as Error).message})`)),
    );
  }, ms);
  return {
    stop: () => {
      stopped = true;
      clearInterval(timer);
      return running;
    },
  };
}

async function runOnce(
  n: number,
  mode: "origin" | "swarm",
  t: {
    hash: string;
    treeBytes: number;
    originStore: string;
    digest: string;
    net: NetNode[];
    tlsFiles: string[];
  },
): Promise<RunResult> {
  const run = `${mode}-${n}`;
  const runDir = join(work, "run", run);
  const origin = await startNode("origin", t.net[0] as NetNode, t.originStore, t.tlsFiles[0] as string, run);
  const receivers = await Promise.all(
    Array.from({ length: n }, (_, i) =>
      startNode(`r${i}`, t.net[i + 1] as NetNode, join(runDir, `r${i}`), t.tlsFiles[i + 1] as string, run),
    ),
  );
  // CPU from here on: the fill's, not the processes' start.
  const before = await Promise.all([origin, ...receivers].map(stats));
  const swarm = mode === "swarm";
  const fillSeconds: number[] = Array.from({ length: n }, () => NaN);
  const bySource: Record<string, number>[] = [];
  let receivedBytes = 0;
  const t0 = performance.now();
  const committed = new Set<number>();
  const progress = every(progressMs, async () => {
    const fills = await Promise.all(
      receivers.map(async (r, i) =>
        committed.has(i)
          ? { doneBytes: 0, committed: true }
          : { doneBytes: (await stats(r)).doneBytes, committed: false },
      ),
    );
    log(`  ${progressLine((performance.now() - t0) / 1000, fills, t.treeBytes)}`);
  });
  const deadlineMs = Math.max(120_000, ((3 * n * t.treeBytes) / linkBytesPerSecond) * 1000);
  const filled = new Promise<void>((res, rej) => {
    let left = n;
    const timer = setTimeout(
      () => rej(new Error(`N=${n} ${mode}: ${left} not done after ${deadlineMs} ms`)),
      deadlineMs,
    );
    receivers.forEach((r, i) => {
      r.on("failed", (m) => {
        clearTimeout(timer);
        rej(new Error(`${r.name} failed: ${String(m.error)}`));
      });
      r.on("committed", (m) => {
        fillSeconds[i] = (performance.now() - t0) / 1000;
        committed.add(i);
        bySource[i] = m.bySource as Record<string, number>;
        receivedBytes += Number(m.receivedBytes);
        // As the record would: the committed copy is listed for everyone still filling.
        if (swarm)
          for (const o of receivers) if (o !== r) o.send({ op: "add", source: { node: r.name, url: r.url } });
        if (--left === 0) {
          clearTimeout(timer);
          res();
        }
      });
      const others = swarm
        ? receivers.filter((o) => o !== r).map((o) => ({ node: o.name, url: o.url, filling: true }))
        : [];
      r.send({
        op: "fill",
        hash: t.hash,
        digest: t.digest,
        sources: [{ node: "origin", url: origin.url }, ...others],
        chunkBytes,
        streams,
        stallMs,
        startAt: swarm ? i / n : 0,
        serveFilling: swarm,
      });
    });
  });
  // No progress question may be out when the last figures are asked for: one answer would be
  // taken for both.
  await filled.finally(() => progress.stop());
  const usage = await Promise.all([origin, ...receivers].map(stats));
  await Promise.all([origin, ...receivers].map((p) => stopNode(p.proc)));
  rmSync(runDir, { recursive: true, force: true });
  const originBytes = bySource.reduce((a, b) => a + (b?.origin ?? 0), 0);
  const cpuSeconds = usage.reduce((a, u, k) => a + u.cpuSeconds - (before[k] as Usage).cpuSeconds, 0);
  return {
    receivers: n,
    mode,
    treeBytes: t.treeBytes,
    fillSeconds,
    lastFillSeconds: Math.max(...fillSeconds),
    linkFraction: fillSeconds.map((s) => t.treeBytes / s / linkBytesPerSecond),
    originBytes,
    originTrees: originBytes / t.treeBytes,
    receivedBytes,
    cpuSeconds,
    cpuSecondsPerGiB: cpuSeconds / (receivedBytes / 2 ** 30),
    originCpuSeconds: (usage[0] as Usage).cpuSeconds - (before[0] as Usage).cpuSeconds,
    receiverPeakRssMiB: usage.slice(1).map((u) => Number(u.peakRssMiB.toFixed(0))),
  };
}
