/**
 * Holding one of the local cluster's own roles still while a test runs its in-process twin, so
 * the interleaving the test sets up is the only one that happens: the role's process is stopped
 * (SIGSTOP) and continued (SIGCONT) when the test ends; its watches pick up what changed meanwhile.
 */
import type { TestContext } from "node:test";
import { readState } from "../src/localcluster/cluster.js";
import { isAlive } from "../src/localcluster/processes.js";

type After = Pick<TestContext, "after">;

/** Pauses the local cluster's process `name` (e.g. "server") until the test ends. */
export async function pauseRole(t: After, name: string): Promise<void> {
  const st = await readState();
  const rec = st?.processes.find((p) => p.name === name);
  if (!rec) throw new Error(`the local cluster runs no ${name}: these tests need \`warmstart cluster up\``);
  if (!(await isAlive(rec))) throw new Error(`the local cluster's ${name} (pid ${rec.pid}) is not running`);
  process.kill(rec.pid, "SIGSTOP");
  t.after(async () => {
    if (await isAlive(rec)) process.kill(rec.pid, "SIGCONT");
  });
}
