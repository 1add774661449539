import assert from "node:assert/strict";
import { test } from "node:test";
import { status } from "@grpc/grpc-js";
import type { ModelCacheObject } from "../../common/modelcache.js";
import { parseMountInfo } from "./mounts.js";
import {
  CsiError,
  decidePublish,
  parseTargetPath,
  parseVolumeHandle,
  publishRequest,
  unpublishRequest,
} from "./request.js";
import { replicationSources } from "./fill.js";

const HASH = "ab".repeat(32);
const TARGET = "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pv/mount";
const MOUNT_CAP = { mount: {}, access_type: "mount", access_mode: { mode: "MULTI_NODE_READER_ONLY" } };

const codeOf = (fn: () => unknown): number | undefined => {
  try {
    fn();
  } catch (err) {
    assert.ok(err instanceof CsiError, `not a CsiError: ${String(err)}`);
    return err.code;
  }
  return undefined;
};

test("a volume handle is exactly a full cache hash: 64 lower-case hex digits", () => {
  assert.equal(parseVolumeHandle(HASH), HASH);
  const bad = [
    "",
    undefined,
    42,
    HASH.slice(0, 16), // the short hash names a folder, but is not a handle
    HASH.slice(0, 63),
    `${HASH}0`,
    HASH.toUpperCase(),
    `${HASH.slice(0, 16)}.tmp-1-abc`, // a staging folder's name
    `../${HASH.slice(3)}`,
    `${HASH.slice(0, 62)}/.`,
    `${HASH.slice(0, 63)}\n`,
    `${HASH.slice(0, 63)}\0`,
    ` ${HASH.slice(1)}`,
    "g".repeat(64),
    `${HASH}#ns`, // the shared-volume backend's per-namespace suffix is not this driver's
  ];
  for (const h of bad)
    assert.equal(
      codeOf(() => parseVolumeHandle(h)),
      status.INVALID_ARGUMENT,
      String(h),
    );
});

test("a target path is absolute, without NUL or '..', and comes back normalized", () => {
  assert.equal(parseTargetPath(TARGET), TARGET);
  assert.equal(parseTargetPath(`${TARGET}/`), TARGET);
  assert.equal(parseTargetPath("/a//b/./c"), "/a/b/c");
  for (const p of ["", undefined, "relative/path", "/a/../b", "/a/b/..", "/a\0b"])
    assert.equal(
      codeOf(() => parseTargetPath(p)),
      status.INVALID_ARGUMENT,
      String(p),
    );
});

test("a publish needs a volume id, a target path and a mount capability, in that order", () => {
  assert.equal(
    codeOf(() => publishRequest({})),
    status.INVALID_ARGUMENT,
  );
  assert.throws(() => publishRequest({}), /volume_id is required/);
  const noTarget = (): unknown => publishRequest({ volume_id: "fake-vol-id", volume_capability: MOUNT_CAP });
  assert.throws(noTarget, /target_path is required/);
  const noCap = (): unknown => publishRequest({ volume_id: "fake-vol-id", target_path: TARGET });
  assert.throws(noCap, /volume_capability is required/);
  const block = (): unknown =>
    publishRequest({
      volume_id: HASH,
      target_path: TARGET,
      volume_capability: { block: {}, access_type: "block" },
    });
  assert.equal(codeOf(block), status.INVALID_ARGUMENT);
  assert.throws(block, /block volumes are not supported/);
  const badHandle = (): unknown =>
    publishRequest({ volume_id: HASH.slice(0, 16), target_path: TARGET, volume_capability: MOUNT_CAP });
  assert.throws(badHandle, /full cache hash/);
});

test("a publish asked read-write, or as a single writer, is accepted: it is made read-only regardless", () => {
  const r = publishRequest({
    volume_id: HASH,
    target_path: TARGET,
    readonly: false,
    volume_capability: {
      mount: { mount_flags: ["rw"] },
      access_type: "mount",
      access_mode: { mode: "SINGLE_NODE_WRITER" },
    },
  });
  assert.deepEqual(r, {
    hash: HASH,
    target: TARGET,
    asked: { readonly: false, accessMode: "SINGLE_NODE_WRITER" },
  });
});

test("an unpublish needs a volume id and a target path, whatever the id (its target is unmounted all the same)", () => {
  assert.deepEqual(unpublishRequest({ volume_id: HASH, target_path: TARGET }), { target: TARGET });
  assert.deepEqual(unpublishRequest({ volume_id: "x", target_path: TARGET }), { target: TARGET });
  assert.throws(() => unpublishRequest({ target_path: TARGET }), /volume_id is required/);
  assert.throws(() => unpublishRequest({ volume_id: HASH }), /target_path is required/);
});

test("the publish decision: a retry is done, a writable bind is made read-only, another mount is refused", () => {
  assert.equal(decidePublish({ committed: true, mount: { kind: "none" } }), "mount");
  assert.equal(decidePublish({ committed: false, mount: { kind: "none" } }), "fetch-then-mount");
  assert.equal(decidePublish({ committed: true, mount: { kind: "tree", readOnly: true } }), "done");
  assert.equal(decidePublish({ committed: false, mount: { kind: "tree", readOnly: true } }), "done");
  assert.equal(
    decidePublish({ committed: true, mount: { kind: "tree", readOnly: false } }),
    "remount-read-only",
  );
  assert.equal(
    decidePublish({ committed: true, mount: { kind: "other", source: "/dev/sda1:/" } }),
    "conflict",
  );
  assert.equal(decidePublish({ committed: false, mount: { kind: "other", source: "tmpfs:/" } }), "conflict");
});

test("mountinfo: the mount point and its per-mount options, escapes undone", () => {
  const text = [
    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw",
    "600 22 8:1 /store/abcdef0123456789 /var/lib/kubelet/pods/u\\0401/mount ro,nosuid,nodev,relatime shared:1 - ext4 /dev/sda1 rw",
    "garbage",
    "",
  ].join("\n");
  const entries = parseMountInfo(text);
  assert.equal(entries.length, 2);
  assert.deepEqual(entries[1], {
    root: "/store/abcdef0123456789",
    point: "/var/lib/kubelet/pods/u 1/mount",
    options: ["ro", "nosuid", "nodev", "relatime"],
    fsType: "ext4",
    source: "/dev/sda1",
  });
});

function record(over: {
  hash?: string;
  phase?: string;
  digest?: string;
  replicas?: object;
  deleting?: boolean;
}): ModelCacheObject {
  return {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: HASH.slice(0, 16), ...(over.deleting ? { deletionTimestamp: new Date() } : {}) },
    spec: { hash: over.hash ?? HASH },
    status: {
      phase: over.phase ?? "Ready",
      ...(over.digest === "" ? {} : { manifestDigest: over.digest ?? "cd".repeat(32) }),
      replicas: over.replicas ?? {
        "node-a": { url: "https://10.0.0.1:9465", at: "2026-01-01T00:00:00Z" },
        "node-b": { url: "https://10.0.0.2:9465", at: "2026-01-01T00:00:00Z" },
      },
    },
  } as unknown as ModelCacheObject;
}

test("replication sources come from a Ready record of the same hash, other nodes' copies only", () => {
  assert.deepEqual(replicationSources(record({}), HASH, "node-b"), {
    digest: "cd".repeat(32),
    sources: [{ node: "node-a", url: "https://10.0.0.1:9465" }],
  });
  const code = (c: ModelCacheObject | undefined, node = "node-c"): number | undefined =>
    codeOf(() => replicationSources(c, HASH, node));
  assert.equal(code(undefined), status.NOT_FOUND);
  assert.equal(code(record({ hash: `${HASH.slice(0, 16)}${"0".repeat(48)}` })), status.NOT_FOUND);
  assert.equal(code(record({ phase: "Promoting" })), status.UNAVAILABLE);
  assert.equal(code(record({ deleting: true })), status.UNAVAILABLE);
  assert.equal(code(record({ digest: "" })), status.FAILED_PRECONDITION);
  assert.equal(code(record({ replicas: {} })), status.UNAVAILABLE);
  assert.equal(
    code(record({ replicas: { "node-a": { url: "https://10.0.0.1:9465" } } }), "node-a"),
    status.UNAVAILABLE,
  );
  assert.equal(code(record({ replicas: { "node-a": { url: "http://10.0.0.1:9465" } } })), status.UNAVAILABLE);
});

test("a copy another node is still filling is a source of what it holds; a stale fill or a URL that does not parse is none", () => {
  const replicas = {
    "node-a": { url: "https://10.0.0.1:9465", at: "2026-01-01T00:00:00Z" },
    "node-b": {
      url: "https://10.0.0.2:9465",
      at: new Date().toISOString(),
      filling: { doneBytes: 5, totalBytes: 10 },
    },
    // Left by an agent that died mid-fill, and a URL that does not parse: neither is a source.
    "node-d": {
      url: "https://10.0.0.4:9465",
      at: "2026-01-01T00:00:00Z",
      filling: { doneBytes: 1, totalBytes: 10 },
    },
    "node-e": { url: "https://[x", at: "2026-01-01T00:00:00Z" },
  };
  assert.deepEqual(replicationSources(record({ replicas }), HASH, "node-c").sources, [
    { node: "node-a", url: "https://10.0.0.1:9465" },
    { node: "node-b", url: "https://10.0.0.2:9465", filling: true },
  ]);
});
