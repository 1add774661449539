import { test } from "node:test";
import assert from "node:assert/strict";
import { pino } from "pino";
import * as k8s from "@kubernetes/client-node";
import { DraLookups, TtlCache, draApi, type DraApi } from "./lookups.js";

test("a value is read once per TTL, concurrent readers share one read, a failed read keeps the last value", async () => {
  let now = 0;
  let reads = 0;
  let fail = false;
  const stale: string[] = [];
  const cache = new TtlCache<string>(
    5_000,
    (key) => {
      reads++;
      return fail ? Promise.reject(new Error("api down")) : Promise.resolve(`${key}@${now}`);
    },
    (key) => stale.push(key),
    () => now,
  );
  assert.deepEqual(await Promise.all([cache.get("a"), cache.get("a")]), ["a@0", "a@0"]);
  assert.equal(reads, 1);
  now = 4_999;
  assert.equal(await cache.get("a"), "a@0");
  assert.equal(reads, 1);
  now = 5_000;
  fail = true;
  assert.equal(await cache.get("a"), "a@0", "the last value read stands through an API blip");
  assert.deepEqual(stale, ["a"]);
  await assert.rejects(cache.get("b"), /api down/, "nothing known yet: the error is the caller's");
  fail = false;
  assert.equal(await cache.get("a"), "a@5000");
  cache.invalidate("a");
  now = 5_001;
  assert.equal(await cache.get("a"), "a@5001");
});

/** A DRA API over fixed objects, counting its reads; `fail` makes every read fail. */
function fakeDra(objects: {
  templates?: Record<string, unknown>;
  claims?: Record<string, unknown>;
  classes?: unknown[];
}): DraApi & { reads: string[]; fail: boolean } {
  const api = {
    reads: [] as string[],
    fail: false,
    readClaimTemplate: (namespace: string, name: string) => {
      api.reads.push(`template ${namespace}/${name}`);
      return api.fail
        ? Promise.reject(new Error("api down"))
        : Promise.resolve(objects.templates?.[`${namespace}/${name}`]);
    },
    readClaim: (namespace: string, name: string) => {
      api.reads.push(`claim ${namespace}/${name}`);
      return api.fail
        ? Promise.reject(new Error("api down"))
        : Promise.resolve(objects.claims?.[`${namespace}/${name}`]);
    },
    listDeviceClasses: () => {
      api.reads.push("classes");
      return api.fail ? Promise.reject(new Error("api down")) : Promise.resolve(objects.classes ?? []);
    },
  };
  return api;
}

const template = (deviceClassName: string): unknown => ({
  spec: { spec: { devices: { requests: [{ name: "r", exactly: { deviceClassName } }] } } },
});
const deviceClass = (name: string, driver: string): unknown => ({
  metadata: { name },
  spec: { selectors: [{ cel: { expression: `device.driver == '${driver}'` } }] },
});
const silent = pino({ level: "silent" });

test("DRA claims are judged by their objects and the DeviceClasses, read once per TTL; what does not exist holds no GPU", async () => {
  const api = fakeDra({
    templates: { "ns/compute": template("a100"), "ns/gpu": template("gpu.example.com") },
    claims: {
      "ns/shared": { spec: { devices: { requests: [{ name: "r", deviceClassName: "gpu.nvidia.com" }] } } },
    },
    classes: [
      deviceClass("a100", "gpu.nvidia.com"),
      deviceClass("gpu.nvidia.com", "gpu.nvidia.com"),
      deviceClass("gpu.example.com", "gpu.example.com"),
    ],
  });
  const dra = new DraLookups(api, silent, 60_000);
  const refs = [
    { name: "accel", template: "compute" },
    { name: "gpu", template: "gpu" },
    { name: "s", claim: "shared" },
    { name: "gone", template: "missing" },
    { name: "again", template: "compute" },
    { name: "nothing" },
  ];
  const got = await dra.gpuClasses("ns", refs);
  assert.deepEqual(Object.fromEntries(got), {
    "template/compute": ["gpu.nvidia.com"],
    "template/gpu": [],
    "claim/shared": ["gpu.nvidia.com"],
    "template/missing": [],
  });
  assert.deepEqual(api.reads.sort(), [
    "claim ns/shared",
    "classes",
    "template ns/compute",
    "template ns/gpu",
    "template ns/missing",
  ]);
  await dra.gpuClasses("ns", refs);
  assert.equal(api.reads.length, 5, "cached");
  assert.deepEqual(
    Object.fromEntries(await dra.gpuClasses("other", [{ name: "a", template: "compute" }])),
    {
      "template/compute": [],
    },
    "a template is its namespace's",
  );
  assert.deepEqual(await dra.gpuClasses("ns", [{ name: "x" }]), new Map(), "nothing to read");
});

test("a DRA read that fails with nothing read before throws (the pod is admitted as written); one read before stands", async () => {
  const api = fakeDra({
    templates: { "ns/t": template("gpu.nvidia.com") },
    classes: [deviceClass("gpu.nvidia.com", "gpu.nvidia.com")],
  });
  // Read again on every look: only what was read before can stand in for a failed read.
  const dra = new DraLookups(api, silent, 0);
  const refs = [{ name: "g", template: "t" }];
  api.fail = true;
  await assert.rejects(dra.gpuClasses("ns", refs), /api down/);
  api.fail = false;
  assert.deepEqual([...(await dra.gpuClasses("ns", refs)).values()], [["gpu.nvidia.com"]]);
  api.fail = true;
  assert.deepEqual([...(await dra.gpuClasses("ns", refs)).values()], [["gpu.nvidia.com"]]);
});

test("the claims read are bounded: past the most held, the oldest is read again", async () => {
  const api = fakeDra({ templates: {}, classes: [] });
  const dra = new DraLookups(api, silent, 60_000, 2);
  for (const t of ["a", "b", "c", "a"]) await dra.gpuClasses("ns", [{ name: "g", template: t }]);
  assert.deepEqual(
    api.reads.filter((r) => r !== "classes"),
    ["template ns/a", "template ns/b", "template ns/c", "template ns/a"],
  );
});

test("a DRA read: a 404 that names the object is no object; any other 404 tries the next version; other errors throw", async () => {
  const status = (details: object): string =>
    JSON.stringify({ kind: "Status", status: "Failure", reason: "NotFound", code: 404, details });
  const calls: string[] = [];
  const version = (tag: string, fail?: { code: number; body: string }) =>
    ({
      readNamespacedResourceClaimTemplate: ({ name }: { name: string }) => {
        calls.push(`${tag} ${name}`);
        return fail
          ? Promise.reject(new k8s.ApiException(fail.code, "x", fail.body, {}))
          : Promise.resolve({ tag });
      },
    }) as unknown as k8s.ResourceV1Api & k8s.ResourceV1beta1Api;
  const unserved = { code: 404, body: status({}) };
  assert.deepEqual(await draApi(version("v1", unserved), version("v1beta1")).readClaimTemplate("ns", "t"), {
    tag: "v1beta1",
  });
  const gone = {
    code: 404,
    body: status({ name: "t", group: "resource.k8s.io", kind: "resourceclaimtemplates" }),
  };
  assert.equal(await draApi(version("v1", gone), version("v1beta1")).readClaimTemplate("ns", "t"), undefined);
  const bare = { code: 404, body: "404 page not found" };
  assert.equal(
    await draApi(version("v1", bare), version("v1beta1", bare)).readClaimTemplate("ns", "t"),
    undefined,
  );
  assert.deepEqual(calls, ["v1 t", "v1beta1 t", "v1 t", "v1 t", "v1beta1 t"]);
  const refused = { code: 403, body: JSON.stringify({ reason: "Forbidden", message: "no" }) };
  await assert.rejects(
    draApi(version("v1", refused), version("v1beta1")).readClaimTemplate("ns", "t"),
    /reading ResourceClaimTemplate ns\/t: 403 Forbidden no/,
  );
});
