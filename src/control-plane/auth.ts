/**
 * Who is calling: the operator token, a cluster's registration token, or a queue credential the
 * store issued. Each route names the one kind it takes; a queue credential only acts on the
 * cluster it was issued to.
 */
import type { IncomingMessage } from "node:http";
import { createHash, timingSafeEqual } from "node:crypto";
import { ApiError } from "./errors.js";
import type { Route, RouteAuth } from "./router.js";
import type { Store } from "./store.js";
import type { ClusterTokens } from "./tokens.js";

const sha256 = (s: string): Buffer => createHash("sha256").update(s).digest();

/** Constant-time membership test: compares digests so token length leaks nothing either. */
function tokenIn(token: string, candidates: Buffer[]): boolean {
  const d = sha256(token);
  let found = false;
  for (const c of candidates) found = timingSafeEqual(d, c) || found;
  return found;
}

const AUTH_NAMES: Record<Exclude<RouteAuth, "none">, string> = {
  cluster: "cluster registration token",
  queue: "queue credential",
  operator: "operator token",
};

export type Authenticate = (
  req: IncomingMessage,
  route: Route,
  params: Record<string, string>,
) => string | undefined;

/** Checks a call's bearer token against its route; answers the cluster it acts for, if any. */
export function authenticator(o: {
  operatorToken: string;
  clusterTokens: ClusterTokens;
  store: Store;
}): Authenticate {
  const { clusterTokens, store } = o;
  const operatorDigest = [sha256(o.operatorToken)];
  return function authenticate(req, route, params) {
    if (route.auth === "none") return undefined;
    const header = req.headers.authorization ?? "";
    const m = /^Bearer\s+(\S+)\s*$/i.exec(header);
    const challenge = { "www-authenticate": 'Bearer realm="warmstart"' };
    if (!m?.[1])
      throw new ApiError(401, "missing bearer token (Authorization: Bearer <token>)", undefined, challenge);
    const token = m[1];
    const need = route.auth;
    let kind: Exclude<RouteAuth, "none">;
    let clusterId: string | undefined;
    const isOperator = tokenIn(token, operatorDigest);
    const tokenCluster = isOperator ? undefined : clusterTokens.clusterOf(token);
    if (isOperator) kind = "operator";
    else if (tokenCluster !== undefined) {
      kind = "cluster";
      clusterId = tokenCluster;
    } else {
      const cred = store.identifyCredential(token);
      if (!cred) throw new ApiError(401, "unknown token", undefined, challenge);
      if (cred.kind === "expired") {
        throw new ApiError(
          401,
          `queue credential expired at ${new Date(cred.expiresAt).toISOString()}; renew earlier or register again`,
          undefined,
          challenge,
        );
      }
      kind = "queue";
      clusterId = cred.clusterId;
    }
    if (kind !== need) {
      throw new ApiError(403, `this call needs a ${AUTH_NAMES[need]}, not a ${AUTH_NAMES[kind]}`);
    }
    if (kind === "queue" && params.id !== undefined && params.id !== clusterId) {
      throw new ApiError(403, `this credential was issued to cluster ${clusterId}, not ${params.id}`);
    }
    return clusterId;
  };
}
