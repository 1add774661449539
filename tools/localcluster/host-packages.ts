/**
 * Debian packages the real nodes and the image build need: containerd, runc and the CNI plugins
 * to run containers; debootstrap, gcc and pip for the images. Installed by `cluster up` itself
 * (with apt-get, visible progress) the first time they are missing.
 */
import { execFile } from "node:child_process";
import { runStep } from "./run-step.js";
import { access, constants } from "node:fs/promises";

interface Need {
  /** A file the package provides, or a check of what it provides, tried before installing. */
  probe: string | (() => Promise<boolean>);
  pkg: string;
}

const NEEDS: Need[] = [
  { probe: "/usr/bin/containerd", pkg: "containerd" },
  { probe: "/usr/bin/ctr", pkg: "containerd" },
  { probe: "/usr/sbin/runc", pkg: "runc" },
  { probe: "/usr/lib/cni/loopback", pkg: "containernetworking-plugins" },
  { probe: "/usr/sbin/debootstrap", pkg: "debootstrap" },
  { probe: "/usr/bin/gcc", pkg: "gcc" },
  { probe: "/usr/lib/x86_64-linux-gnu/libc.a", pkg: "libc6-dev" },
  // The engine image's Python packages come from PyPI through the python3 on PATH.
  { probe: () => succeeds("python3", ["-m", "pip", "--version"]), pkg: "python3-pip" },
];

export const CNI_BIN_DIR = "/usr/lib/cni";

const present = (probe: Need["probe"]): Promise<boolean> =>
  typeof probe === "function"
    ? probe()
    : access(probe, constants.R_OK).then(
        () => true,
        () => false,
      );

const succeeds = (cmd: string, args: string[]): Promise<boolean> =>
  new Promise((resolve) => execFile(cmd, args, (err) => resolve(!err)));

/** Installs whatever is missing; a clear error when that cannot be done (not root, no apt). */
export async function ensureHostPackages(progress: (line: string) => void): Promise<void> {
  const missing = new Set<string>();
  for (const n of NEEDS) if (!(await present(n.probe))) missing.add(n.pkg);
  if (missing.size === 0) return;
  const pkgs = [...missing];
  if (process.getuid?.() !== 0) {
    throw new Error(
      `real nodes need the Debian packages ${pkgs.join(", ")}; install them as root (apt-get install ${pkgs.join(" ")}) or start with --real-nodes 0`,
    );
  }
  progress(`installing Debian packages for the real nodes: ${pkgs.join(", ")}`);
  await aptGet(["update", "-q"], progress);
  await aptGet(["install", "-y", "-q", "--no-install-recommends", ...pkgs], progress);
  for (const n of NEEDS)
    if (!(await present(n.probe)))
      throw new Error(
        `${n.pkg} was installed but ${typeof n.probe === "string" ? n.probe : "what it provides"} is still missing`,
      );
}

function aptGet(args: string[], progress: (line: string) => void): Promise<void> {
  return runStep("apt-get", args, {
    env: { DEBIAN_FRONTEND: "noninteractive" },
    show: (line) => (/^(Get:|Setting up|Unpacking)/.test(line) ? `  apt: ${line.trim()}` : undefined),
    progress,
  });
}
