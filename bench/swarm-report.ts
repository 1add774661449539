/**
 * The figures of `npm run bench:swarm` (swarm.ts): one result per N and mode, the table with
 * the goals, and the plot.
 */
import Table from "cli-table3";
import { plotByN } from "./plot.js";

export interface RunResult {
  receivers: number;
  /** "origin": every receiver pulls from the origin alone; "swarm": receivers feed each other. */
  mode: "origin" | "swarm";
  treeBytes: number;
  /** Per receiver, from the start of the run to its commit. */
  fillSeconds: number[];
  lastFillSeconds: number;
  /** Per receiver: tree bytes / fill time / link rate. */
  linkFraction: number[];
  /** Tree bytes the origin sent, over all receivers. */
  originBytes: number;
  originTrees: number;
  /** Tree bytes all receivers received (re-fetches included). */
  receivedBytes: number;
  /** CPU seconds of every process of the run (origin and receivers). */
  cpuSeconds: number;
  cpuSecondsPerGiB: number;
  originCpuSeconds: number;
  receiverPeakRssMiB: number[];
}

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
};

export function printSwarm(rs: RunResult[]): void {
  const t = new Table({
    head: [
      "N",
      "mode",
      "last node s",
      "link fraction min / median",
      "origin sent (trees)",
      "CPU s / GiB moved",
      "receiver peak RSS MiB (max)",
    ],
    style: { head: [], border: [] },
  });
  for (const r of rs)
    t.push([
      r.receivers,
      r.mode,
      r.lastFillSeconds.toFixed(1),
      `${Math.min(...r.linkFraction).toFixed(2)} / ${median(r.linkFraction).toFixed(2)}`,
      r.originTrees.toFixed(2),
      r.cpuSecondsPerGiB.toFixed(2),
      Math.max(...r.receiverPeakRssMiB).toFixed(0),
    ]);
  process.stdout.write(`${t.toString()}\n\ngoals (swarm):\n`);
  const swarm = rs.filter((r) => r.mode === "swarm");
  const base = swarm.find((r) => r.receivers === 2);
  for (const r of swarm) {
    const rate = Math.min(...r.linkFraction);
    process.stdout.write(
      `  N=${r.receivers}: slowest receiver ${rate.toFixed(2)}x its link (goal ≥ 0.8: ${rate >= 0.8 ? "met" : "not met"}); ` +
        `origin sent ${r.originTrees.toFixed(2)} trees (goal ≤ 2: ${r.originTrees <= 2 ? "met" : "not met"})` +
        (base && r !== base
          ? `; last node ${(r.lastFillSeconds / base.lastFillSeconds).toFixed(2)}x N=2's (goal ≤ 1.5 at N=16: ${r.lastFillSeconds <= 1.5 * base.lastFillSeconds ? "met" : "not met"})`
          : "") +
        "\n",
    );
  }
}

/** Where one receiver's fill stands: the tree bytes it has fetched so far, or done. */
export interface FillProgress {
  doneBytes: number;
  committed: boolean;
}

/**
 * One line of progress for a run that may take an hour: bytes fetched over every receiver, the
 * slowest receiver, and when the last should be done if the slowest keeps its rate so far.
 */
export function progressLine(
  elapsedSeconds: number,
  receivers: readonly FillProgress[],
  treeBytes: number,
): string {
  const GiB = 2 ** 30;
  const fraction = (p: FillProgress): number => (p.committed ? 1 : p.doneBytes / treeBytes);
  const done = receivers.reduce((a, p) => a + fraction(p) * treeBytes, 0);
  const filling = receivers.filter((p) => !p.committed).length;
  const slowest = Math.min(...receivers.map(fraction));
  const head =
    `${elapsedSeconds.toFixed(0)} s: ${(done / GiB).toFixed(2)} of ${((receivers.length * treeBytes) / GiB).toFixed(2)} GiB fetched, ` +
    `${filling} of ${receivers.length} filling, slowest at ${(100 * slowest).toFixed(0)}%`;
  if (slowest <= 0 || slowest >= 1) return head;
  const eta = (elapsedSeconds * (1 - slowest)) / slowest;
  return `${head}, the last done in about ${eta.toFixed(0)} s at this rate`;
}

export async function plotSwarm(rs: RunResult[]): Promise<Buffer> {
  return plotByN({
    title: "N receivers filling one tree: from the origin alone vs the swarm",
    xTitle: "receivers",
    series: "mode",
    rows: rs.flatMap((r) => [
      { N: r.receivers, mode: r.mode, metric: "last node filled (s)", value: r.lastFillSeconds },
      { N: r.receivers, mode: r.mode, metric: "origin sent (trees)", value: r.originTrees },
      { N: r.receivers, mode: r.mode, metric: "slowest receiver / link", value: Math.min(...r.linkFraction) },
    ]),
  });
}
