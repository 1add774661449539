/**
 * The durable cache record (ModelCache, cluster-scoped, named by the short hash) as the node agent
 * moves it: Capturing, Promoting, then Ready or Failed. Every status write is conditional on the
 * resourceVersion it was computed from, so a Ready written by anyone is never overwritten by a
 * stale transition; and every write about an election is conditional on the record still being
 * about that election, so a retired election's late word never lands on its successor. Which
 * phase may follow which is the table in src/api/transitions.ts; the conditions and the phase's
 * time are added to every phase written (src/api/conditions.ts).
 */
import * as k8s from "@kubernetes/client-node";
import { apiError, isAlreadyExists, isConflict, isNotFound } from "./kube.js";
import { LABEL_HASH, MODELCACHE, type CachePhase, shortHash } from "../core/contract.js";
import { getModelCache, recordedLeader, type ModelCacheObject } from "./modelcache.js";
import { stampStatus } from "../api/conditions.js";
import { PHASE } from "../api/names.js";
import { NOT_LEADER, REASON, type CacheReason, type NotLeaderReason } from "../api/reasons.js";
import { next as nextPhase, transition as phaseAfter, type CacheEvent } from "../api/transitions.js";

const ref = { group: MODELCACHE.group, version: MODELCACHE.version, plural: MODELCACHE.plural };
const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);

export type StatusPatch = Record<string, unknown> & {
  phase?: CachePhase;
  // A `REASON` value; typed string while budget.ts still writes its own.
  reason?: string;
  message?: string;
};

/**
 * Whether a pod is the leader the record and the Lease name; when not, `reason` says why (what
 * callers branch on) and `why` says it to people.
 */
export type LeaderClaim =
  | { ok: true; cache: ModelCacheObject }
  | { ok: false; reason: NotLeaderReason; why: string; cache?: ModelCacheObject };

/** Reasons of a Failed that count as a failed capture (admission goes cold after a few of them). */
const COUNTED_FAILURES: ReadonlySet<string> = new Set([REASON.CaptureFailed, REASON.PromoteFailed]);

/** Whether the record is about this election now (and not being deleted). */
function isCurrentElection(c: ModelCacheObject, election: string): boolean {
  return c.spec.electionId === election && !c.metadata.deletionTimestamp;
}

export class CacheRecords {
  constructor(private readonly custom: k8s.CustomObjectsApi) {}

  get(hashOrShort: string): Promise<ModelCacheObject | undefined> {
    return getModelCache(this.custom, hashOrShort);
  }

  /** The record of this hash; created (with what the leader pod tells) when admission left none. */
  async ensure(
    hash: string,
    spec: {
      model?: string;
      electionId?: string;
      leader: { namespace?: string; name?: string; uid?: string; node?: string };
    },
  ): Promise<{ cache: ModelCacheObject; created: boolean }> {
    const existing = await this.get(hash);
    if (existing) return { cache: existing, created: false };
    const name = shortHash(hash);
    try {
      const created = (await this.custom.createClusterCustomObject({
        ...ref,
        body: {
          apiVersion: `${MODELCACHE.group}/${MODELCACHE.version}`,
          kind: MODELCACHE.kind,
          metadata: { name, labels: { [LABEL_HASH]: name } },
          spec: {
            hash,
            ...(spec.model ? { model: spec.model } : {}),
            ...(spec.electionId ? { electionId: spec.electionId } : {}),
            leader: spec.leader,
          },
        },
      })) as ModelCacheObject;
      return { cache: created, created: true };
    } catch (err) {
      if (!isAlreadyExists(err)) throw apiError(`creating ModelCache ${name}`, err);
      const raced = await this.get(hash);
      if (!raced) throw new Error(`ModelCache ${name} vanished right after it existed`);
      return { cache: raced, created: false };
    }
  }

  /**
   * Computes the next status from the current record and writes it if the record has not changed
   * since it was read (re-reading and recomputing on a conflict). `next` returns undefined to leave
   * the record as it is. Returns the record as written (or as found, when left alone).
   */
  async transition(
    hashOrShort: string,
    next: (current: ModelCacheObject) => StatusPatch | undefined,
  ): Promise<{ cache: ModelCacheObject; written: boolean } | undefined> {
    const name = shortHash(hashOrShort);
    for (let attempt = 0; attempt < 8; attempt++) {
      const current = await this.get(name);
      if (!current) return undefined;
      const patch = next(current);
      if (!patch) return { cache: current, written: false };
      try {
        const written = (await this.custom.patchClusterCustomObjectStatus(
          {
            ...ref,
            name,
            body: {
              metadata: { resourceVersion: current.metadata.resourceVersion },
              status: stampStatus(current, patch, new Date()),
            },
          },
          merge,
        )) as ModelCacheObject;
        return { cache: written, written: true };
      } catch (err) {
        if (isConflict(err)) continue;
        if (isNotFound(err)) return undefined;
        throw apiError(`updating ModelCache ${name} status`, err);
      }
    }
    throw new Error(`ModelCache ${name}: status kept changing under 8 attempts`);
  }

  /**
   * A transition on behalf of one election: computed and written only while the record is about
   * that election, and stamped with it. Undefined `election` never writes.
   */
  forElection(
    hashOrShort: string,
    election: string | undefined,
    next: (current: ModelCacheObject) => StatusPatch | undefined,
  ): Promise<{ cache: ModelCacheObject; written: boolean } | undefined> {
    return this.transition(hashOrShort, (c) => {
      if (!election || !isCurrentElection(c, election)) return undefined;
      const patch = next(c);
      return patch && { ...patch, electionId: election };
    });
  }

  /**
   * Moves the record of `election` by `event` through the phase table (`next` in
   * src/api/transitions.ts: same election when the status names it; a failed promote moves again
   * only on `retryPromote`), writing the phase with `fields`. Nothing is written when the table
   * says ignore, or when the record is about another election or being deleted. A retry given
   * `failedBefore` (ms) moves only a failure older than that, read on the record being written:
   * a look at a stale copy never retries a failure written since. The result says whether it
   * was written, and the record as written or found.
   */
  advance(
    hashOrShort: string,
    election: string | undefined,
    event: CacheEvent,
    fields: Omit<StatusPatch, "phase">,
    o: { failedBefore?: number } = {},
  ): Promise<{ cache: ModelCacheObject; written: boolean } | undefined> {
    return this.forElection(hashOrShort, election, (c) => {
      if (event === "retryPromote" && o.failedBefore !== undefined && c.status?.phase === PHASE.Failed) {
        const at = Date.parse(
          typeof c.status.lastTransitionTime === "string" ? c.status.lastTransitionTime : "",
        );
        if (at >= o.failedBefore) return undefined; // a failure with no time reads as old
      }
      const phase = nextPhase(c.status, event, election!);
      return phase === "ignore" ? undefined : { ...fields, phase };
    });
  }

  /**
   * Failed for this election, unless the cache is Ready or this election already failed. A failed
   * capture or promote counts once per election in `failedCaptures`; a leader that went away, a
   * cancelled capture or an unsupported backend do not count.
   */
  fail(
    hashOrShort: string,
    election: string | undefined,
    reason: CacheReason,
    message: string,
  ): Promise<{ cache: ModelCacheObject; written: boolean } | undefined> {
    return this.forElection(hashOrShort, election, (c) => {
      const s = c.status ?? {};
      // Never over Ready; the first word on how an election ended stands (a capture stopped
      // because its leader went is the leader going, not a failed capture).
      if (phaseAfter(s.phase, "failed", s.electionId === election) === "ignore") return undefined;
      const counts = COUNTED_FAILURES.has(reason) && s.lastFailedElection !== election;
      return {
        phase: PHASE.Failed,
        reason,
        message,
        ...(counts ? { failedCaptures: (s.failedCaptures ?? 0) + 1, lastFailedElection: election } : {}),
      };
    });
  }

  /**
   * Records `uid` as the leader of `election` unless one is recorded already, and says whether this
   * pod is that leader. The first pod seen wearing the election's id is the one admission
   * decorated: a copy needs the original to exist first.
   */
  async claimLeader(hashOrShort: string, election: string, uid: string): Promise<LeaderClaim> {
    let verdict: LeaderClaim | undefined;
    const r = await this.transition(hashOrShort, (c) => {
      if (c.metadata.deletionTimestamp) {
        verdict = {
          ok: false,
          reason: NOT_LEADER.CacheDeleting,
          why: "the cache is being deleted",
          cache: c,
        };
        return undefined;
      }
      if (c.spec.electionId !== election) {
        verdict = {
          ok: false,
          reason: NOT_LEADER.OtherElection,
          why: `the record is about election ${c.spec.electionId ?? "(none)"}`,
          cache: c,
        };
        return undefined;
      }
      const s = c.status ?? {};
      // A status left by an earlier election (its phase, its node) says nothing about this one; a
      // status that names no election is taken for this one's.
      const stale = s.electionId !== undefined && s.electionId !== election;
      const phase = phaseAfter(s.phase, "leaderSeen", !stale);
      if (phase === "ignore") {
        verdict = { ok: false, reason: NOT_LEADER.CacheReady, why: "cache Ready", cache: c };
        return undefined;
      }
      const known = recordedLeader(c);
      if (known) {
        verdict =
          known === uid
            ? { ok: true, cache: c }
            : {
                ok: false,
                reason: NOT_LEADER.OtherPod,
                why: `pod ${known} is this election's recorded leader`,
                cache: c,
              };
        return undefined;
      }
      verdict = undefined;
      // The phase stays when the table keeps it: only the leader is recorded then.
      return {
        electionId: election,
        leaderUid: uid,
        ...(phase !== s.phase ? { phase, reason: REASON.LeaderElected, message: "" } : {}),
      };
    });
    if (verdict) return verdict;
    if (!r) return { ok: false, reason: NOT_LEADER.NoRecord, why: "the cache has no record" };
    return { ok: true, cache: r.cache };
  }

  /**
   * Sets (or, with null, removes) one node's entry in `status.replicas`: a merge patch of that key
   * alone, so nodes writing their own entries never conflict.
   */
  async setReplica(
    hashOrShort: string,
    node: string,
    // `filling: null` ends a filling entry (a merge patch keeps keys it does not name).
    replica: { url: string; at: string; filling?: { doneBytes: number; totalBytes: number } | null } | null,
  ): Promise<void> {
    const name = shortHash(hashOrShort);
    try {
      await this.custom.patchClusterCustomObjectStatus(
        { ...ref, name, body: { status: { replicas: { [node]: replica } } } },
        merge,
      );
    } catch (err) {
      if (replica === null && isNotFound(err)) return;
      throw apiError(`writing node ${node}'s replica on ModelCache ${name}`, err);
    }
  }

  /** Sets one annotation (the promoted source, written before the cache can turn Ready). */
  async annotate(hashOrShort: string, key: string, value: string): Promise<void> {
    const name = shortHash(hashOrShort);
    try {
      await this.custom.patchClusterCustomObject(
        { ...ref, name, body: { metadata: { annotations: { [key]: value } } } },
        merge,
      );
    } catch (err) {
      throw apiError(`annotating ModelCache ${name}`, err);
    }
  }

  /**
   * Sets one annotation on behalf of one election: only while the record's spec is about that
   * election, it is not being deleted and not Ready (conditional on the record read). False when
   * it was not written: a promote superseded by a newer election must not publish its source.
   */
  async annotateForElection(
    hashOrShort: string,
    election: string,
    key: string,
    value: string,
  ): Promise<boolean> {
    const name = shortHash(hashOrShort);
    for (let attempt = 0; attempt < 8; attempt++) {
      const c = await this.get(name);
      if (
        !c ||
        c.metadata.deletionTimestamp ||
        c.spec.electionId !== election ||
        c.status?.phase === PHASE.Ready
      )
        return false;
      try {
        await this.custom.patchClusterCustomObject(
          {
            ...ref,
            name,
            body: {
              metadata: { resourceVersion: c.metadata.resourceVersion, annotations: { [key]: value } },
            },
          },
          merge,
        );
        return true;
      } catch (err) {
        if (isConflict(err)) continue;
        if (isNotFound(err)) return false;
        throw apiError(`annotating ModelCache ${name}`, err);
      }
    }
    throw new Error(`ModelCache ${name}: kept changing under 8 attempts`);
  }

  /**
   * Adds a finalizer (conditional on the record read, so none is lost). False when the record is
   * gone or being deleted: the API server accepts no new finalizer then.
   */
  async addFinalizer(hashOrShort: string, finalizer: string): Promise<boolean> {
    return this.editFinalizers(hashOrShort, (f) => (f.includes(finalizer) ? undefined : [...f, finalizer]));
  }

  /** Removes a finalizer; true when it is not there (any more). */
  async removeFinalizer(hashOrShort: string, finalizer: string): Promise<boolean> {
    await this.editFinalizers(hashOrShort, (f) =>
      f.includes(finalizer) ? f.filter((x) => x !== finalizer) : undefined,
    );
    return true;
  }

  private async editFinalizers(
    hashOrShort: string,
    edit: (finalizers: string[]) => string[] | undefined,
  ): Promise<boolean> {
    const name = shortHash(hashOrShort);
    for (let attempt = 0; attempt < 8; attempt++) {
      const c = await this.get(name);
      if (!c) return false;
      const next = edit(c.metadata.finalizers ?? []);
      if (!next) return !c.metadata.deletionTimestamp;
      if (c.metadata.deletionTimestamp && next.length > (c.metadata.finalizers ?? []).length) return false;
      try {
        await this.custom.patchClusterCustomObject(
          {
            ...ref,
            name,
            body: { metadata: { resourceVersion: c.metadata.resourceVersion, finalizers: next } },
          },
          merge,
        );
        return true;
      } catch (err) {
        if (isConflict(err)) continue;
        if (isNotFound(err)) return false;
        throw apiError(`updating the finalizers of ModelCache ${name}`, err);
      }
    }
    throw new Error(`ModelCache ${name}: finalizers kept changing under 8 attempts`);
  }
}
