/**
 * A small route table: each route names its method, path template, who may call it and the zod
 * schemas of its params, query, body and answer. The server validates with those schemas and the
 * OpenAPI document is generated from them, so the two cannot drift apart.
 */
import { z } from "zod";
import { ErrorBody } from "./api.js";

export type RouteAuth = "none" | "cluster" | "queue" | "operator";

export interface HandlerContext {
  params: Record<string, string>;
  query: Record<string, unknown>;
  body: unknown;
  /** The cluster a cluster token or a queue credential was issued to. */
  credentialClusterId: string | undefined;
  /** Aborted when the caller goes away or the server shuts down. */
  signal: AbortSignal;
}

export interface Route {
  method: "GET" | "POST" | "DELETE";
  /** OpenAPI-style template, e.g. `/v1/clusters/{id}/heartbeat`. */
  path: string;
  operationId: string;
  summary: string;
  auth: RouteAuth;
  params?: z.ZodObject;
  query?: z.ZodObject;
  body?: z.ZodType;
  /** A zod schema for a JSON answer, or a media type for anything else. */
  response: z.ZodType | { mediaType: string };
  status?: number;
  handler: (ctx: HandlerContext) => unknown;
}

interface Compiled {
  route: Route;
  segments: string[];
}

export class Router {
  private readonly compiled: Compiled[];

  constructor(readonly routes: Route[]) {
    this.compiled = routes.map((route) => ({ route, segments: route.path.split("/") }));
  }

  /**
   * The route for a method and path, with its raw params; `allowed` lists the methods the path
   * supports when the method does not match (for 405).
   */
  match(
    method: string,
    pathname: string,
  ): { route: Route; params: Record<string, string> } | { route: undefined; allowed: string[] } {
    const parts = pathname.split("/");
    const allowed: string[] = [];
    for (const c of this.compiled) {
      const params = matchSegments(c.segments, parts);
      if (!params) continue;
      if (c.route.method === method || (method === "HEAD" && c.route.method === "GET"))
        return { route: c.route, params };
      allowed.push(c.route.method);
    }
    return { route: undefined, allowed };
  }
}

function matchSegments(template: string[], parts: string[]): Record<string, string> | undefined {
  if (template.length !== parts.length) return undefined;
  const params: Record<string, string> = {};
  for (let i = 0; i < template.length; i++) {
    const t = template[i] ?? "";
    const p = parts[i] ?? "";
    if (t.startsWith("{") && t.endsWith("}")) {
      if (p === "") return undefined;
      let value: string;
      try {
        value = decodeURIComponent(p);
      } catch {
        return undefined;
      }
      params[t.slice(1, -1)] = value;
    } else if (t !== p) {
      return undefined;
    }
  }
  return params;
}

function jsonSchema(schema: z.ZodType, io: "input" | "output"): Record<string, unknown> {
  const { $schema: _ignored, ...rest } = z.toJSONSchema(schema, { io, unrepresentable: "any" }) as Record<
    string,
    unknown
  >;
  return rest;
}

/** OpenAPI 3.1 (whose schemas are JSON Schema 2020-12, what zod emits) for every route. */
export function openApiDocument(
  routes: Route[],
  info: { title: string; version: string },
): Record<string, unknown> {
  const paths: Record<string, Record<string, unknown>> = {};
  const errorRef = { $ref: "#/components/schemas/Error" };
  for (const r of routes) {
    const parameters: unknown[] = [];
    for (const [where, obj] of [
      ["path", r.params],
      ["query", r.query],
    ] as const) {
      if (!obj) continue;
      for (const [name, schema] of Object.entries(obj.shape)) {
        parameters.push({
          name,
          in: where,
          required: where === "path" || !(schema as z.ZodType).safeParse(undefined).success,
          schema: jsonSchema(schema as z.ZodType, "input"),
        });
      }
    }
    const ok = String(r.status ?? 200);
    const content =
      "mediaType" in r.response
        ? { [r.response.mediaType]: { schema: { type: "string" } } }
        : { "application/json": { schema: jsonSchema(r.response, "output") } };
    const responses: Record<string, unknown> = { [ok]: { description: "success", content } };
    if (r.body || r.params || r.query) {
      responses["400"] = {
        description: "invalid input",
        content: { "application/json": { schema: errorRef } },
      };
    }
    if (r.auth !== "none") {
      responses["401"] = {
        description: "missing, unknown or expired token",
        content: { "application/json": { schema: errorRef } },
      };
      responses["403"] = {
        description: "a valid token that may not make this call",
        content: { "application/json": { schema: errorRef } },
      };
    }
    const op: Record<string, unknown> = {
      operationId: r.operationId,
      summary: r.summary,
      tags: [r.path.startsWith("/v1/") ? (r.auth === "operator" ? "operator" : "cluster agent") : "service"],
      security: r.auth === "none" ? [] : [{ bearer: [] }],
      "x-warmstart-auth": r.auth,
      responses,
    };
    if (parameters.length) op.parameters = parameters;
    if (r.body) {
      op.requestBody = {
        required: true,
        content: { "application/json": { schema: jsonSchema(r.body, "input") } },
      };
    }
    (paths[r.path] ??= {})[r.method.toLowerCase()] = op;
  }
  return {
    openapi: "3.1.0",
    info: {
      ...info,
      description:
        "Warmstart reference control plane. Registration takes a cluster token, queue calls the short-lived " +
        "queue credential that registration returns, and operator calls the operator token; each as " +
        "`Authorization: Bearer <token>`.",
    },
    paths,
    components: {
      securitySchemes: { bearer: { type: "http", scheme: "bearer" } },
      schemas: { Error: jsonSchema(ErrorBody, "output") },
    },
  };
}
