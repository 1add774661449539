/**
 * `npm run bench -- datapath`: capture against `cp -a` (wall and CPU seconds, with capture's
 * BLAKE3 digests and with sha256 ones, and with its big files written through the page cache
 * instead of O_DIRECT), reading and digesting every file without copying it (what capture
 * computes beyond a copy), durable capture against `cp -a && sync -f`, prewarm of a
 * cold tree against `find | xargs cat`, prewarm of a tree already in memory against reading it
 * (looking at every file, and as a restore pod runs it after seed: `--seeded`, model files
 * only), and capture's peak memory, all on one synthetic model tree built here (large weight shards
 * plus many small compile-cache files). Every figure is the median of runs taken in alternating
 * order. A cold run first drops the tree's pages from the page cache (posix_fadvise DONTNEED per
 * file, which needs no privilege; else drop_caches).
 *
 * Sizes (env): WARMSTART_BENCH_SHARDS (4), WARMSTART_BENCH_SHARD_MB (512),
 * WARMSTART_BENCH_SMALL_FILES (20000), WARMSTART_BENCH_RUNS (2). The tree lives in a temp dir
 * that is removed at the end, and the run refuses to start without room for three copies of it.
 */
import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readSync,
  readdirSync,
  renameSync,
  rmSync,
  statfsSync,
  truncateSync,
} from "node:fs";
import { mkdir, open, rm, writeFile } from "node:fs/promises";
import { availableParallelism, loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { capture } from "../src/datapath/capture.js";
import { createDigest, DEFAULT_DIGEST } from "../src/datapath/digest.js";
import { runPool } from "./pool.js";
import { dropFromPageCache } from "../src/datapath/native.js";
import { describePrewarm, prewarm, type PrewarmResult } from "../src/datapath/prewarm.js";

const BIN = fileURLToPath(new URL("../../bin/warmstart", import.meta.url));
const MiB = 1024 * 1024;

function envInt(name: string, dflt: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === "") return dflt;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 0) throw new Error(`${name} must be a non-negative integer, got "${raw}"`);
  return n;
}

/** Deterministic sizes, so two runs of the bench build the same tree. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

async function buildTree(root: string, shards: number, shardMiB: number, small: number): Promise<number> {
  let total = 0;
  const blobs = join(root, "model/hub/models--bench--m/blobs");
  await mkdir(blobs, { recursive: true });
  const chunk = randomBytes(16 * MiB);
  for (let i = 0; i < shards; i++) {
    const fh = await open(join(blobs, `shard-${i}.safetensors`), "w");
    try {
      for (let left = shardMiB * MiB; left > 0; left -= chunk.length) {
        chunk.writeUInt32LE(i, 0); // distinct content per shard
        await fh.write(chunk, 0, Math.min(left, chunk.length));
      }
    } finally {
      await fh.close();
    }
    total += shardMiB * MiB;
  }
  const rnd = prng(42);
  const pool = randomBytes(64 * 1024);
  const kinds = ["triton", "inductor", "vllm"];
  const files = Array.from({ length: small }, (_, n) => {
    const size = 1024 + Math.floor(rnd() * 63 * 1024);
    const kind = kinds[n % kinds.length] as string;
    return {
      path: join(root, "cache", kind, `d${n % 10}`, `e${Math.floor(n / 10) % 10}`, `f${n}.bin`),
      size,
    };
  });
  for (const k of kinds)
    for (let d = 0; d < 10; d++)
      for (let e = 0; e < 10; e++) {
        await mkdir(join(root, "cache", k, `d${d}`, `e${e}`), { recursive: true });
      }
  await runPool(files, 16, async (f) => {
    await writeFile(f.path, pool.subarray(0, f.size));
  });
  total += files.reduce((n, f) => n + f.size, 0);
  return total;
}

const hasTime = existsSync("/usr/bin/time");

/** Runs a shell command; returns the CPU seconds (user + sys) it and its children used, or NaN. */
function sh(cmd: string, timeoutMs = 600_000): number {
  const out = join(tmpdir(), `ws-bench-time-${process.pid}`);
  const argv = hasTime ? ["/usr/bin/time", "-o", out, "-f", "%U %S", "sh", "-c", cmd] : ["sh", "-c", cmd];
  try {
    const r = spawnSync(argv[0] as string, argv.slice(1), {
      stdio: ["ignore", "ignore", "pipe"],
      timeout: timeoutMs,
      encoding: "utf8",
    });
    if (r.status !== 0) throw new Error(`\`${cmd}\` failed: ${r.error?.message ?? r.stderr.trim()}`);
    if (!hasTime) return NaN;
    const [u, sys] = readFileSync(out, "utf8").trim().split(/\s+/).map(Number);
    return (u ?? NaN) + (sys ?? NaN);
  } finally {
    rmSync(out, { force: true });
  }
}

interface Sample {
  wall: number;
  cpu: number;
}

/** Wall seconds, and CPU seconds: this process's (all its threads) plus what `fn` reports for
 * the children it ran. The CPU figure does not depend on what else the machine is doing. */
async function timed(fn: () => unknown): Promise<Sample> {
  const c = process.cpuUsage();
  const t = performance.now();
  const child = await fn();
  const wall = (performance.now() - t) / 1000;
  const own = process.cpuUsage(c);
  const cpu =
    (own.user + own.system) / 1e6 + (typeof child === "number" && Number.isFinite(child) ? child : 0);
  return { wall, cpu };
}

/**
 * Moves a finished run's tree out of the way without deleting its files: each is emptied (its
 * blocks freed) and the tree renamed into `trash`, removed with the bench's folder at the end.
 * On ext4 without a journal, creating a file soon after thousands were deleted scans past every
 * inode freed in the last minutes (ialloc.c, recently_deleted): measured here, 20,000 creates
 * took 3 to 10 times as long, and each run's figure depended on what ran just before it.
 */
function retire(path: string, trash: string): void {
  if (!existsSync(path)) return;
  for (const e of readdirSync(path, { withFileTypes: true, recursive: true }))
    if (e.isFile()) truncateSync(join(e.parentPath, e.name), 0);
  mkdirSync(trash, { recursive: true });
  renameSync(path, join(trash, `${Date.now()}-${Math.random().toString(36).slice(2)}`));
}

/** Reads every file of the tree and digests it as capture does, copying nothing: the CPU a
 * capture spends beyond a copy's. */
function digestTree(root: string): void {
  const buf = Buffer.allocUnsafe(4 * MiB);
  for (const e of readdirSync(root, { withFileTypes: true, recursive: true })) {
    if (!e.isFile()) continue;
    const fd = openSync(join(e.parentPath, e.name), "r");
    try {
      const h = createDigest(DEFAULT_DIGEST);
      for (let n = readSync(fd, buf); n > 0; n = readSync(fd, buf)) h.update(buf.subarray(0, n));
      h.hex();
    } finally {
      closeSync(fd);
    }
  }
}

/** Flushes dirty pages so each measured run starts from the same state. */
const settle = (): void => void sh("sync");

function dropCaches(): boolean {
  try {
    sh("sync && echo 3 > /proc/sys/vm/drop_caches", 120_000);
    return true;
  } catch {
    return false;
  }
}

/** Drops the pages of every file under `root` from the page cache (they are clean: the tree was
 * flushed when it was built). False when the kernel cannot be asked. */
function dropTree(root: string): boolean {
  for (const e of readdirSync(root, { withFileTypes: true, recursive: true })) {
    if (!e.isFile()) continue;
    const fd = openSync(join(e.parentPath, e.name), "r");
    try {
      if (!dropFromPageCache(fd)) return false;
    } finally {
      closeSync(fd);
    }
  }
  return true;
}

interface Row {
  what: string;
  samples: Sample[];
  bytes: number;
  note?: string;
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const mid = Math.floor(s.length / 2);
  return s.length % 2 ? (s[mid] as number) : ((s[mid - 1] as number) + (s[mid] as number)) / 2;
};
const wall = (xs: Sample[] | undefined): number => median((xs ?? []).map((x) => x.wall));
const cpu = (xs: Sample[] | undefined): number => median((xs ?? []).map((x) => x.cpu));

function table(rows: Row[]): string {
  // The range beside the median: on a shared VM a baseline's own time can swing twofold.
  const head = ["", "median s", "range s", "MB/s", "CPU s", ""];
  const range = (xs: Sample[]): string =>
    xs.length
      ? `${Math.min(...xs.map((x) => x.wall)).toFixed(2)}-${Math.max(...xs.map((x) => x.wall)).toFixed(2)}`
      : "n/a";
  const body = rows.map((r) => [
    r.what,
    wall(r.samples).toFixed(2),
    range(r.samples),
    (r.bytes / 1e6 / wall(r.samples)).toFixed(0),
    Number.isFinite(cpu(r.samples)) ? cpu(r.samples).toFixed(2) : "n/a",
    r.note ?? "",
  ]);
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((b) => (b[i] as string).length)));
  const line = (cells: string[]): string =>
    cells
      .map((c, i) => (i === 0 || i === 5 ? c.padEnd(widths[i] as number) : c.padStart(widths[i] as number)))
      .join("  ");
  return [line(head), ...body.map(line)].join("\n");
}

export async function runDatapathBench(): Promise<void> {
  const shards = envInt("WARMSTART_BENCH_SHARDS", 4);
  const shardMiB = envInt("WARMSTART_BENCH_SHARD_MB", 512);
  const small = envInt("WARMSTART_BENCH_SMALL_FILES", 20_000);
  const runs = Math.max(1, envInt("WARMSTART_BENCH_RUNS", 2));
  const dir = mkdtempSync(join(tmpdir(), "ws-bench-datapath-"));
  const roughBytes = shards * shardMiB * MiB + small * 33 * 1024;
  const fsInfo = statfsSync(dir);
  const free = fsInfo.bavail * fsInfo.bsize;
  if (free < 3.2 * roughBytes) {
    await rm(dir, { recursive: true, force: true });
    throw new Error(
      `datapath bench needs ${((3.2 * roughBytes) / 1e9).toFixed(1)} GB free in ${tmpdir()}, has ${(free / 1e9).toFixed(1)} GB`,
    );
  }
  process.once("SIGINT", () => {
    spawnSync("rm", ["-rf", dir]);
    process.exit(130);
  });

  const loadStart = loadavg()[0] ?? 0;
  try {
    const src = join(dir, "src");
    console.log(
      `building ${shards} x ${shardMiB} MiB shards + ${small} small files (1-64 KiB) in ${dir} ...`,
    );
    const total = await buildTree(src, shards, shardMiB, small);
    console.log(
      `tree: ${(total / 1e9).toFixed(2)} GB in ${shards + small} files; ${runs} runs each, alternating order\n`,
    );
    settle();

    // --- capture vs cp -a (source warm in the page cache, as on a leader that just loaded it)
    const t: Record<string, Sample[]> = {
      cap: [],
      capBuffered: [],
      capSha: [],
      cp: [],
      capSync: [],
      cpSync: [],
      digest: [],
    };
    let method = "";
    const fresh = (name: string): string => {
      const p = join(dir, name);
      retire(p, join(dir, "retired"));
      settle();
      return p;
    };
    const one = {
      cap: async (): Promise<void> => {
        const dest = fresh("cap");
        t.cap?.push(
          await timed(async () => {
            const m = await capture({ src, dest, progress: false, durable: false });
            method = `${m.captureMethod}${m.directBytes ? `, ${(m.directBytes / 1e9).toFixed(2)} GB O_DIRECT` : ""}`;
          }),
        );
      },
      capBuffered: async (): Promise<void> => {
        const dest = fresh("cap");
        t.capBuffered?.push(
          await timed(() => capture({ src, dest, progress: false, durable: false, directIo: false })),
        );
      },
      capSha: async (): Promise<void> => {
        const dest = fresh("cap");
        t.capSha?.push(
          await timed(() => capture({ src, dest, progress: false, durable: false, digest: "sha256" })),
        );
      },
      cp: async (): Promise<void> => {
        const dest = fresh("cp");
        t.cp?.push(await timed(() => sh(`cp -a '${src}' '${dest}'`)));
      },
      capSync: async (): Promise<void> => {
        const dest = fresh("cap");
        t.capSync?.push(await timed(() => capture({ src, dest, progress: false })));
      },
      cpSync: async (): Promise<void> => {
        const dest = fresh("cp");
        t.cpSync?.push(await timed(() => sh(`cp -a '${src}' '${dest}' && sync -f '${dest}'`)));
      },
      digest: async (): Promise<void> => {
        settle();
        t.digest?.push(await timed(() => digestTree(src)));
      },
    };
    for (let r = 0; r < runs; r++) {
      const order =
        r % 2 === 0
          ? [one.cap, one.cp, one.digest, one.capBuffered, one.capSha, one.capSync, one.cpSync]
          : [one.cpSync, one.capSync, one.capSha, one.capBuffered, one.digest, one.cp, one.cap];
      for (const f of order) await f();
    }
    fresh("cap");
    fresh("cp");

    // --- peak RSS of a capture run through the CLI
    let rss = "n/a";
    const dest = fresh("rss");
    if (existsSync("/usr/bin/time")) {
      const r = spawnSync(
        "/usr/bin/time",
        ["-f", "%M", process.execPath, BIN, "capture", src, dest, "--no-sync"],
        {
          encoding: "utf8",
          timeout: 600_000,
        },
      );
      const kb = Number(/(\d+)\s*$/.exec(r.stderr.trim())?.[1]);
      if (r.status === 0 && Number.isFinite(kb)) rss = `${(kb / 1024).toFixed(0)} MiB`;
    } else {
      const snippet = `const { capture } = await import(${JSON.stringify(new URL("../src/datapath/capture.js", import.meta.url).href)});
        await capture({ src: ${JSON.stringify(src)}, dest: ${JSON.stringify(dest)}, progress: false, durable: false });
        console.log(process.resourceUsage().maxRSS);`;
      const r = spawnSync(process.execPath, ["--input-type=module", "-e", snippet], {
        encoding: "utf8",
        timeout: 600_000,
      });
      if (r.status === 0) rss = `${(Number(r.stdout.trim()) / 1024).toFixed(0)} MiB`;
    }
    const baseRss = spawnSync("/usr/bin/time", ["-f", "%M", process.execPath, BIN, "--help"], {
      encoding: "utf8",
    });
    const baseKb = Number(/(\d+)\s*$/.exec(baseRss.stderr.trim())?.[1]);
    fresh("rss");

    // --- prewarm vs find | xargs cat, from disk: the tree's pages dropped before each run
    settle();
    const dropHow = dropTree(src) ? "fadvise" : dropCaches() ? "drop_caches" : "";
    const pw: Record<string, Sample[]> = {
      prewarm: [],
      xargs: [],
      xargsN: [],
      prewarmWarm: [],
      readWarm: [],
      xargsWarm: [],
      seededWarm: [],
      seededReadWarm: [],
    };
    const xargs = `find '${src}' -type f -print0 | xargs -0 -P6 cat > /dev/null`;
    const xargsN = `find '${src}' -type f -print0 | xargs -0 -n 64 -P6 cat > /dev/null`;
    const cold = async (f: () => unknown): Promise<Sample> => {
      if (dropHow === "fadvise") dropTree(src);
      else if (dropHow) dropCaches();
      return timed(f);
    };
    const reports: { cold?: PrewarmResult; warm?: PrewarmResult; seeded?: PrewarmResult } = {};
    for (let r = 0; r < runs; r++) {
      const steps: [string, () => unknown][] = [
        ["prewarm", async () => void (reports.cold = await prewarm({ dir: src, parallel: 6 }))],
        ["xargs", () => sh(xargs)],
        ["xargsN", () => sh(xargsN)],
      ];
      if (r % 2 === 1) steps.reverse();
      for (const [k, f] of steps) pw[k]?.push(await cold(f));
    }
    // In memory: the tree is resident (a follower on the leader's node). Prewarm looks and
    // skips; "read anyway" is the same readers without the lookup, i.e. the prewarm before it.
    sh(xargsN);
    for (let r = 0; r < runs; r++) {
      const steps: [string, () => unknown][] = [
        ["prewarmWarm", async () => void (reports.warm = await prewarm({ dir: src, parallel: 6 }))],
        ["readWarm", () => prewarm({ dir: src, parallel: 6, residency: "none" })],
        ["xargsWarm", () => sh(xargsN)],
        // As a restore pod runs it, after seed: only the model files seed leaves in place.
        [
          "seededWarm",
          async () => void (reports.seeded = await prewarm({ dir: src, parallel: 6, seeded: true })),
        ],
        ["seededReadWarm", () => prewarm({ dir: src, parallel: 6, seeded: true, residency: "none" })],
      ];
      if (r % 2 === 1) steps.reverse();
      for (const [k, f] of steps) pw[k]?.push(await timed(f));
    }
    // Informational only: never lose the figures above over it.
    const cliStart = await timed(() => sh(`'${process.execPath}' '${BIN}' prewarm '${src}' --skip`)).catch(
      () => ({ wall: NaN, cpu: NaN }),
    );

    const ratio = (base: Sample[] | undefined, ours: Sample[] | undefined): string =>
      `${(wall(base) / wall(ours)).toFixed(2)}x`;
    const coldNote = dropHow
      ? `tree's pages dropped before each run (${dropHow})`
      : "could not drop pages: both read from the page cache";
    console.log(
      table([
        {
          what: "capture, no flush",
          samples: t.cap ?? [],
          bytes: total,
          note: `${method}, ${DEFAULT_DIGEST} of every byte`,
        },
        {
          what: "capture, no flush, page cache",
          samples: t.capBuffered ?? [],
          bytes: total,
          note: "big files too (--no-direct)",
        },
        {
          what: "capture, no flush, sha256",
          samples: t.capSha ?? [],
          bytes: total,
          note: "the digest before BLAKE3",
        },
        { what: "cp -a", samples: t.cp ?? [], bytes: total },
        {
          what: "read and digest every file, no copy",
          samples: t.digest ?? [],
          bytes: total,
          note: `${DEFAULT_DIGEST}: what capture computes beyond a copy`,
        },
        { what: "capture (default: flushed before commit)", samples: t.capSync ?? [], bytes: total },
        { what: "cp -a && sync -f", samples: t.cpSync ?? [], bytes: total },
        { what: "prewarm -P6 (cold)", samples: pw.prewarm ?? [], bytes: total, note: coldNote },
        { what: "find | xargs -0 -P6 cat (cold)", samples: pw.xargs ?? [], bytes: total },
        { what: "find | xargs -0 -n64 -P6 cat (cold)", samples: pw.xargsN ?? [], bytes: total },
        {
          what: "prewarm -P6 (in memory)",
          samples: pw.prewarmWarm ?? [],
          bytes: total,
          note: "looks, skips",
        },
        {
          what: "prewarm -P6 (in memory, read anyway)",
          samples: pw.readWarm ?? [],
          bytes: total,
          note: "no residency lookup",
        },
        { what: "find | xargs -0 -n64 -P6 cat (in memory)", samples: pw.xargsWarm ?? [], bytes: total },
        {
          what: "prewarm -P6 --seeded (in memory)",
          samples: pw.seededWarm ?? [],
          bytes: total,
          note: "a restore pod's: model files only",
        },
        {
          what: "prewarm -P6 --seeded (in memory, read anyway)",
          samples: pw.seededReadWarm ?? [],
          bytes: total,
          note: "the same files, no lookup",
        },
      ]),
    );
    const cpuRatio = cpu(t.cap) / cpu(t.cp);
    const copyCpuRatio = (cpu(t.cap) - cpu(t.digest)) / cpu(t.cp);
    console.log(
      [
        "",
        `capture vs cp -a:                   ${ratio(t.cp, t.cap)} (goal >= 1.0x)`,
        `durable capture vs cp -a && sync -f: ${ratio(t.cpSync, t.capSync)} (goal >= 1.0x)`,
        `capture CPU vs cp -a CPU:           ${Number.isFinite(cpuRatio) ? cpuRatio.toFixed(2) : "n/a"}x: ${cpu(t.cap).toFixed(2)} s vs ${cpu(t.cp).toFixed(2)} s (goal <= 1.0x; ${DEFAULT_DIGEST}; with sha256: ${cpu(t.capSha).toFixed(2)} s; through the page cache: ${cpu(t.capBuffered).toFixed(2)} s)`,
        `capture CPU less the digest's vs cp: ${Number.isFinite(copyCpuRatio) ? copyCpuRatio.toFixed(2) : "n/a"}x: reading and digesting every byte alone took ${cpu(t.digest).toFixed(2)} CPU s`,
        `prewarm cold vs find|xargs -P6 cat: ${ratio(pw.xargs, pw.prewarm)} (goal >= 1.0x); vs -n64: ${ratio(pw.xargsN, pw.prewarm)}`,
        `prewarm in memory vs reading it:    ${ratio(pw.readWarm, pw.prewarmWarm)} (goal >= 5x); vs xargs -n64 cat: ${ratio(pw.xargsWarm, pw.prewarmWarm)}`,
        `restore pod's prewarm in memory:    ${ratio(pw.readWarm, pw.seededWarm)} vs reading the tree; ${ratio(pw.seededReadWarm, pw.seededWarm)} vs reading the files it looks at (--seeded: seed has read the rest)`,
        `prewarm's own line, cold:           ${reports.cold ? describePrewarm(reports.cold) : "n/a"}`,
        `prewarm's own line, in memory:      ${reports.warm ? describePrewarm(reports.warm) : "n/a"}`,
        `the same, --seeded:                 ${reports.seeded ? describePrewarm(reports.seeded) : "n/a"}`,
        `capture peak RSS (CLI):             ${rss} (goal < 256 MiB; the CLI alone: ${Number.isFinite(baseKb) ? `${(baseKb / 1024).toFixed(0)} MiB` : "n/a"})`,
        `CLI start-up (prewarm --skip):      ${cliStart.wall.toFixed(2)} s, not in the prewarm figures`,
        `load average (1 min) start/end:     ${loadStart.toFixed(1)} / ${loadavg()[0]?.toFixed(1)} on ${availableParallelism()} CPUs`,
        "CPU s: user + sys of the process and its children; unlike wall time, it does not depend on",
        "what else the machine is running.",
      ].join("\n"),
    );
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
