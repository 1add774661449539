import type { ClusterState } from "./cluster.js";
import type { ProcessRecord } from "./processes.js";

/** The URLs of the Warmstart roles the local cluster runs (absent until a role exists). */
export interface RoleUrls {
  webhook?: string;
  server?: string;
  controlPlane?: string;
  clusterAgent?: string;
}

export interface RoleContext {
  state: ClusterState;
  launch: (name: string, args: string[], env?: NodeJS.ProcessEnv) => Promise<ProcessRecord>;
  progress: (line: string) => void;
}

/** Start every Warmstart role wired to the local cluster. */
export async function startRoles(_ctx: RoleContext): Promise<RoleUrls> {
  return {};
}
