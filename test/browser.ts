/**
 * A real headless Chromium for tests: Debian's `chromium` (installed here with apt-get the first
 * time a test needs it), driven by playwright-core, with a fresh profile and nothing that reaches
 * the network on its own.
 */
import { spawn } from "node:child_process";
import { access, constants, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { chromium, type BrowserContext } from "playwright-core";

export const CHROMIUM = "/usr/bin/chromium";

const FLAGS = [
  "--headless",
  "--no-sandbox",
  "--disable-gpu",
  "--disable-quic",
  "--no-first-run",
  "--disable-background-networking",
  "--disable-component-update",
  "--disable-sync",
];

const present = (p: string): Promise<boolean> =>
  access(p, constants.X_OK).then(
    () => true,
    () => false,
  );

/**
 * Debian's chromium, installed when missing. Undefined (and the test skipped, saying why) only
 * when it cannot be installed: not root, or apt cannot reach its mirror.
 */
export async function ensureChromium(t: TestContext): Promise<string | undefined> {
  if (await present(CHROMIUM)) return CHROMIUM;
  if (process.getuid?.() !== 0) {
    t.skip(`${CHROMIUM} is missing and this user cannot install it (apt-get install chromium as root)`);
    return undefined;
  }
  process.stderr.write("[browser] installing Debian's chromium (once)\n");
  try {
    await aptGet(["update", "-q"]);
    await aptGet(["install", "-y", "-q", "--no-install-recommends", "chromium"]);
  } catch (err) {
    if (
      /Could not resolve|Failed to fetch|Temporary failure|Unable to locate/i.test((err as Error).message)
    ) {
      t.skip(
        `chromium could not be installed: apt cannot reach its mirror (${(err as Error).message.split("\n")[0]})`,
      );
      return undefined;
    }
    throw err;
  }
  if (!(await present(CHROMIUM))) throw new Error(`chromium was installed but ${CHROMIUM} is missing`);
  return CHROMIUM;
}

/** A browser with a fresh profile, closed (and its profile removed) when the test ends. */
export async function openBrowser(t: TestContext, executablePath: string): Promise<BrowserContext> {
  const profile = await mkdtemp(join(tmpdir(), "ws-chromium-"));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath,
    headless: true,
    args: FLAGS,
    viewport: { width: 1280, height: 900 },
  });
  t.after(async () => {
    await context.close();
    await rm(profile, { recursive: true, force: true });
  });
  return context;
}

function aptGet(args: string[]): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn("apt-get", args, {
      env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    const keep = (d: Buffer): void => {
      out = (out + d.toString()).slice(-4000);
      for (const line of d.toString().split("\n"))
        if (/^(Get:|Setting up)/.test(line)) process.stderr.write(`[browser]   apt: ${line.trim()}\n`);
    };
    child.stdout.on("data", keep);
    child.stderr.on("data", keep);
    child.on("error", (err) => reject(new Error(`apt-get: ${err.message}`)));
    child.on("close", (code) =>
      code === 0 ? resolve() : reject(new Error(`apt-get ${args.join(" ")} failed (exit ${code}):\n${out}`)),
    );
  });
}
