/**
 * `warmstart explain`, the pure part: find the pod in a manifest, show the admission view, and
 * compare two pods (or a pod and a cache record) input by input, so a user can see why a cache misses.
 * Reading manifests is in explain-subjects.ts, per-run detection in per-run.ts and the
 * input-by-input difference in explain-diff.ts.
 */
import { classifyPod, type Classification } from "./classify.js";
import { DEFAULT_CACHE_ENV_TEMPLATE, DEFAULT_CACHE_ROOT } from "./decorate.js";
import type { CacheLocation, SkippedLocation } from "./locations.js";
import { LABEL_SHARE_GROUP, shortHash, type SharingScope } from "./contract.js";
import { redactUrlCredentials } from "./env.js";
import { scopeKey } from "./scope.js";
import { hashInputs, hashOfInputs, scopeOfInputs, sealInputs, type HashInputs } from "./hash.js";
import { diffInputs, type Difference } from "./explain-diff.js";
import { perRunInputs, type PerRunFlag } from "./per-run.js";
import {
  followerWait,
  membershipOf,
  type FollowerMode,
  type FollowerWait,
  type Gang,
  type Group,
} from "./gangs.js";
import type { Subject } from "./explain-subjects.js";

export { diffInputs, diffLists, type Difference } from "./explain-diff.js";
export { floatingImage, perRunInputs, perRunValue, type PerRunFlag } from "./per-run.js";
export {
  findSubject,
  findSubjects,
  parseManifests,
  subjectFromText,
  subjectsFromText,
  type Subject,
} from "./explain-subjects.js";

/** Where the engine's files land in a leader: the pod's own folders captured, and Warmstart's root for the rest. */
export interface LocationsView {
  /** The pod's own folders that are captured (and where a restore presents them again). */
  captured: Array<Pick<CacheLocation, "path" | "kind" | "from" | "tree">>;
  /** Cache env the pod does not set, pointed into Warmstart's root (defaults of the webhook's template). */
  injected: Array<{ name: string; value: string }>;
  /** Locations the pod names that are not captured, and why. */
  skipped: SkippedLocation[];
}

export interface Explanation {
  /** What was explained: `Deployment vllm`, `LeaderWorkerSet x (worker)`, `Pod p`. */
  name: string;
  downloader: boolean;
  reason: string;
  model: string | null;
  /**
   * The sharing scope the hash is computed in: `cluster`, `namespace:<ns>` or `group:<name>`, as the
   * webhook's `--sharing-scope` makes it (a cache record's own, for a record).
   */
  scope: string;
  /** The cache hash the webhook would stamp, in that scope; null when the pod is left alone. */
  hash: string | null;
  short: string | null;
  container: string | null;
  /** Set when the pod downloads but is admitted cold anyway (its model is on its own volume). */
  cold?: string;
  locations?: LocationsView;
  /** The gang that places it, when a gang scheduler does (SPEC 1.3 "Groups and gangs"). */
  gang?: Gang;
  /** The multi-node group it is a rank of, and its rank (part of the hash). */
  group?: Group;
  /**
   * How a follower of its hash waits under `election.followerMode` (auto unless told): gated
   * (holding no node and no GPU), or running (`wait`), and why.
   */
  follower?: FollowerWait;
  warnings: PerRunFlag[];
}

export interface Comparison {
  a: Explanation;
  b: Explanation;
  /** Whether the two would hash equal (computed from the inputs even for pods left alone). */
  equal: boolean;
  differences: Difference[];
  perRun: Array<PerRunFlag & { pod: "a" | "b" | "both" }>;
}

/**
 * The webhook's settings a pod's hash depends on: its sharing scope (`--sharing-scope`, cluster by
 * default), the namespace the pod is created in (the manifest's, else `default`) and, under the
 * group scope, that namespace's `warmstart.dev/share-group` label.
 */
export interface ExplainOptions {
  sharingScope?: SharingScope;
  namespace?: string;
  shareGroup?: string;
  followerMode?: FollowerMode;
}

interface Viewed {
  view: Explanation;
  inputs: HashInputs;
}

function view(s: Subject, o: ExplainOptions): Viewed {
  if (s.kind === "cache") {
    // Sealed inputs cannot be re-hashed: the record's own hash stands for them.
    const hash = s.inputs.sealed && s.recordedHash ? s.recordedHash : hashOfInputs(s.inputs);
    const warnings = perRunInputs(s.inputs);
    if (!s.inputs.sealed && s.recordedHash !== undefined && s.recordedHash !== hash) {
      warnings.push({
        input: "hash",
        value: s.recordedHash,
        why: "the record's hash does not match its inputs",
      });
    }
    return {
      inputs: s.inputs,
      view: {
        name: s.name,
        downloader: true,
        reason: "cache record",
        model: s.inputs.model,
        scope: scopeOfInputs(s.inputs),
        hash,
        short: shortHash(hash),
        container: null,
        warnings,
      },
    };
  }
  const c: Classification = classifyPod(s.pod);
  const scope = scopeKey(
    o.sharingScope ?? "cluster",
    o.namespace ?? s.namespace ?? "default",
    o.shareGroup ? { [LABEL_SHARE_GROUP]: o.shareGroup } : undefined,
  );
  const inputs = hashInputs(s.pod, c, { scope });
  const hash = c.downloader ? hashOfInputs(inputs) : null;
  const main = c.containerIndex !== undefined ? s.pod.spec?.containers[c.containerIndex] : undefined;
  const plan = c.locations;
  const podSets = new Set((main?.env ?? []).map((e) => e?.name));
  const locations: LocationsView | undefined = plan && {
    captured: plan.locations.map(({ path, kind, from, tree }) => ({ path, kind, from, tree })),
    injected: DEFAULT_CACHE_ENV_TEMPLATE.filter((e) => !podSets.has(e.name)).map((e) => ({
      name: e.name,
      value: e.value.split("{root}").join(DEFAULT_CACHE_ROOT),
    })),
    skipped: plan.skipped,
  };
  const m = membershipOf(s.pod, main);
  return {
    inputs,
    view: {
      name: s.name,
      downloader: c.downloader,
      reason: c.reason,
      // What the pod names, never how it fetches it: a credential in the URL stays out.
      model: c.model ? redactUrlCredentials(c.model) : null,
      scope,
      hash,
      short: hash ? shortHash(hash) : null,
      container: main?.name ?? null,
      ...(c.cold ? { cold: c.cold } : {}),
      ...(c.downloader && locations ? { locations } : {}),
      ...(m.gang ? { gang: m.gang } : {}),
      ...(m.group ? { group: m.group } : {}),
      ...(c.downloader && !c.cold ? { follower: followerWait(m, o.followerMode ?? "auto") } : {}),
      warnings: c.downloader ? perRunInputs(inputs) : [],
    },
  };
}

/** The admission view of one pod or record. */
export function explain(subject: Subject, o: ExplainOptions = {}): Explanation {
  return view(subject, o).view;
}

/** The admission view of two subjects, which hash inputs differ and which look per-run. */
export function compare(a: Subject, b: Subject, o: ExplainOptions = {}): Comparison {
  const va = view(a, o);
  const vb = view(b, o);
  // A sealed record is compared with the other side sealed the same way.
  if (va.inputs.sealed || vb.inputs.sealed) {
    va.inputs = sealInputs(va.inputs);
    vb.inputs = sealInputs(vb.inputs);
  }
  const fa = perRunInputs(va.inputs);
  const fb = perRunInputs(vb.inputs);
  const key = (f: PerRunFlag): string => `${f.input}\u0000${f.value}`;
  const inB = new Set(fb.map(key));
  const inA = new Set(fa.map(key));
  const perRun = [
    ...fa.map((f) => ({ ...f, pod: inB.has(key(f)) ? ("both" as const) : ("a" as const) })),
    ...fb.filter((f) => !inA.has(key(f))).map((f) => ({ ...f, pod: "b" as const })),
  ];
  return {
    a: va.view,
    b: vb.view,
    equal:
      va.view.hash !== null && vb.view.hash !== null
        ? va.view.hash === vb.view.hash
        : hashOfInputs(va.inputs) === hashOfInputs(vb.inputs),
    differences: diffInputs(va.inputs, vb.inputs),
    perRun,
  };
}
