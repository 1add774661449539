import { execFile, spawn } from "node:child_process";
import { access, constants } from "node:fs/promises";
import { join } from "node:path";
import { buildScriptSteps, runStep } from "./run-step.js";
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
  // The folder's name carries the Kubernetes, etcd and KWOK versions; helm's is asked of helm.
  if (!missing.includes("helm") && (await versionOf(join(dir, "helm"))) !== VERSIONS.helm)
    missing.push("helm");
  if (missing.length === 0) return paths;

  if (!(await goAvailable())) {
    throw new Error(
      `the local cluster needs ${missing.join(", ")} built from Go modules, but the go command was not found; install Go 1.26+ and retry`,
    );
  }
  progress(`building ${missing.join(", ")} into ${dir} (once; later runs reuse it)`);
  await runStep("bash", [join(PACKAGE_ROOT, "tools/localcluster/build-binaries.sh"), "all"], {
    env: {
      K8S_VERSION: VERSIONS.kubernetes,
      ETCD_VERSION: VERSIONS.etcd,
      KWOK_VERSION: VERSIONS.kwok,
      HELM_VERSION: VERSIONS.helm,
      WARMSTART_BIN_DIR: dir,
    },
    show: buildScriptSteps,
    progress,
    heartbeat: "still building...",
  }).catch((err: unknown) => {
    throw new Error(`building the local cluster failed: ${(err as Error).message}`);
  });
  return paths;
}

function versionOf(helm: string): Promise<string | undefined> {
  return new Promise((resolve) =>
    execFile(helm, ["version", "--template", "{{.Version}}"], (err, stdout) =>
      resolve(err ? undefined : stdout.trim()),
    ),
  );
}

function goAvailable(): Promise<boolean> {
  return new Promise((resolve) => {
    const child = spawn("go", ["version"], { stdio: "ignore" });
    child.on("error", () => resolve(false));
    child.on("close", (code) => resolve(code === 0));
  });
}
