/**
 * Waiting followers' fills (ADR 0012): a follower that a gang or its group's other ranks wait for
 * runs at once with an empty fill volume; once its cache is Ready this node's agent copies the
 * committed tree into that volume (from its own store, or filled from peers first), and when no
 * cache will come it writes the cold marker with the reason. The pod's seed waits for either, or
 * for its deadline. A fill is a job outside the reconcile, like a capture; the reconciler is keyed
 * by pod and level-based.
 */
import { constants as fsc, lstatSync } from "node:fs";
import { open } from "node:fs/promises";
import { join } from "node:path";
import type * as k8s from "@kubernetes/client-node";
import type { ReconcileContext, ReconcileResult } from "../common/controller/controller.js";
import type { Logger } from "../common/log.js";
import { ANN_HASH, COLD_MARKER, FILL_TREE, FILL_VOLUME, READY_MARKER, shortHash } from "../core/contract.js";
import { capture, CaptureStoppedError } from "../datapath/capture.js";
import { formatBytes } from "../datapath/progress.js";
import { fetchTree, type FillDeps } from "./csi/fill.js";
import { afterFillFailure, decideFill } from "./fill-decide.js";
import { podEvent, type AgentParts } from "./parts.js";
import { emptyDirPath } from "./store.js";

/** How soon a fill whose tree is not reachable yet is tried again. */
const RETRY_MS = 2000;

interface Job {
  uid: string;
  short: string;
  abort: AbortController;
  done: Promise<void>;
}

export class WaitingFills {
  private readonly jobs = new Map<string, Job>();

  constructor(
    private readonly p: AgentParts,
    /** `ended`: look at the pod again, now or after `retryMs` (its tree is not reachable yet). */
    private readonly deps: FillDeps & { ended(podKey: string, retryMs?: number): void },
  ) {}

  /** Whether a fill reads this cache's tree now (the store budget leaves it alone). */
  busyWith(short: string): boolean {
    return [...this.jobs.values()].some((j) => j.short === short);
  }

  get size(): number {
    return this.jobs.size;
  }

  async idle(): Promise<void> {
    await Promise.all([...this.jobs.values()].map((j) => j.done));
  }

  async stopAll(): Promise<void> {
    for (const j of this.jobs.values()) j.abort.abort(new Error("node agent stopping"));
    await this.idle();
  }

  /** The pod reconciler of waiting followers (key `namespace/name`). */
  reconcile = async (key: string, { log }: ReconcileContext): Promise<ReconcileResult> => {
    const [namespace, name] = key.split("/") as [string, string];
    const pod = this.p.pod(namespace, name);
    const running = this.jobs.get(key);
    if (running && running.uid !== pod?.metadata?.uid) running.abort.abort(new Error("pod gone or replaced"));
    if (running) return;
    const hash = pod?.metadata?.annotations?.[ANN_HASH];
    const cache = hash ? this.p.record(shortHash(hash)) : undefined;
    const now = this.p.clock.now();
    const d = decideFill(pod, cache, now);
    if (d.do === "none") return;
    const vol = emptyDirPath(this.p.cfg.kubeletRoot, pod!.metadata!.uid!, FILL_VOLUME);
    // The kubelet makes the volume when it starts the pod; before that there is nothing to fill.
    if (!isRealDir(vol)) return { requeueAfterMs: 1000 };
    if (settled(vol)) return;
    log = log.child({ pod: key, hash: hash && shortHash(hash) });
    if (d.do === "wait") {
      log.debug({ why: d.why }, "waiting follower: nothing to fill yet");
      return { requeueAfterMs: Math.max(d.untilMs - now, 0) + 50 };
    }
    if (d.do === "cold") {
      await this.cold(pod!, vol, d.reason, log);
      return;
    }
    this.start(key, pod!, d.hash, vol, log);
  };

  private start(key: string, pod: k8s.V1Pod, hash: string, vol: string, log: Logger): void {
    const abort = new AbortController();
    const short = shortHash(hash);
    const job: Job = {
      uid: pod.metadata!.uid!,
      short,
      abort,
      done: this.fill(pod, hash, vol, abort.signal, log).then(
        (retryMs) => {
          this.jobs.delete(key);
          this.deps.ended(key, retryMs);
        },
        () => {
          this.jobs.delete(key);
          this.deps.ended(key);
        },
      ),
    };
    this.jobs.set(key, job);
  }

  /** Fills the volume, or writes the cold marker; returns when to try again if the tree is not reachable yet. */
  private async fill(
    pod: k8s.V1Pod,
    hash: string,
    vol: string,
    signal: AbortSignal,
    log: Logger,
  ): Promise<number | undefined> {
    const short = shortHash(hash);
    const t0 = performance.now();
    try {
      const tree = await this.localTree(hash, signal);
      const m = await capture({
        src: tree,
        dest: join(vol, FILL_TREE),
        hash,
        model: this.p.record(short)?.spec.model,
        parallel: this.p.cfg.captureParallel,
        // The pod reads it at once: through the page cache, and nothing to keep across a crash.
        durable: false,
        directIo: false,
        deadlineMs: this.p.cfg.captureDeadlineMs,
        signal,
        progress: false,
        log,
      });
      const seconds = Math.round((performance.now() - t0) / 100) / 10;
      log.info({ files: m.fileCount, bytes: m.totalBytes, seconds }, "waiting follower filled");
      this.p.metrics.fills.inc({ outcome: "filled" });
      await podEvent(
        this.p,
        pod,
        "Normal",
        "WarmstartFilled",
        `cache ${short} is Ready: its tree (${formatBytes(m.totalBytes)}) was copied into this pod's ${FILL_VOLUME} volume in ${seconds}s; the pod starts from it`,
      );
    } catch (err) {
      if (err instanceof CaptureStoppedError || signal.aborted) {
        log.info({ why: (signal.reason as Error | undefined)?.message }, "fill stopped");
        return undefined;
      }
      const next = afterFillFailure(err, short);
      if (next.do === "retry") {
        log.info({ why: next.why }, "the tree is not reachable yet; trying again");
        return RETRY_MS;
      }
      await this.cold(pod, vol, next.reason, log);
    }
  }

  /** The committed tree in this node's store, filled from peers first when it is not there. */
  private async localTree(hash: string, signal: AbortSignal): Promise<string> {
    if (await this.p.store.committed(hash)) return this.p.store.treeDir(hash);
    const where = Object.keys(this.p.record(shortHash(hash))?.status?.replicas ?? {}).join(", ");
    if (!this.p.cfg.peerCert)
      throw new Error(
        `the tree is on ${where || "another node"}, and this node's agent has no peer certificate to fetch it`,
      );
    return fetchTree(this.p, hash, signal, this.deps);
  }

  /** Writes the cold marker (never over anything: a marker or a tree there already wins). */
  private async cold(pod: k8s.V1Pod, vol: string, reason: string, log: Logger): Promise<void> {
    try {
      const fh = await open(
        join(vol, COLD_MARKER),
        fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW,
        0o444,
      );
      try {
        await fh.writeFile(`${reason}\n`);
      } finally {
        await fh.close();
      }
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === "EEXIST") return;
      log.warn({ err }, "could not write the cold marker; the pod starts cold at its deadline");
      return;
    }
    log.info({ reason }, "waiting follower starts cold");
    this.p.metrics.fills.inc({ outcome: "cold" });
    await podEvent(this.p, pod, "Warning", "WarmstartCold", `starting cold: ${reason}`);
  }
}

const isRealDir = (path: string): boolean => {
  try {
    return lstatSync(path).isDirectory();
  } catch {
    return false;
  }
};

/** A tree is there, or a cold marker: this pod's wait is decided. */
function settled(vol: string): boolean {
  const exists = (p: string): boolean => {
    try {
      lstatSync(p);
      return true;
    } catch {
      return false;
    }
  };
  return exists(join(vol, FILL_TREE, READY_MARKER)) || exists(join(vol, COLD_MARKER));
}
