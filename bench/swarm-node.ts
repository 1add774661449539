/**
 * One node of `npm run bench:swarm`, run by the bench inside its own network namespace
 * (`ip netns exec`): a node agent's peer server over its store and, for a receiver, the
 * receiver itself. It takes JSON lines on stdin and answers JSON lines on stdout:
 *
 *   {"op":"fill", ...}          replicate the tree from the given sources (replicateTree)
 *   {"op":"add","source":{...}} a copy the record now lists (as status.replicas would say)
 *   {"op":"stats"}              CPU seconds and peak RSS of this process so far, and the
 *                               bytes its fill has fetched so far (doneBytes of totalBytes)
 *
 * and says {"ev":"ready","url"}, {"ev":"committed",...}, {"ev":"failed",...}, {"ev":"stats",...}.
 */
import { readFileSync } from "node:fs";
import { createInterface } from "node:readline";
import { parseArgs } from "node:util";
import { shortHash } from "../src/core/contract.js";
import { replicateTree, type ReplicaSource } from "../src/node-agent/replication/receiver.js";
import { PeerServer, type TlsMaterial } from "../src/node-agent/replication/server.js";

const { values } = parseArgs({
  options: {
    store: { type: "string" },
    host: { type: "string" },
    port: { type: "string", default: "7443" },
    tls: { type: "string" },
  },
});
const tls = JSON.parse(readFileSync(values.tls as string, "utf8")) as TlsMaterial;
const say = (o: object): void => void process.stdout.write(`${JSON.stringify(o)}\n`);

const server = new PeerServer({ storeDir: values.store as string, tls });
const port = await server.listen(Number(values.port), values.host as string);
say({ ev: "ready", url: `https://${values.host}:${port}` });

interface Fill {
  op: "fill";
  hash: string;
  digest: string;
  sources: ReplicaSource[];
  chunkBytes: number;
  streams: number;
  stallMs: number;
  startAt: number;
  /** Serve the chunks held while filling. */
  serveFilling: boolean;
}

const adders: ((s: ReplicaSource) => void)[] = [];
/** The bytes the fill has fetched so far (replicateTree's onProgress). */
const progress = { doneBytes: 0, totalBytes: 0 };
const pending: ReplicaSource[] = [];

async function fill(f: Fill): Promise<void> {
  const short = shortHash(f.hash);
  try {
    const r = await replicateTree({
      hash: f.hash,
      expectedManifestDigest: f.digest,
      sources: f.sources,
      storeDir: values.store as string,
      tls,
      streams: f.streams,
      chunkBytes: f.chunkBytes,
      stallMs: f.stallMs,
      startAt: f.startAt,
      durable: false,
      onProgress: (p) => Object.assign(progress, p),
      watchSources: (add) => {
        adders.push(add);
        for (const s of pending.splice(0)) add(s);
        return () => void adders.splice(adders.indexOf(add), 1);
      },
      serveFilling: f.serveFilling ? (tree) => server.serveFilling(short, tree) : undefined,
    });
    say({ ev: "committed", receivedBytes: r.receivedBytes, bySource: r.bySource, dropped: r.dropped });
  } catch (err) {
    say({ ev: "failed", error: String((err as Error).stack ?? err) });
  }
}

for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const m = JSON.parse(line) as { op: string; source?: ReplicaSource } & Partial<Fill>;
  if (m.op === "fill") void fill(m as Fill);
  else if (m.op === "add" && m.source) {
    if (adders.length === 0) pending.push(m.source);
    for (const add of adders) add(m.source);
  } else if (m.op === "stats") {
    const cpu = process.cpuUsage();
    say({
      ev: "stats",
      cpuSeconds: (cpu.user + cpu.system) / 1e6,
      peakRssMiB: process.resourceUsage().maxRSS / 1024,
      ...progress,
    });
  }
}
await server.close();
