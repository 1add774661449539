import { test } from "node:test";
import assert from "node:assert/strict";
import type { V1Pod } from "@kubernetes/client-node";
import type { ModelCacheObject } from "../common/modelcache.js";
import { status } from "@grpc/grpc-js";
import { CsiError } from "./csi/request.js";
import { ScopeOverShareError, StoreFullError } from "./fair-share.js";
import { afterFillFailure, decideFill } from "./fill-decide.js";

const HASH = "ab".repeat(32);
const NOW = Date.parse("2026-12-05T10:00:00Z");
const waiting = (
  over: { annotations?: Record<string, string>; created?: string; seedEnded?: boolean } = {},
): V1Pod => ({
  metadata: {
    name: "p",
    namespace: "ns",
    uid: "u1",
    creationTimestamp: new Date(over.created ?? "2026-12-05T09:59:00Z"),
    labels: { "warmstart.dev/waiting": "true", "warmstart.dev/hash": HASH.slice(0, 16) },
    annotations: {
      "warmstart.dev/role": "follower",
      "warmstart.dev/hash": HASH,
      "warmstart.dev/wait-until": "2026-12-05T10:20:00Z",
      ...over.annotations,
    },
  },
  spec: {
    containers: [
      { name: "e", image: "i", volumeMounts: [{ name: "warmstart-fill", mountPath: "/f", readOnly: true }] },
    ],
    volumes: [{ name: "warmstart-fill", emptyDir: {} }],
  },
  status: over.seedEnded
    ? {
        initContainerStatuses: [
          {
            name: "warmstart-seed-cache",
            image: "w",
            imageID: "",
            ready: false,
            restartCount: 0,
            state: { terminated: { exitCode: 0 } },
          },
        ],
      }
    : {},
});
const record = (phase: string, at = "2026-12-05T09:59:30Z", hash = HASH): ModelCacheObject => ({
  apiVersion: "warmstart.dev/v1alpha1",
  kind: "ModelCache",
  metadata: { name: hash.slice(0, 16) },
  spec: { hash },
  status: { phase: phase as "Ready", lastTransitionTime: at, reason: "CaptureFailed", message: "disk full" },
});

test("a waiting follower is filled once its cache is Ready, and waits until then", () => {
  assert.deepEqual(decideFill(waiting(), record("Ready"), NOW), { do: "fill", hash: HASH });
  const w = decideFill(waiting(), record("Capturing"), NOW);
  assert.equal(w.do, "wait");
  assert.equal(
    w.do === "wait" && w.untilMs,
    Date.parse("2026-12-05T10:20:00Z"),
    "looked at again at its deadline",
  );
  assert.equal(
    decideFill(waiting(), undefined, NOW).do,
    "wait",
    "no record yet: the leader's is being written",
  );
});

test("it starts cold when the election fails after it was admitted, past its deadline, or when the record is not its cache's", () => {
  const failed = decideFill(waiting(), record("Failed"), NOW);
  assert.equal(failed.do, "cold");
  assert.match(failed.do === "cold" ? failed.reason : "", /failed: CaptureFailed disk full/);
  // A failure from before the pod existed is the previous election's: the next one is coming.
  assert.equal(decideFill(waiting(), record("Failed", "2026-12-05T09:00:00Z"), NOW).do, "wait");
  assert.equal(decideFill(waiting(), record("Ready"), Date.parse("2026-12-05T10:20:00Z")).do, "cold");
  assert.equal(decideFill(waiting(), record("Ready", undefined, "cd".repeat(32)), NOW).do, "cold");
  const deleting = record("Ready");
  deleting.metadata.deletionTimestamp = new Date("2026-12-05T09:59:59Z");
  assert.equal(decideFill(waiting(), deleting, NOW).do, "cold");
});

test("nothing is written for a pod that is not a waiting follower, whose seed ended, or that is going", () => {
  assert.equal(decideFill(undefined, record("Ready"), NOW).do, "none");
  assert.equal(decideFill(waiting({ seedEnded: true }), record("Ready"), NOW).do, "none");
  assert.equal(
    decideFill(waiting({ annotations: { "warmstart.dev/role": "cold" } }), record("Ready"), NOW).do,
    "none",
  );
  const gone = waiting();
  gone.metadata!.deletionTimestamp = new Date(NOW);
  assert.equal(decideFill(gone, record("Ready"), NOW).do, "none");
  const noVolume = waiting();
  noVolume.spec!.volumes = [];
  assert.equal(
    decideFill(noVolume, record("Ready"), NOW).do,
    "none",
    "only a volume the webhook made is filled",
  );
});

test("attacker: a container of the pod that can write the fill volume (an ephemeral one added later) gets no fill", () => {
  const p = waiting();
  p.spec!.ephemeralContainers = [
    { name: "debug", image: "busybox", volumeMounts: [{ name: "warmstart-fill", mountPath: "/f" }] },
  ];
  const d = decideFill(p, record("Ready"), NOW);
  assert.equal(
    d.do,
    "cold",
    "the agent writes as root into that folder: never while the pod can write it too",
  );
});

void test("a fill refused because its sharing scope holds its fair share starts cold at once, saying so; a full store is tried again", () => {
  const over = new CsiError(
    status.RESOURCE_EXHAUSTED,
    "no room for cache abababababababab in this node's store",
  );
  over.cause = new ScopeOverShareError(
    "namespace:a",
    "sharing scope namespace:a holds 70.0 MB of this node's store",
  );
  assert.deepEqual(afterFillFailure(over, "abababababababab"), {
    do: "cold",
    reason:
      "cache abababababababab is Ready but has no room in this node's store: sharing scope namespace:a holds 70.0 MB of this node's store",
  });
  const full = new CsiError(status.RESOURCE_EXHAUSTED, "no room: the store budget is 1 MB");
  full.cause = new StoreFullError("the store budget is 1 MB");
  assert.equal(afterFillFailure(full, "abababababababab").do, "retry");
  assert.equal(
    afterFillFailure(new CsiError(status.UNAVAILABLE, "no copy yet"), "abababababababab").do,
    "retry",
  );
  assert.equal(afterFillFailure(new Error("digest mismatch"), "abababababababab").do, "cold");
});
