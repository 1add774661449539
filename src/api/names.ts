/**
 * The names of the ModelCache API: its group, version and kind, and the closed set of phases a
 * record moves through. `core/contract.ts` re-exports them with the rest of the public names.
 */
export const GROUP = "warmstart.dev";

export const MODELCACHE = {
  group: GROUP,
  version: "v1alpha1",
  plural: "modelcaches",
  kind: "ModelCache",
} as const;

/** `status.phase`: Electing → Capturing → Promoting → Ready, or Failed (SPEC 1.4). */
export const CACHE_PHASES = ["Electing", "Capturing", "Promoting", "Ready", "Failed"] as const;
export type CachePhase = (typeof CACHE_PHASES)[number];
/** The phases by name (`PHASE.Ready`): code outside api/ writes no phase as a string literal. */
export const PHASE = {
  Electing: "Electing",
  Capturing: "Capturing",
  Promoting: "Promoting",
  Ready: "Ready",
  Failed: "Failed",
} as const satisfies { [P in CachePhase]: P };
