import assert from "node:assert/strict";
import { test } from "node:test";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parse } from "yaml";
import { buildCrd, CHART_CRD_FILE, CRD_FILE, structural } from "./crd.js";

const ROOT = join(fileURLToPath(new URL(".", import.meta.url)), "../../..");

for (const file of [CRD_FILE, CHART_CRD_FILE]) {
  void test(`${file} is what src/api generates`, async () => {
    const onDisk: unknown = parse(await readFile(join(ROOT, file), "utf8"));
    assert.deepEqual(
      onDisk,
      JSON.parse(JSON.stringify(buildCrd())),
      `${file} is stale: run \`npm run generate\` (the schema lives in src/api/modelcache.ts)`,
    );
  });
}

void test("the CRD keeps the names, scope, version, status subresource and columns operators use", () => {
  const crd = buildCrd() as {
    metadata: { name: string };
    spec: {
      group: string;
      scope: string;
      names: Record<string, unknown>;
      versions: {
        name: string;
        served: boolean;
        storage: boolean;
        subresources: unknown;
        additionalPrinterColumns: { name: string; jsonPath: string }[];
        schema: { openAPIV3Schema: { properties: Record<string, Record<string, unknown>> } };
      }[];
    };
  };
  assert.equal(crd.metadata.name, "modelcaches.warmstart.dev");
  assert.equal(crd.spec.scope, "Cluster");
  assert.deepEqual(crd.spec.names, {
    kind: "ModelCache",
    listKind: "ModelCacheList",
    plural: "modelcaches",
    singular: "modelcache",
    shortNames: ["mc"],
  });
  const [v] = crd.spec.versions;
  assert.equal(crd.spec.versions.length, 1);
  assert.deepEqual(
    [v!.name, v!.served, v!.storage, v!.subresources],
    ["v1alpha1", true, true, { status: {} }],
  );
  assert.deepEqual(
    v!.additionalPrinterColumns.map((c) => `${c.name}=${c.jsonPath}`),
    [
      "Model=.spec.model",
      "Phase=.status.phase",
      "Size=.status.sizeHuman",
      "Node=.status.node",
      "Failed=.status.failedCaptures",
      "Restores=.status.restores",
      "Age=.metadata.creationTimestamp",
    ],
  );
  const { spec, status } = v!.schema.openAPIV3Schema.properties;
  const specProps = spec!.properties as Record<string, Record<string, unknown>>;
  assert.equal(specProps.inputs!["x-kubernetes-preserve-unknown-fields"], true);
  assert.equal(specProps.inputs!.type, "object");
  assert.deepEqual(spec!.required, ["hash"]);
  const statusProps = status!.properties as Record<string, Record<string, unknown>>;
  assert.deepEqual(statusProps.phase!.enum, ["Electing", "Capturing", "Promoting", "Ready", "Failed"]);
  assert.equal(statusProps.conditions!["x-kubernetes-list-type"], "map");
  assert.deepEqual(statusProps.conditions!["x-kubernetes-list-map-keys"], ["type"]);
  assert.deepEqual(statusProps.sizeBytes, { type: "integer", format: "int64" });
});

void test("the schema is structural: nothing Kubernetes refuses or prunes by surprise", () => {
  const text = JSON.stringify(buildCrd());
  assert.doesNotMatch(text, /"\$schema"|"nullable"|"anyOf"|"oneOf"|"allOf"/);
  assert.doesNotMatch(text, /9007199254740991/);
  // additionalProperties only where a map says what each value is (never beside known fields).
  const maps: unknown[] = [];
  const walk = (v: unknown): void => {
    if (!v || typeof v !== "object") return;
    const o = v as Record<string, unknown>;
    if ("additionalProperties" in o && typeof o.additionalProperties === "object" && !("properties" in o))
      maps.push(o.additionalProperties);
    else assert.ok(!("additionalProperties" in o), `beside known fields: ${JSON.stringify(o)}`);
    for (const x of Object.values(o)) walk(x);
  };
  walk((buildCrd().spec as { versions: unknown[] }).versions);
  assert.deepEqual(
    maps.map((m) => (m as { type: string }).type),
    ["object", "string", "string"],
    "status.replicas (by node), status.startups[].factors (digest by name), status.startups[].config (setting by name)",
  );
});

void test("a map (a zod record) keeps its value schema, so its entries are not pruned", () => {
  assert.deepEqual(
    structural({
      type: "object",
      additionalProperties: {
        type: "object",
        properties: { url: { type: "string" } },
        additionalProperties: {},
      },
    }),
    { type: "object", additionalProperties: { type: "object", properties: { url: { type: "string" } } } },
  );
});

void test("structural drops what zod adds and keeps properties named like keywords", () => {
  assert.deepEqual(
    structural({
      $schema: "x",
      type: "object",
      additionalProperties: false,
      properties: {
        minimum: { type: "integer", minimum: Number.MIN_SAFE_INTEGER, maximum: Number.MAX_SAFE_INTEGER },
        additionalProperties: { type: "integer", minimum: 0, additionalProperties: {} },
      },
    }),
    {
      type: "object",
      properties: { minimum: { type: "integer" }, additionalProperties: { type: "integer", minimum: 0 } },
    },
  );
});
