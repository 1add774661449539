import { spawn } from "node:child_process";
import { access, constants } from "node:fs/promises";
import { join } from "node:path";
import { BINARIES, PACKAGE_ROOT, VERSIONS, binDir } from "./versions.js";

async function isExecutable(path: string): Promise<boolean> {
  return access(path, constants.X_OK).then(
    () => true,
    () => false,
  );
}

/** Paths of the control-plane binaries, building any that are missing from the Go modules. */
export async function ensureBinaries(progress: (line: string) => void): Promise<Record<string, string>> {
  const dir = binDir();
  const paths = Object.fromEntries(BINARIES.map((b) => [b, join(dir, b)]));
  const missing: string[] = [];
  for (const b of BINARIES) if (!(await isExecutable(join(dir, b)))) missing.push(b);
  if (missing.length === 0) return paths;

  if (!(await goAvailable())) {
    throw new Error(
      `the local cluster needs ${missing.join(", ")} built from Go modules, but the go command was not found; install Go 1.26+ and retry`,
    );
  }
  progress(`building ${missing.join(", ")} into ${dir} (once; later runs reuse it)`);
  const started = Date.now();
  await new Promise<void>((resolve, reject) => {
    const child = spawn("bash", [join(PACKAGE_ROOT, "src/localcluster/build-binaries.sh"), "all"], {
      env: {
        ...process.env,
        K8S_VERSION: VERSIONS.kubernetes,
        ETCD_VERSION: VERSIONS.etcd,
        KWOK_VERSION: VERSIONS.kwok,
        HELM_VERSION: VERSIONS.helm,
        WARMSTART_BIN_DIR: dir,
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let tail = "";
    const onData = (chunk: Buffer): void => {
      const text = chunk.toString();
      tail = (tail + text).slice(-4000);
      for (const line of text.split("\n"))
        if (line.startsWith("==> ")) progress(`${line.slice(4)} [${elapsed(started)}]`);
    };
    child.stdout.on("data", onData);
    child.stderr.on("data", onData);
    // A heartbeat, so a long compile never looks hung.
    const beat = setInterval(() => progress(`still building... [${elapsed(started)}]`), 60_000);
    child.on("error", reject);
    child.on("close", (code) => {
      clearInterval(beat);
      if (code === 0) resolve();
      else reject(new Error(`building the local cluster failed (exit ${code}):\n${tail.trim()}`));
    });
  });
  return paths;
}

function elapsed(since: number): string {
  const s = Math.round((Date.now() - since) / 1000);
  return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
}

function goAvailable(): Promise<boolean> {
  return new Promise((resolve) => {
    const child = spawn("go", ["version"], { stdio: "ignore" });
    child.on("error", () => resolve(false));
    child.on("close", (code) => resolve(code === 0));
  });
}
