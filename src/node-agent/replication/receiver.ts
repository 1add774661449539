/**
 * The receiver: fills this node's store with a committed tree held by peers.
 *
 * Verification is a chain: the record carries the sha256 of the leader's manifest, the manifest
 * fetched from any source must hash to it, and every file must hash to the manifest's digest.
 * Data comes in chunks (ranged GETs) from every live source at once, each chunk going to the
 * least busy one, written with positional writes into a staging folder beside the final place.
 * A source that fails, stalls or times out is dropped and its chunks go elsewhere; a file whose
 * digest is wrong is fetched again from one other source, and the chunks that differ name the
 * liar, which is dropped. The tree is committed like a capture (commit.ts); on any failure the
 * staging folder goes and nothing is left in the store.
 *
 * Nodes filling the same tree at once feed each other (have.ts): each may serve the chunks it
 * holds while it fills (serveFilling), learns of other copies as they appear (watchSources),
 * starts on its own part of the tree (startAt), and asks a committed origin only for what no
 * less busy copy holds. A filling copy relays chunks it has not verified yet: the file digest
 * still stands between any byte and a commit.
 */
import { createHash } from "node:crypto";
import { mkdir, open, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { shortHash } from "../../core/contract.js";
import { AlreadyCapturedError } from "../../datapath/capture-errors.js";
import {
  activeStaging,
  prepareDest,
  removeStaleStaging,
  stagingPath,
} from "../../datapath/capture-staging.js";
import { parseManifest, type Manifest } from "../../datapath/manifest.js";
import { isReady } from "../../datapath/ready.js";
import { commitTree, digestFile, finishTree, makeSkeleton, removeStaging, stagedPath } from "./commit.js";
import {
  checkManifest,
  DEFAULT_CHUNK_BYTES,
  metaLimit,
  paths,
  pickSource,
  planTree,
  TreeMetaSchema,
  type Chunk,
  type TreePlan,
} from "./plan.js";
import { fillingTree, HaveBits, perSourceLimit, pickWork, rotatedOrder } from "./have.js";
import { IdleWorkers } from "./idle-workers.js";
import { manifestDigestOf, readStoredManifest } from "./server.js";
import {
  ReplicationError,
  TAMPER_REASONS,
  type ReplicaSource,
  type TamperReason,
  type ReplicateOptions,
  type ReplicateResult,
} from "./options.js";
import { SharedFiles } from "./shared-files.js";
import { pollFilling } from "./polls.js";
import { LocalIoError, Source, SourceError, type DropReason } from "./source.js";

export { ReplicationError, type ReplicaSource, type ReplicateOptions, type ReplicateResult };

const MAX_MANIFEST_BYTES = 256 * 1024 * 1024;
const HEX64 = /^[0-9a-f]{64}$/;
const sha256 = (b: Buffer): string => createHash("sha256").update(b).digest("hex");

export async function replicateTree(o: ReplicateOptions): Promise<ReplicateResult> {
  if (!HEX64.test(o.hash)) throw new Error(`not a full hash: ${o.hash}`);
  if (!HEX64.test(o.expectedManifestDigest))
    throw new Error("expectedManifestDigest must be 64 hex characters");
  const streams = o.streams ?? 8;
  if (!Number.isInteger(streams) || streams < 1 || streams > 256) throw new Error(`streams must be 1 to 256`);
  const t0 = performance.now();
  const short = shortHash(o.hash);
  const dest = join(o.storeDir, short);
  await mkdir(o.storeDir, { recursive: true, mode: 0o755 });
  const result = (present: boolean, run?: Run): ReplicateResult => {
    const durationMs = performance.now() - t0;
    const bySource: Record<string, number> = {};
    for (const s of run?.sources ?? []) bySource[s.node] = s.bytes;
    const receivedBytes = Object.values(bySource).reduce((a, b) => a + b, 0);
    return {
      hash: o.hash,
      dest,
      present,
      totalBytes: run?.plan?.totalBytes ?? readStoredManifest(dest)?.manifest.totalBytes ?? 0,
      receivedBytes,
      bySource,
      dropped: run?.dropped ?? [],
      durationMs,
      bytesPerSecond: durationMs > 0 ? (receivedBytes * 1000) / durationMs : 0,
    };
  };
  const isOurs = async (): Promise<boolean> =>
    (await isReady(dest)) && manifestDigestOf(dest) === o.expectedManifestDigest;

  if (await isReady(dest)) {
    if (!(await isOurs())) throw new ReplicationError(`${dest} holds another tree than the record's`);
    o.metrics?.trees.inc({ result: "present" });
    return result(true);
  }
  const run = new Run(o, short, streams);
  o.log?.info({ hash: short, sources: o.sources.map((s) => s.node) }, "replicating from peers");
  try {
    await run.go(dest);
    const r = result(false, run);
    o.metrics?.trees.inc({ result: "replicated" });
    o.metrics?.replicationSeconds.observe(r.durationMs / 1000);
    o.metrics?.replicationRate.observe(r.bytesPerSecond);
    o.log?.info(
      {
        hash: short,
        bytes: r.totalBytes,
        seconds: r.durationMs / 1000,
        bySource: r.bySource,
        dropped: r.dropped,
      },
      "replicated",
    );
    return r;
  } catch (err) {
    if (err instanceof AlreadyCapturedError && (await isOurs())) {
      o.metrics?.trees.inc({ result: "present" });
      return result(true, run);
    }
    o.metrics?.trees.inc({ result: o.signal?.aborted ? "aborted" : "failed" });
    o.log?.warn({ err, hash: short, dropped: run.dropped }, "replication failed; nothing committed");
    throw err;
  } finally {
    await run.close();
  }
}

/** One replication's state: sources, plan, the chunk queue and who sent which chunk. */
class Run {
  readonly sources: Source[];
  readonly dropped: { node: string; reason: DropReason }[] = [];
  plan?: TreePlan;
  private failure?: Error;
  /** Plan chunk indices still to fetch, in the order they are wanted. */
  private queue: number[] = [];
  private own?: HaveBits;
  private fetching?: HaveBits;
  private unserve?: () => void;
  private unwatch?: () => void;
  private poller?: NodeJS.Timeout;
  private lastProgress = performance.now();
  private remaining: number[] = [];
  /** Per file, the source index that sent each chunk (by offset / chunkBytes). */
  private owner: (number | undefined)[][] = [];
  private readonly retried = new Set<number>();
  private busy = 0;
  private readonly idle = new IdleWorkers();
  private readonly files = new SharedFiles();
  private doneBytes = 0;
  private staging?: string;
  private readonly chunkBytes: number;
  private readonly onAbort = (): void =>
    this.fail(new ReplicationError("replication cancelled", this.dropped));

  constructor(
    private readonly o: ReplicateOptions,
    private readonly short: string,
    private readonly streams: number,
  ) {
    this.chunkBytes = o.chunkBytes ?? DEFAULT_CHUNK_BYTES;
    this.sources = [];
    for (const s of o.sources) this.add(s);
    o.signal?.addEventListener("abort", this.onAbort);
  }

  /** A source more; one known already (by URL) that was filling now holds the whole tree. */
  add(r: ReplicaSource): void {
    const known = this.sources.find((s) => s.url.href === new URL(r.url).href);
    if (known) {
      if (!r.filling && known.have !== "all") known.have = "all";
      return this.idle.wake();
    }
    const stallMs = this.o.stallMs ?? 30_000;
    const s = new Source(
      r.node,
      new URL(r.url),
      this.o.tls,
      this.streams,
      stallMs,
      (src, n) => this.o.metrics?.receivedBytes.inc({ source: src.node }, n),
      r.filling ?? false,
      () => this.idle.wake(),
    );
    if (this.plan) s.plan = { chunkBytes: this.chunkBytes, chunks: this.plan.chunks.length };
    this.sources.push(s);
    this.idle.wake();
  }

  async go(dest: string): Promise<void> {
    if (this.o.signal?.aborted) throw new ReplicationError("replication cancelled");
    if (this.sources.length === 0) throw new ReplicationError("no source to replicate from");
    this.unwatch = this.o.watchSources?.((s) => this.add(s));
    const { raw, manifest, from } = await this.fetchManifest();
    const { plan, meta } = await this.fetchPlan(manifest, from);
    this.plan = plan;
    for (const s of this.sources) s.plan = { chunkBytes: this.chunkBytes, chunks: plan.chunks.length };
    this.check();
    await removeStaleStaging(this.o.storeDir, this.short);
    await prepareDest(dest);
    const staging = (this.staging = stagingPath(dest));
    activeStaging.add(staging);
    await makeSkeleton(staging, plan);
    this.queue = rotatedOrder(plan.chunks.length, this.o.startAt ?? 0);
    [this.own, this.fetching] = [new HaveBits(plan.chunks.length), new HaveBits(plan.chunks.length)];
    const parts = { raw, manifest, meta, staging };
    this.unserve = this.o.serveFilling?.(fillingTree(plan, this.chunkBytes, this.own, this.fetching, parts));
    const failed = (s: Source, err: unknown): void => this.sourceFailed(s, err);
    this.poller = pollFilling(this.sources, paths.have(this.short), this.o.havePollMs ?? 500, failed);
    this.remaining = plan.files.map(() => 0);
    this.owner = plan.files.map(() => []);
    for (const c of plan.chunks) this.remaining[c.file] = (this.remaining[c.file] ?? 0) + 1;
    // Empty files have no chunk: they are checked now.
    for (let i = 0; i < plan.files.length; i++) if (this.remaining[i] === 0) await this.verify(i);
    this.check();
    // The stall clock starts with the chunks: a slow manifest, metadata or skeleton is no stall.
    this.lastProgress = performance.now();
    await Promise.all(Array.from({ length: this.streams }, () => this.worker()));
    this.check();
    await finishTree(staging, plan);
    await commitTree(staging, dest, {
      manifest: raw,
      hash: this.o.hash,
      capturedAt: manifest.createdAt,
      root: plan.root,
      durable: this.o.durable ?? true,
      beforeRename: () => {
        this.check();
        this.stopServing();
      },
    });
    activeStaging.delete(staging);
    this.o.onProgress?.({ doneBytes: plan.totalBytes, totalBytes: plan.totalBytes });
  }

  /** Ends every request and removes the staging folder unless it was committed. */
  async close(): Promise<void> {
    this.o.signal?.removeEventListener("abort", this.onAbort);
    this.stopServing();
    this.unwatch?.();
    for (const s of this.sources) s.close();
    const staging = this.staging;
    if (staging && activeStaging.delete(staging)) await removeStaging(staging);
  }

  private stopServing(): void {
    clearInterval(this.poller);
    this.unserve?.();
    this.unserve = undefined;
  }

  /** Throws the replication's failure, if any. */
  private check(): void {
    if (this.failure) throw this.failure;
  }

  private fail(err: Error): void {
    if (this.failure) return;
    this.failure = err;
    for (const s of this.sources) s.close();
    this.idle.wake(true);
  }

  private noSourceLeft(what: string): ReplicationError {
    const why = this.dropped.map((d) => `${d.node}: ${d.reason}`).join(", ");
    return new ReplicationError(`no source left ${what} (${why || "none given"})`, this.dropped);
  }

  private drop(s: Source, reason: DropReason, err?: unknown): void {
    if (!s.drop(reason)) return;
    this.dropped.push({ node: s.node, reason });
    this.o.metrics?.sourcesDropped.inc({ reason });
    if (!TAMPER_REASONS.has(reason)) {
      this.o.log?.warn({ err, source: s.node, reason, hash: this.short }, "replication source dropped");
      return;
    }
    // An honest peer serves only trees it checked against the record: another is a forgery.
    const message = `node ${s.node} served a tree that is not the record's: ${(err as Error | undefined)?.message ?? reason}`;
    this.o.metrics?.tampered.inc({ reason });
    this.o.log?.error({ err, source: s.node, reason, hash: this.short }, `tampered tree: ${message}`);
    this.o.onTampered?.({ source: s.node, reason: reason as TamperReason, message });
  }

  /** A request to `s` failed: drop `s` for it, unless the run itself is ending or our disk failed. */
  private sourceFailed(s: Source, err: unknown): void {
    if (this.failure) return;
    if (err instanceof LocalIoError) return this.fail(err);
    this.drop(s, err instanceof SourceError ? err.reason : "error", err);
  }

  /** The least busy live source not in `exclude`; a filling one only when no other is left. */
  private live(exclude: ReadonlySet<number>): number | undefined {
    const filling = new Set(this.sources.flatMap((s, i) => (s.have === "all" ? [] : [i])));
    return pickSource(
      this.sources.map((s, i) => (exclude.has(i) ? { ...s, alive: false } : s)),
      filling,
    );
  }

  /** The manifest from the least busy source whose copy hashes to the record's digest. */
  private async fetchManifest(): Promise<{ raw: Buffer; manifest: Manifest; from: number }> {
    const tried = new Set<number>();
    for (;;) {
      this.check();
      const i = this.live(tried);
      if (i === undefined) throw this.noSourceLeft("with the record's manifest");
      tried.add(i);
      const s = this.sources[i] as Source;
      let raw: Buffer;
      try {
        raw = await s.fetchBody(paths.manifest(this.short), MAX_MANIFEST_BYTES, this.o.signal);
      } catch (err) {
        this.sourceFailed(s, err);
        continue;
      }
      if (sha256(raw) !== this.o.expectedManifestDigest) {
        this.drop(s, "manifest", new Error("its manifest does not hash to the record's digest"));
        continue;
      }
      // It is the leader's manifest: if it is unusable, no other source can do better.
      try {
        const manifest = parseManifest(raw.toString("utf8"), `of ${this.short} from ${s.node}`);
        checkManifest(manifest, this.o.hash);
        return { raw, manifest, from: i };
      } catch (err) {
        throw new ReplicationError(
          `the record's manifest cannot be used: ${(err as Error).message}`,
          this.dropped,
          { cause: err },
        );
      }
    }
  }

  /** The plan, from the metadata of the manifest's source first, then of any other. */
  private async fetchPlan(manifest: Manifest, from: number): Promise<{ plan: TreePlan; meta: Buffer }> {
    const tried = new Set<number>();
    for (let i: number | undefined = from; ; i = this.live(tried)) {
      this.check();
      if (i === undefined) throw this.noSourceLeft("with the tree's metadata");
      tried.add(i);
      const s = this.sources[i] as Source;
      if (!s.alive) continue;
      try {
        const body = await s.fetchBody(paths.meta(this.short), metaLimit(manifest), this.o.signal);
        const meta = TreeMetaSchema.parse(JSON.parse(body.toString("utf8")));
        return { plan: planTree(manifest, meta, this.chunkBytes), meta: body };
      } catch (err) {
        this.sourceFailed(s, err instanceof SourceError ? err : new SourceError("protocol", String(err)));
      }
    }
  }

  private async worker(): Promise<void> {
    for (;;) {
      if (this.failure) return;
      // Nothing queued and nobody working: done. Otherwise a failed chunk may come back.
      if (this.queue.length === 0 && this.busy === 0) return this.idle.wake(true);
      const work = pickWork(
        this.queue,
        this.sources,
        perSourceLimit(this.streams, this.sources.filter((s) => s.alive).length),
      );
      if (!work) {
        if (this.queue.length > 0 && !this.sources.some((s) => s.alive))
          return this.fail(this.noSourceLeft("to fetch from"));
        const stallMs = this.o.stallMs ?? 30_000;
        if (this.queue.length > 0 && this.busy === 0 && performance.now() - this.lastProgress > stallMs)
          return this.fail(this.noSourceLeft(`holding the chunks still missing after ${stallMs} ms`));
        await this.idle.wait(1000);
        continue;
      }
      const c = (this.plan as TreePlan).chunks[this.queue.splice(work.at, 1)[0] as number] as Chunk;
      // In flight from the pick on: workers picking in this same tick would all take the same
      // least busy source, past its per-source limit, if it counted only once the request went.
      const unclaim = (this.sources[work.source] as Source).claim();
      this.busy++;
      this.idle.wake();
      try {
        await this.pull(c, work.source, unclaim);
      } catch (err) {
        this.fail(err as Error);
      } finally {
        this.busy--;
        this.idle.wake();
      }
    }
  }

  private fileOf(i: number): { path: Buffer; rel: string; size: number; digest: string } {
    const f = (this.plan as TreePlan).files[i] as TreePlan["files"][number];
    return { path: stagedPath(this.staging as string, f.rel), rel: f.rel, size: f.size, digest: f.digest };
  }

  /** Fetches chunk `c` from source `i` (claimed till `unclaim`); a failure requeues it, maybe drops `i`. */
  private async pull(c: Chunk, i: number, unclaim: () => void): Promise<void> {
    const s = this.sources[i] as Source;
    const f = this.fileOf(c.file);
    const first = !this.retried.has(c.index);
    this.retried.add(c.index);
    let fh: FileHandle;
    try {
      fh = await this.files.acquire(c.file, f.path);
    } finally {
      unclaim(); // in the step that calls fetchRange, which counts the request from then on
    }
    this.fetching?.set(c.index, true);
    try {
      await s.fetchRange(paths.file(this.short, f.rel), c.offset, c.length, fh, {
        skipZeros: first,
        compare: false,
        signal: this.o.signal,
      });
    } catch (err) {
      if (!s.keptAfter(err, c.index)) this.sourceFailed(s, err);
      if (!this.failure) this.queue.unshift(c.index);
      return;
    } finally {
      this.fetching?.set(c.index, false);
      await this.files.release(c.file);
    }
    (this.owner[c.file] as (number | undefined)[])[Math.floor(c.offset / this.chunkBytes)] = i;
    this.own?.set(c.index, true);
    this.lastProgress = performance.now();
    this.doneBytes += c.length;
    this.o.onProgress?.({ doneBytes: this.doneBytes, totalBytes: (this.plan as TreePlan).totalBytes });
    this.remaining[c.file] = (this.remaining[c.file] as number) - 1;
    if (this.remaining[c.file] === 0) await this.verify(c.file);
  }

  /** Checks a complete file against the manifest; a wrong one is repaired from another source. */
  private async verify(file: number): Promise<void> {
    const f = this.fileOf(file);
    const alg = (this.plan as TreePlan).digest;
    if ((await digestFile(f.path, alg)) === f.digest) return;
    this.o.log?.warn({ hash: this.short, file: f.rel }, "a replicated file does not match its digest");
    // Not served while it is wrong.
    const mine = (this.plan as TreePlan).chunks.filter((c) => c.file === file);
    for (const c of mine) this.own?.set(c.index, false);
    await this.repair(file);
    for (const c of mine) this.own?.set(c.index, true);
  }

  /**
   * Fetches the whole file again from one source, other than those that sent it where one is
   * left, comparing each chunk with what is on disk before overwriting it. If the result
   * verifies, the sources whose chunks differed lied and are dropped; if not, this one did.
   * Each chunk's owner follows what is on disk: an attempt that fails part way leaves the chunks
   * it wrote as its own, and a chunk it was writing when it failed as nobody's (mixed bytes
   * blame no one).
   */
  private async repair(file: number): Promise<void> {
    const f = this.fileOf(file);
    const alg = (this.plan as TreePlan).digest;
    const owners = this.owner[file] as (number | undefined)[];
    const suspects = new Set(owners.filter((o): o is number => o !== undefined));
    for (;;) {
      if (this.failure) return;
      // Only a copy that holds the whole file: a committed one.
      const whole = this.sources.map((s) => (s.have === "all" ? s : { ...s, alive: false }));
      const i = pickSource(whole, suspects);
      if (i === undefined) return this.fail(this.noSourceLeft(`with a good copy of ${f.rel}`));
      const s = this.sources[i] as Source;
      suspects.add(i);
      /** Per chunk, who had sent the bytes this source's differed from. */
      const liars: (number | undefined)[] = [];
      const fh = await open(f.path, "r+");
      try {
        for (let off = 0, k = 0; off < f.size; off += this.chunkBytes, k++) {
          const len = Math.min(this.chunkBytes, f.size - off);
          const before = owners[k];
          owners[k] = undefined;
          const differed = await s.fetchRange(paths.file(this.short, f.rel), off, len, fh, {
            skipZeros: false,
            compare: true,
            signal: this.o.signal,
          });
          owners[k] = i;
          if (differed) liars[k] = before;
        }
      } catch (err) {
        this.sourceFailed(s, err);
        continue;
      } finally {
        await fh.close();
      }
      if ((await digestFile(f.path, alg)) === f.digest) {
        for (const liar of new Set(liars))
          if (liar !== undefined && liar !== i)
            this.drop(this.sources[liar] as Source, "corrupt", new Error(`sent wrong bytes of ${f.rel}`));
        return;
      }
      this.drop(s, "corrupt", new Error(`sent a copy of ${f.rel} that does not match its digest`));
    }
  }
}
