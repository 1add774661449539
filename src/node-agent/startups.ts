/**
 * Each pod's start, read where the kubelet keeps it: when a leader or a restored pod of this node
 * turns Ready, the node agent reads its containers' logs from the kubelet's pod log folder (no API
 * call: `kubectl logs` needs the kubelet's address, and the log may be megabytes), takes the
 * engine's own phase lines (core/engine-log.ts), and records the start on the cache's record
 * (`status.startups`), in histograms, and as an Event on the pod; a restore whose compile cache
 * missed gets a Warning saying why (core/startup.ts). For a restored pod, what its engine wrote into
 * its shadow since it started is read too (datapath/engine-writes.ts): files say more than time.
 *
 * The log is the pod's own output: it can claim any timing for itself, nothing more. It is read
 * through bounded parsing, from a path built of the pod's metadata as the API server holds it.
 */
import { open, readdir } from "node:fs/promises";
import { join } from "node:path";
import type * as k8s from "@kubernetes/client-node";
import type { Logger } from "../common/log.js";
import { ANN_HASH, ANN_ROLE, LABEL_HASH, SHADOW_VOLUME } from "../core/contract.js";
import { engineWritesSince } from "../datapath/engine-writes.js";
import { ENGINE_LOG_MAX_CHARS, readEngineLog, type EngineLogReading } from "../core/engine-log.js";
import { GPU_PRODUCT_LABEL } from "../core/gpu.js";
import {
  compileFactors,
  describeStartup,
  judgedCompileCache,
  missCause,
  startupRecord,
  withStartup,
  type EngineWrites,
} from "../core/startup.js";
import { podEvent, type AgentParts } from "./parts.js";
import { emptyDirPath } from "./store.js";

const ROLES = new Set(["leader", "follower", "restore"]);
/** How long after Ready a log without engine lines is read again (not yet flushed). */
const LOG_GRACE_MS = 60_000;
/** UIDs remembered as done; the oldest are forgotten past this (their pods are long gone). */
const REMEMBERED = 4096;

export class StartupReadings {
  private readonly done = new Set<string>();

  constructor(private readonly p: AgentParts) {}

  /** Records a Ready leader's or restore's start once; a failed write is tried on its next event. */
  async observe(pod: k8s.V1Pod, log: Logger): Promise<void> {
    const uid = pod.metadata?.uid;
    const role = pod.metadata?.annotations?.[ANN_ROLE] ?? "";
    const short = pod.metadata?.labels?.[LABEL_HASH];
    if (!uid || !short || !ROLES.has(role) || this.done.has(uid)) return;
    const ready = pod.status?.conditions?.find((c) => c.type === "Ready" && c.status === "True");
    if (!ready) return;
    // Stamps are the webhook's, but a pod admitted while it was down wears what its author wrote:
    // only the record's own hash counts, and only the leader the record names is its leader.
    // A record the informer does not hold yet may still come: only another hash is final.
    const record = this.p.record(short);
    if (!record) return;
    if (record.spec.hash !== pod.metadata?.annotations?.[ANN_HASH]) return this.remember(uid);
    if (role === "leader" && record.status?.leaderUid !== uid) return;
    const found = await this.engineLog(pod);
    if (!found) {
      // The runtime may not have flushed the last lines yet: look again at the next resync.
      const since = this.p.clock.now() - new Date(ready.lastTransitionTime ?? 0).getTime();
      if (since > LOG_GRACE_MS) this.remember(uid);
      return;
    }
    const { reading, container } = found;
    const leader = record.status?.startups?.findLast((x) => x.role === "leader");
    const entry = startupRecord({
      pod: {
        namespace: pod.metadata.namespace!,
        name: pod.metadata.name!,
        uid,
        role,
        node: this.p.cfg.node,
      },
      reading,
      gpuProduct: await this.gpuProduct(),
      factors: compileFactors(container.env),
      at: new Date(ready.lastTransitionTime ?? this.p.clock.now()).toISOString(),
    });
    // The shadow is walked only where the engine said neither hit nor miss and a leader's start
    // is there to judge against.
    const judged = role !== "leader" && entry.compileCache === "unknown" && leader;
    const writes = judged ? this.engineWrites(pod, container.name) : undefined;
    entry.compileCache = judgedCompileCache(entry, leader, writes);
    const cause = missCause(entry, leader, reading.compileCacheReason, writes);
    if (cause) entry.cause = cause;
    const r = await this.p.records.transition(short, (c) =>
      c.status?.startups?.some((x) => x.uid === uid)
        ? undefined
        : { startups: withStartup(c.status?.startups ?? [], entry) },
    );
    this.remember(uid);
    if (!r?.written) return;
    for (const [phase, s] of Object.entries(entry.seconds))
      if (typeof s === "number")
        this.p.metrics.engineStartSeconds.observe({ phase, role, engine: entry.engine }, s);
    this.p.metrics.compileCaches.inc({ result: entry.compileCache, role });
    const said = describeStartup(entry);
    log.info({ startup: entry }, "start recorded");
    if (cause)
      await podEvent(this.p, pod, "Warning", "CompileCacheMiss", `compile cache missed: ${cause}. ${said}`);
    else await podEvent(this.p, pod, "Normal", "EngineStarted", said);
  }

  private remember(uid: string): void {
    this.done.add(uid);
    if (this.done.size > REMEMBERED) this.done.delete(this.done.values().next().value!);
  }

  /** The first container whose log an engine wrote (the engine's, whatever the chart names it). */
  private async engineLog(
    pod: k8s.V1Pod,
  ): Promise<{ reading: EngineLogReading; container: k8s.V1Container } | undefined> {
    const { namespace, name, uid } = pod.metadata!;
    const podDir = join(this.p.cfg.podLogsDir, `${namespace}_${name}_${uid}`);
    for (const container of pod.spec?.containers ?? []) {
      const text = await latestLog(join(podDir, container.name)).catch(() => undefined);
      const reading = text === undefined ? undefined : readEngineLog(text);
      if (reading && reading.engine !== "unknown") return { reading, container };
    }
    return undefined;
  }

  /**
   * What the engine wrote into the pod's shadow since its container started; undefined where the
   * pod has no shadow on this node (another backend) or it could not be read whole.
   */
  private engineWrites(pod: k8s.V1Pod, container: string): EngineWrites | undefined {
    const started = pod.status?.containerStatuses?.find((c) => c.name === container)?.state?.running
      ?.startedAt;
    if (!started) return undefined;
    try {
      const shadow = emptyDirPath(this.p.cfg.kubeletRoot, pod.metadata!.uid!, SHADOW_VOLUME);
      return engineWritesSince(shadow, new Date(started).getTime());
    } catch {
      return undefined;
    }
  }

  /** The node's GPU product as it is now (read per start: GPUs can be swapped under a node name). */
  private async gpuProduct(): Promise<string | undefined> {
    const list = await this.p.core
      .listNode({ fieldSelector: `metadata.name=${this.p.cfg.node}` })
      .catch(() => undefined);
    return list?.items[0]?.metadata?.labels?.[GPU_PRODUCT_LABEL];
  }
}

/**
 * The start of the current run's log (the highest-numbered file), at most ENGINE_LOG_MAX_CHARS:
 * the phase lines come first, and a chatty engine's later lines must not push them out.
 */
async function latestLog(dir: string): Promise<string> {
  const files = (await readdir(dir)).filter((f) => /^\d{1,6}\.log$/.test(f));
  const latest = files.sort((a, b) => parseInt(a, 10) - parseInt(b, 10)).at(-1);
  if (!latest) throw new Error(`no log in ${dir}`);
  const fh = await open(join(dir, latest), "r");
  try {
    const { size } = await fh.stat();
    const length = Math.min(size, ENGINE_LOG_MAX_CHARS);
    const buf = Buffer.alloc(length);
    await fh.read(buf, 0, length, 0);
    return buf.toString("utf8");
  } finally {
    await fh.close();
  }
}
