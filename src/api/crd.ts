/**
 * The ModelCache CRD, built from the schema in `modelcache.ts`. `npm run generate` writes it to
 * deploy/crds/modelcache.yaml (the chart installs that file through files/modelcache.yaml), and
 * `crd.test.ts` fails when the file is not what this builds.
 */
import { z } from "zod";
import { stringify } from "yaml";
import { MODELCACHE } from "./names.js";
import { modelCacheSpecSchema, modelCacheStatusSchema } from "./modelcache.js";

/** The generated file, relative to the package root. */
export const CRD_FILE = "deploy/crds/modelcache.yaml";
/** The chart's copy (a link to CRD_FILE), relative to the package root. */
export const CHART_CRD_FILE = "deploy/helm/warmstart/files/modelcache.yaml";

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

/** zod's bounds for a safe integer: said by the int64 format instead. */
const SAFE_BOUNDS = new Set([Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER]);

/**
 * A JSON Schema from zod made structural, as Kubernetes wants an openAPIV3Schema: no `$schema`,
 * no `additionalProperties` on an object with known fields (its unknown fields are pruned by the
 * API server; the loose objects of the schema are about reading, not storing) but kept for a map
 * (a record: every value has the schema), no safe-integer bounds, and `type: object` kept next to
 * `x-kubernetes-preserve-unknown-fields`.
 */
export function structural(schema: Json): Json {
  if (Array.isArray(schema)) return schema.map(structural);
  if (schema === null || typeof schema !== "object") return schema;
  const out: { [k: string]: Json } = {};
  const isMap =
    !("properties" in schema) &&
    typeof schema.additionalProperties === "object" &&
    schema.additionalProperties !== null &&
    Object.keys(schema.additionalProperties).length > 0;
  for (const [key, value] of Object.entries(schema)) {
    if (key === "$schema" || (key === "additionalProperties" && !isMap)) continue;
    if ((key === "minimum" || key === "maximum") && typeof value === "number" && SAFE_BOUNDS.has(value))
      continue;
    out[key] = key === "properties" ? mapValues(value, structural) : structural(value);
  }
  return out;
}

function mapValues(v: Json, f: (x: Json) => Json): Json {
  if (v === null || typeof v !== "object" || Array.isArray(v)) return v;
  return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, f(x)]));
}

function jsonSchema(schema: z.ZodType): Json {
  return structural(z.toJSONSchema(schema, { target: "openapi-3.0", io: "input" }) as Json);
}

/** The CRD object (names, scope, versions, subresources and columns, and the generated schema). */
export function buildCrd(): Record<string, unknown> {
  return {
    apiVersion: "apiextensions.k8s.io/v1",
    kind: "CustomResourceDefinition",
    metadata: { name: `${MODELCACHE.plural}.${MODELCACHE.group}` },
    spec: {
      group: MODELCACHE.group,
      scope: "Cluster",
      names: {
        kind: MODELCACHE.kind,
        listKind: `${MODELCACHE.kind}List`,
        plural: MODELCACHE.plural,
        singular: MODELCACHE.kind.toLowerCase(),
        shortNames: ["mc"],
      },
      versions: [
        {
          name: MODELCACHE.version,
          served: true,
          storage: true,
          subresources: { status: {} },
          additionalPrinterColumns: [
            { name: "Model", type: "string", jsonPath: ".spec.model" },
            { name: "Phase", type: "string", jsonPath: ".status.phase" },
            { name: "Size", type: "string", jsonPath: ".status.sizeHuman" },
            { name: "Node", type: "string", jsonPath: ".status.node" },
            {
              name: "Failed",
              type: "integer",
              jsonPath: ".status.failedCaptures",
              description: "failed captures",
            },
            { name: "Restores", type: "integer", jsonPath: ".status.restores" },
            { name: "Age", type: "date", jsonPath: ".metadata.creationTimestamp" },
          ],
          schema: {
            openAPIV3Schema: {
              type: "object",
              properties: {
                spec: jsonSchema(modelCacheSpecSchema),
                status: jsonSchema(modelCacheStatusSchema),
              },
            },
          },
        },
      ],
    },
  };
}

const HEADER = `# The durable record of one model cache, named by the short cache hash. The webhook restores
# from it once Ready; the node agent and the release controller move its phase. Its finalizers
# (warmstart.dev/cleanup, and warmstart.dev/store-<node> per node whose store holds its tree)
# make a deletion remove everything the cache created first.
#
# Generated from src/api/modelcache.ts by \`npm run generate\`: do not edit.
`;

/** The file's text (before the formatter; the test compares documents, not text). */
export function renderCrdYaml(): string {
  return HEADER + stringify(buildCrd(), { lineWidth: 0 });
}
