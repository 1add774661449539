/**
 * csi-sanity (kubernetes-csi/csi-test, from the local cluster's CSI build) against a CSI driver
 * listening on a socket, with the asserts the integration tests share: it exits 0, and at least
 * the specs that apply to the driver passed.
 */
import assert from "node:assert/strict";
import { join } from "node:path";
import type { TestContext } from "node:test";
import { runToEnd } from "./harness.js";

/**
 * Runs csi-sanity (up to 5 minutes) and asserts it passed at least `minPassed` specs (it exits 0
 * having run nothing, too). Its mount and staging folders go under `dir`. Asynchronously: the
 * driver may answer from this very process.
 */
export async function runCsiSanity(
  t: TestContext,
  o: {
    /** The csi-sanity binary. */
    sanity: string;
    /** The driver's socket. */
    endpoint: string;
    /** A controller service's socket, where the driver has none of its own. */
    controllerEndpoint?: string;
    dir: string;
    /** Ginkgo's --ginkgo.skip: the suites that do not apply. */
    skip?: string;
    minPassed: number;
  },
): Promise<void> {
  const r = await runToEnd(
    o.sanity,
    [
      `--csi.endpoint=${o.endpoint}`,
      ...(o.controllerEndpoint ? [`--csi.controllerendpoint=${o.controllerEndpoint}`] : []),
      `--csi.mountdir=${join(o.dir, "mnt")}`,
      `--csi.stagingdir=${join(o.dir, "stage")}`,
      ...(o.skip ? [`--ginkgo.skip=${o.skip}`] : []),
      "--ginkgo.no-color",
    ],
    300_000,
  );
  const summary = r.stdout.split("\n").filter((l) => /^Ran \d+|Passed \|/.test(l));
  t.diagnostic(summary.join(" | "));
  assert.equal(r.status, 0, `csi-sanity failed:\n${r.stdout.slice(-6000)}\n${r.stderr.slice(-2000)}`);
  const passed = Number(/(\d+) Passed/.exec(r.stdout)?.[1] ?? 0);
  assert.ok(
    passed >= o.minPassed,
    `csi-sanity passed ${passed} specs, expected the ${o.minPassed} that apply`,
  );
}
