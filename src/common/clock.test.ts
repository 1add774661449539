import { test } from "node:test";
import assert from "node:assert/strict";
import { Alarm, realClock } from "./clock.js";

test("an alarm set past Node's 2^31-1 ms timer limit does not fire at once", async () => {
  let fired = false;
  const alarm = new Alarm(realClock, () => {
    fired = true;
  });
  alarm.set(40 * 24 * 3600 * 1000); // 40 days: Node would run it after 1 ms
  await new Promise((r) => setTimeout(r, 50));
  assert.equal(fired, false);
  assert.equal(alarm.armed, true);
  alarm.clear();
});
