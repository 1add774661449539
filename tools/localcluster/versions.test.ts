import { test } from "node:test";
import assert from "node:assert/strict";
import { localStateDir } from "../../src/common/local-defaults.js";
import { stateDir } from "./versions.js";

void test("the product's lookup finds the state folder where the local cluster keeps it", () => {
  const saved = { ...process.env };
  try {
    for (const env of [
      { WARMSTART_STATE_DIR: "/tmp/some-state", XDG_STATE_HOME: undefined },
      { WARMSTART_STATE_DIR: undefined, XDG_STATE_HOME: "/tmp/xdg" },
      { WARMSTART_STATE_DIR: undefined, XDG_STATE_HOME: undefined },
    ]) {
      for (const [k, v] of Object.entries(env)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
      assert.equal(localStateDir(), stateDir());
    }
  } finally {
    process.env = saved;
  }
});
