import assert from "node:assert/strict";
import { test } from "node:test";
import { HOST_PATH_PROVISIONER } from "../core/contract.js";
import { hostPathVolume } from "./objects.js";
import { BUILT_IN_PROFILES, DEFAULT_HANDLE_TEMPLATE, parseProfiles, resolveProfile } from "./profiles.js";
import { CacheSourceSchema } from "./source.js";

const none = new Map();

void test("the local store resolves to host-path with prewarm on and 6 readers", () => {
  const p = resolveProfile(none, HOST_PATH_PROVISIONER);
  assert.equal(p.backend, "host-path");
  assert.equal(p.hostPathType, "local");
  assert.equal(p.prewarm, true);
  assert.equal(p.prewarmParallelism, 6);
  assert.equal(p.storageClassName, "");
  assert.deepEqual(p.mountOptions, []);
  assert.equal(p.handleTemplate, DEFAULT_HANDLE_TEMPLATE);
  assert.equal(p.origin, "built-in");
  assert.equal(p.note, undefined);
});

void test("local-path-provisioner stores get local volumes mounted read-only (a root pod cannot write them), not hostPath", () => {
  const p = resolveProfile(none, "rancher.io/local-path");
  assert.equal(p.backend, "host-path");
  assert.equal(p.hostPathType, "local");
  const short = "0123456789abcdef";
  const pv = hostPathVolume(
    short,
    CacheSourceSchema.parse({
      backend: p.backend,
      provisioner: "rancher.io/local-path",
      sizeBytes: 1,
      node: "gpu-0",
      path: `/opt/local-path-provisioner/store/${short}`,
      hostPathType: p.hostPathType,
      mountOptions: p.mountOptions,
    }),
    "ns",
  );
  assert.equal(pv.spec?.hostPath, undefined);
  assert.equal(pv.spec?.local?.path, `/opt/local-path-provisioner/store/${short}`);
  assert.ok(pv.spec?.mountOptions?.includes("ro"), "mounted ro on the node");
});

void test("an unknown provisioner cannot be shared and says how to fix that", () => {
  const p = resolveProfile(none, "example.com/mystery");
  assert.equal(p.backend, "per-pod-clone");
  assert.equal(p.origin, "none");
  assert.match(
    p.note ?? "",
    /no storage profile names provisioner example\.com\/mystery.*warmstart-storage-profiles/,
  );
});

void test("a ConfigMap entry overrides the built-in one field by field, and per volume type", () => {
  const { entries, errors } = parseProfiles({
    "pd.csi.storage.gke.io": [
      "snapshotClass: hdml-snapshots",
      "storageClassName: hyperdisk-ml",
      "prewarmParallelism: 12",
      "volumeTypes:",
      "  hyperdisk-ml:",
      "    prewarm: false",
      "    mountOptions: [ro, noatime]",
    ].join("\n"),
  });
  assert.deepEqual(errors, []);
  const ml = resolveProfile(entries, "pd.csi.storage.gke.io", "hyperdisk-ml");
  assert.equal(ml.backend, "snapshot-clone", "kept from the built-in profile");
  assert.equal(ml.snapshotClass, "hdml-snapshots");
  assert.equal(ml.storageClassName, "hyperdisk-ml");
  assert.equal(ml.prewarm, false, "the type override wins");
  assert.equal(ml.prewarmParallelism, 12);
  assert.deepEqual(ml.mountOptions, ["ro", "noatime"]);
  assert.equal(ml.origin, "configmap");
  // The built-in per-type override still applies to other types.
  const balanced = resolveProfile(entries, "pd.csi.storage.gke.io", "pd-balanced");
  assert.equal(balanced.backend, "per-pod-clone");
  assert.equal(balanced.prewarm, true);
  assert.equal(balanced.prewarmParallelism, 12);
});

void test("JSON values and new provisioners are accepted", () => {
  const { entries, errors } = parseProfiles({
    "nas.example.com": JSON.stringify({
      backend: "shared-volume",
      handleTemplate: "{handle}:{namespace}",
      volumeAttributes: { subDir: "{path}" },
      prewarm: false,
    }),
  });
  assert.deepEqual(errors, []);
  const p = resolveProfile(entries, "nas.example.com");
  assert.equal(p.backend, "shared-volume");
  assert.equal(p.handleTemplate, "{handle}:{namespace}");
  assert.deepEqual(p.volumeAttributes, { subDir: "{path}" });
  assert.equal(p.prewarm, false);
  assert.equal(p.prewarmParallelism, 6);
});

void test("a bad key is reported and skipped while the good ones still count", () => {
  const { entries, errors } = parseProfiles({
    "good.example.com": "backend: shared-volume",
    "typo.example.com": "backend: shared-volumes",
    "range.example.com": "prewarmParallelism: 0",
    "unknown.example.com": "prewarmParalelism: 4",
    "broken.example.com": "backend: [unclosed",
  });
  assert.deepEqual([...entries.keys()], ["good.example.com"]);
  assert.equal(errors.length, 4);
  assert.ok(
    errors.some((e) => e.startsWith("typo.example.com: backend:")),
    errors.join("\n"),
  );
  assert.ok(
    errors.some((e) => e.startsWith("range.example.com: prewarmParallelism:")),
    errors.join("\n"),
  );
  assert.ok(
    errors.some((e) => e.startsWith("unknown.example.com:")),
    errors.join("\n"),
  );
  assert.ok(
    errors.some((e) => e.startsWith("broken.example.com: not YAML")),
    errors.join("\n"),
  );
  // A typo never silently changes a known provisioner's behaviour.
  assert.equal(resolveProfile(entries, "typo.example.com").backend, "per-pod-clone");
});

void test("an empty value or no ConfigMap data means built-in profiles", () => {
  assert.equal(parseProfiles(undefined).entries.size, 0);
  const { entries } = parseProfiles({ [HOST_PATH_PROVISIONER]: "" });
  const p = resolveProfile(entries, HOST_PATH_PROVISIONER);
  assert.equal(p.backend, "host-path");
  assert.equal(p.origin, "configmap");
});

test("every built-in profile says why it suits its driver, and resolves to a backend", () => {
  for (const [provisioner, entry] of Object.entries(BUILT_IN_PROFILES)) {
    const p = resolveProfile(new Map(), provisioner);
    assert.ok(p.why && p.why.length > 10, `${provisioner}: a reason`);
    assert.equal(p.origin, "built-in");
    for (const type of Object.keys(entry.volumeTypes ?? {}))
      assert.ok(resolveProfile(new Map(), provisioner, type).why, `${provisioner} ${type}: a reason`);
  }
  assert.equal(resolveProfile(new Map(), "efs.csi.aws.com").backend, "shared-volume");
  assert.deepEqual(resolveProfile(new Map(), "nvmesh-csi.excelero.com").mountOptions, [
    "ro",
    "norecovery",
    "nouuid",
  ]);
  assert.equal(resolveProfile(new Map(), "pd.csi.storage.gke.io", "pd-ssd").backend, "per-pod-clone");
  assert.equal(resolveProfile(new Map(), "disk.csi.azure.com").backend, "per-pod-clone");
});
