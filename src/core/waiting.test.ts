import { test } from "node:test";
import assert from "node:assert/strict";
import type { V1Pod } from "@kubernetes/client-node";
import { restoredFrom } from "./refs.js";
import { seedOutcome } from "./waiting.js";

const withSeed = (message: string | undefined, fill = true): V1Pod => ({
  metadata: { labels: { "warmstart.dev/hash": "0123456789abcdef" } },
  spec: {
    containers: [{ name: "e", image: "i" }],
    volumes: fill ? [{ name: "warmstart-fill", emptyDir: {} }] : [],
  },
  status: {
    initContainerStatuses: [
      {
        name: "warmstart-seed-cache",
        image: "w",
        imageID: "",
        ready: false,
        restartCount: 0,
        state: message === undefined ? { running: {} } : { terminated: { exitCode: 0, message } },
      },
    ],
  },
});

test("a waiting follower's seed outcome is read from its termination message, and nothing else", () => {
  assert.deepEqual(seedOutcome(withSeed('{"outcome":"cold","reason":"no cache","waitedMs":1200}')), {
    outcome: "cold",
    reason: "no cache",
    waitedMs: 1200,
  });
  assert.equal(seedOutcome(withSeed(undefined)), undefined, "still waiting");
  assert.equal(seedOutcome(withSeed("seeded /x from /y")), undefined, "logs, not an outcome");
  assert.equal(seedOutcome(withSeed('{"outcome":"warm"}')), undefined);
});

test("a waiting follower counts as a restore of its own hash only once its seed restored", () => {
  assert.equal(restoredFrom(withSeed('{"outcome":"restored","waitedMs":5}')), "0123456789abcdef");
  assert.equal(restoredFrom(withSeed('{"outcome":"cold","waitedMs":5}')), undefined);
  assert.equal(
    restoredFrom(withSeed('{"outcome":"restored","waitedMs":5}', false)),
    undefined,
    "no fill volume",
  );
});
