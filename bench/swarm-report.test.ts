import assert from "node:assert/strict";
import { test } from "node:test";
import { progressLine } from "./swarm-report.js";

const GiB = 2 ** 30;

test("progress: bytes over every receiver, the slowest, and when the last should be done at its rate", () => {
  const line = progressLine(
    120,
    [
      { doneBytes: 0.25 * GiB, committed: false },
      { doneBytes: 0.5 * GiB, committed: false },
      { doneBytes: 0, committed: true },
    ],
    GiB,
  );
  // A committed receiver counts whole, whatever its last report said.
  assert.equal(
    line,
    "120 s: 1.75 of 3.00 GiB fetched, 2 of 3 filling, slowest at 25%, the last done in about 360 s at this rate",
  );
});

test("progress: no estimate before the slowest has a byte, nor once every receiver is done", () => {
  assert.equal(
    progressLine(60, [{ doneBytes: 0, committed: false }], GiB),
    "60 s: 0.00 of 1.00 GiB fetched, 1 of 1 filling, slowest at 0%",
  );
  assert.equal(
    progressLine(60, [{ doneBytes: 5, committed: true }], GiB),
    "60 s: 1.00 of 1.00 GiB fetched, 0 of 1 filling, slowest at 100%",
  );
});
