/**
 * The network of `npm run bench:swarm`: one bridge in a namespace of its own, and one namespace
 * per node joined to it by a veth pair whose two ends are each shaped to the link rate with a
 * token bucket (tbf): the node's end limits what it sends, the bridge's end what it receives.
 * Nothing is added to the root namespace. Every namespace made here starts with the run's prefix
 * (PREFIX unless given), and `teardown` removes them all, the veths with them: a second run with
 * another prefix leaves the first one's alone.
 */
import { execFileSync } from "node:child_process";

export const PREFIX = "wsswarm-";

const ip = (...args: string[]): void =>
  void execFileSync("ip", args, { stdio: ["ignore", "ignore", "pipe"] });
const tc = (ns: string, ...args: string[]): void =>
  void execFileSync("tc", ["-n", ns, ...args], { stdio: ["ignore", "ignore", "pipe"] });

export interface NetNode {
  /** The namespace's name. */
  ns: string;
  address: string;
}

/** Removes every namespace of `prefix` (also those a killed run left behind). */
export function teardown(prefix = PREFIX): void {
  let names: string[] = [];
  try {
    names = execFileSync("ip", ["netns", "list"], { encoding: "utf8" })
      .split("\n")
      .map((l) => l.split(" ")[0] as string)
      .filter((n) => n.startsWith(prefix));
  } catch {
    return;
  }
  for (const n of names) {
    try {
      ip("netns", "del", n);
    } catch {
      // Already gone.
    }
  }
}

/**
 * `names.length` nodes on one bridge, node k at 10.77.<k / 200>.<k % 200 + 10>/16, every link
 * `mbit` Mbit/s each way.
 */
export function setup(names: readonly string[], mbit: number, prefix = PREFIX): NetNode[] {
  teardown(prefix);
  const bridge = `${prefix}br`;
  ip("netns", "add", bridge);
  ip("-n", bridge, "link", "set", "lo", "up");
  ip("-n", bridge, "link", "add", "br0", "type", "bridge");
  ip("-n", bridge, "link", "set", "br0", "up");
  // A bucket of at least 10 ms of the rate (and one GSO packet), released at most 50 ms late.
  const burst = `${Math.max(128 * 1024, Math.ceil((mbit * 1e6) / 8 / 100))}b`;
  const shape = (ns: string, dev: string): void =>
    tc(
      ns,
      "qdisc",
      "add",
      "dev",
      dev,
      "root",
      "tbf",
      "rate",
      `${mbit}mbit`,
      "burst",
      burst,
      "latency",
      "50ms",
    );
  return names.map((name, k) => {
    const ns = `${prefix}${name}`;
    const address = `10.77.${Math.floor(k / 200)}.${(k % 200) + 10}`;
    const port = `p${k}`;
    ip("netns", "add", ns);
    ip("-n", ns, "link", "set", "lo", "up");
    ip("link", "add", "name", "eth0", "netns", ns, "type", "veth", "peer", "name", port, "netns", bridge);
    ip("-n", ns, "addr", "add", `${address}/16`, "dev", "eth0");
    ip("-n", ns, "link", "set", "eth0", "up");
    ip("-n", bridge, "link", "set", port, "master", "br0");
    ip("-n", bridge, "link", "set", port, "up");
    shape(ns, "eth0");
    shape(bridge, port);
    return { ns, address };
  });
}
