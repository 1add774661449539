/**
 * The links between the local cluster's real nodes. They share the host's network, so each real
 * node gets an address of its own on loopback (127.0.1.<k+1>: every 127/8 address is local), and
 * its node agent serves its trees to peers there. `--node-link-mbit` then shapes what each node
 * sends (its uplink) with an HTB class on the loopback device, classified by source address: a
 * tree served by one node reaches the others at the link rate, not at memory speed. Other
 * loopback traffic (API server, hub, kubelets) goes through an unshaped class.
 *
 * A receiver's own rate is not capped (its requests leave from 127.0.0.1): a node filling from
 * two peers gets up to twice the rate, as a node whose downlink is wider than each uplink would.
 */
import { execFile } from "node:child_process";
import { promisify } from "node:util";

const run = promisify(execFile);
const DEV = "lo";
/** Class ids under the root: 1:1 unshaped, 1:<k+2> node k's uplink (k < 253, as addresses). */
const MAX_NODES = 253;

/** The loopback address real node `k` (0-based) serves its peers at. */
export function realNodeAddress(k: number): string {
  if (k < 0 || k >= MAX_NODES) throw new Error(`no loopback address for real node ${k}`);
  return `127.0.1.${k + 1}`;
}

/**
 * Shapes the uplink of every address to `mbit` Mbit/s (replacing any shaping made here before).
 * Needs root (tc).
 */
export async function shapeNodeLinks(addresses: readonly string[], mbit: number): Promise<void> {
  if (!(mbit > 0)) throw new Error(`--node-link-mbit must be a positive rate, not ${mbit}`);
  if (addresses.length > MAX_NODES)
    throw new Error(`at most ${MAX_NODES} shaped nodes, not ${addresses.length}`);
  await clearNodeLinks();
  const tc = (...args: string[]): Promise<unknown> => run("tc", args);
  // A bucket of at least 10 ms of the rate and a few of loopback's 64 KiB packets.
  const burst = `${Math.max(256 * 1024, Math.ceil((mbit * 1e6) / 8 / 100))}b`;
  await tc("qdisc", "add", "dev", DEV, "root", "handle", "1:", "htb", "default", "1", "r2q", "1000");
  // Everything unmatched (API server, hub, kubelets): a class far faster than loopback needs.
  await tc("class", "add", "dev", DEV, "parent", "1:", "classid", "1:1", "htb", "rate", "400gbit");
  for (const [k, address] of addresses.entries()) {
    const id = `1:${k + 2}`;
    await tc(
      ...["class", "add", "dev", DEV, "parent", "1:", "classid", id, "htb"],
      ...["rate", `${mbit}mbit`, "ceil", `${mbit}mbit`, "burst", burst, "cburst", burst],
    );
    // A short queue: loopback's packets are up to 64 KiB, so the default 1000 would hold seconds.
    await tc("qdisc", "add", "dev", DEV, "parent", id, "handle", `${k + 10}:`, "pfifo", "limit", "64");
    await tc(
      ...["filter", "add", "dev", DEV, "parent", "1:", "protocol", "ip", "prio", "1", "u32"],
      ...["match", "ip", "src", `${address}/32`, "flowid", id],
    );
  }
}

/** Removes the shaping (loopback's default, no queue, again); nothing to do when there is none. */
export async function clearNodeLinks(): Promise<void> {
  const { stdout } = await run("tc", ["qdisc", "show", "dev", DEV]).catch(() => ({ stdout: "" }));
  if (/qdisc htb 1: root/.test(stdout)) await run("tc", ["qdisc", "del", "dev", DEV, "root"]);
}
