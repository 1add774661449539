import assert from "node:assert/strict";
import { test } from "node:test";
import type { InventoryItem } from "../control-plane/api.js";
import { ControlPlaneError } from "../control-plane/client.js";
import { Gate } from "../core/gate.js";
import { isNewer, type InstalledCredentials } from "./credentials.js";
import { EMPTY_INVENTORY, summarize, type GpuInventory } from "./inventory.js";
import {
  RegistrationManager,
  type IssuedCredentials,
  type RegistrationOptions,
  type RegistrationState,
} from "./registration.js";
import { deferred, FakeClock, memoryLogger, settle } from "../../test/support/testing.js";

const gpus = (count: number, gpuType = "H100"): GpuInventory =>
  count === 0 ? EMPTY_INVENTORY : summarize([{ node: "n1", gpuType, count }]);

const TTL = 3_600_000;
const unreachable = (): ControlPlaneError =>
  new ControlPlaneError("POST /v1/clusters/register failed: connect ECONNREFUSED", 0, { retryable: true });

/** A scripted control plane: every call is recorded; `fail` makes calls fail; `hold` makes them wait. */
function setup(o: Partial<RegistrationOptions> & { inv?: GpuInventory | undefined } = {}) {
  const clock = new FakeClock();
  const logs = memoryLogger();
  let inventory: GpuInventory | undefined = "inv" in o ? o.inv : gpus(4);
  let issued = 0;
  let fail = false;
  let inFlight = 0;
  let maxInFlight = 0;
  let hold: Promise<void> | undefined;
  const calls: { kind: "register" | "renew"; capacity?: InventoryItem[]; token?: string; at: number }[] = [];
  const states: RegistrationState[] = [];
  const persisted: InstalledCredentials[] = [];
  const respond = async (): Promise<IssuedCredentials> => {
    inFlight++;
    maxInFlight = Math.max(maxInFlight, inFlight);
    try {
      if (hold) await hold;
      if (fail) throw unreachable();
      issued++;
      return { token: `token-${issued}`, expiresAt: clock.now() + TTL, renewBeforeMs: TTL / 4 };
    } finally {
      inFlight--;
    }
  };
  const mgr = new RegistrationManager({
    clock,
    log: logs.log,
    issuer: "cp",
    pollIntervalMs: 60_000,
    backoffCapMs: 300_000,
    refreshIntervalMs: 24 * TTL,
    inventory: () => inventory,
    persist: (c) => {
      persisted.push(c);
      return Promise.resolve();
    },
    api: {
      register: (capacity) => {
        calls.push({ kind: "register", capacity, at: clock.now() });
        return respond();
      },
      renew: (token) => {
        calls.push({ kind: "renew", token, at: clock.now() });
        return respond();
      },
    },
    onState: (s) => states.push(s),
    ...o,
  });
  return {
    clock,
    logs,
    mgr,
    calls,
    states,
    persisted,
    maxInFlight: () => maxInFlight,
    setInventory(inv: GpuInventory | undefined) {
      inventory = inv;
      mgr.inventoryChanged();
    },
    setFail(f: boolean) {
      fail = f;
    },
    setHold(p: Promise<void> | undefined) {
      hold = p;
    },
  };
}

void test("registration failures back off from the poll interval, doubling up to the cap, as warnings", async () => {
  const s = setup();
  s.setFail(true);
  s.mgr.start();
  await settle();
  const waits: number[] = [];
  for (let i = 0; i < 6; i++) {
    const wait = s.mgr.nextRetryInMs;
    assert.ok(wait !== undefined);
    waits.push(wait);
    await s.clock.advance(wait);
  }
  assert.deepEqual(waits, [60_000, 120_000, 240_000, 300_000, 300_000, 300_000]);
  // The attempts really happened at those gaps.
  const gaps = s.calls.slice(1).map((c, i) => c.at - s.calls[i]!.at);
  assert.deepEqual(gaps, [60_000, 120_000, 240_000, 300_000, 300_000, 300_000]);
  assert.equal(s.logs.warnings().filter((e) => e.msg === "registration failed; will retry").length, 7);
  assert.equal(s.logs.errors().length, 0, "a recoverable retry is never an error");
  assert.equal(s.mgr.state.ready, false);
  assert.match(s.mgr.state.reason, /registration failing/);
  await s.mgr.stop();
});

void test("backoff resets after a success", async () => {
  const s = setup();
  s.setFail(true);
  s.mgr.start();
  await settle();
  await s.clock.advance(60_000);
  await s.clock.advance(120_000);
  assert.equal(s.mgr.nextRetryInMs, 240_000);
  s.setFail(false);
  await s.clock.advance(240_000);
  assert.equal(s.mgr.state.ready, true);
  assert.equal(s.mgr.nextRetryInMs, undefined);
  // The next failure (an inventory change while the control plane is down) starts over.
  s.setFail(true);
  s.setInventory(gpus(8));
  await settle();
  assert.equal(s.mgr.nextRetryInMs, 60_000);
  await s.mgr.stop();
});

void test("backoff resets on every new GPU state change, and the change is tried at once", async () => {
  const s = setup();
  s.setFail(true);
  s.mgr.start();
  await settle();
  await s.clock.advance(60_000);
  await s.clock.advance(120_000);
  assert.equal(s.mgr.nextRetryInMs, 240_000);
  const before = s.calls.length;
  s.setInventory(gpus(6));
  await settle();
  assert.equal(s.calls.length, before + 1, "registered right away, not after 240 s");
  assert.deepEqual(s.calls.at(-1)?.capacity, [{ gpuType: "H100", count: 6 }]);
  assert.equal(s.mgr.nextRetryInMs, 60_000);
  await s.mgr.stop();
});

void test("a poll interval slower than the cap is kept, before and after a reset", async () => {
  const s = setup({ pollIntervalMs: 600_000, backoffCapMs: 300_000 });
  s.setFail(true);
  s.mgr.start();
  await settle();
  assert.equal(s.mgr.nextRetryInMs, 600_000);
  await s.clock.advance(600_000);
  assert.equal(s.mgr.nextRetryInMs, 600_000);
  s.setInventory(gpus(2));
  await settle();
  assert.equal(s.mgr.nextRetryInMs, 600_000);
  await s.mgr.stop();
});

void test("ready only once registered and the credentials are installed (persisted first)", async () => {
  const saving = deferred();
  const s = setup({ inv: gpus(0), persist: () => saving.promise });
  s.mgr.start();
  await settle();
  assert.equal(s.calls.length, 0, "no GPUs and never registered: nothing to tell the control plane");
  assert.deepEqual(s.states.at(-1), {
    ready: false,
    reason: "no GPUs in the cluster",
    hasCredentials: false,
  });

  s.setInventory(gpus(4));
  await settle();
  assert.equal(s.calls.length, 1);
  assert.ok(s.mgr.installed, "installed in memory");
  assert.equal(s.states.at(-1)?.ready, false, "not ready while the credentials are being saved");
  saving.resolve();
  await settle();
  assert.equal(s.states.at(-1)?.ready, true);
  assert.equal(s.mgr.token, "token-1");
  await s.mgr.stop();
});

void test("losing the last GPU: not ready at once, then capacity zero is reported", async () => {
  const s = setup();
  s.mgr.start();
  await settle();
  assert.equal(s.mgr.state.ready, true);
  s.setFail(true);
  s.setInventory(gpus(0));
  await settle();
  assert.equal(s.mgr.state.ready, false);
  assert.equal(s.mgr.state.reason, "no GPUs in the cluster");
  assert.deepEqual(s.calls.at(-1)?.capacity, [], "tried to report capacity zero");
  s.setFail(false);
  await s.clock.advance(60_000);
  assert.deepEqual(s.mgr.installed?.capacity, []);
  assert.equal(s.mgr.token, "token-2", "still holds credentials (terminations keep working)");
  const n = s.calls.length;
  await s.clock.advance(600_000);
  assert.equal(s.calls.length, n, "zero reported once, not on every poll");
  await s.mgr.stop();
});

void test("three 0 → GPUs → 0 cycles without a restart", async () => {
  const s = setup({ inv: gpus(0) });
  s.mgr.start();
  await settle();
  const readiness: boolean[] = [];
  for (let i = 0; i < 3; i++) {
    s.setInventory(gpus(4));
    await settle();
    readiness.push(s.mgr.state.ready);
    s.setInventory(gpus(0));
    await settle();
    readiness.push(s.mgr.state.ready);
  }
  assert.deepEqual(readiness, [true, false, true, false, true, false]);
  assert.deepEqual(
    s.calls.map((c) => c.capacity?.length),
    [1, 0, 1, 0, 1, 0],
  );
  await s.mgr.stop();
  assert.equal(s.clock.pending, 0);
});

void test("renewal runs renew-before ahead of expiry, through the gate", async () => {
  const s = setup();
  s.mgr.start();
  await settle();
  assert.equal(s.mgr.token, "token-1");
  await s.clock.advance(TTL - TTL / 4 - 1);
  assert.equal(s.calls.length, 1);
  await s.clock.advance(1);
  assert.deepEqual(
    s.calls.map((c) => c.kind),
    ["register", "renew"],
  );
  assert.equal(s.calls[1]?.token, "token-1");
  assert.equal(s.mgr.token, "token-2");
  assert.equal(s.persisted.at(-1)?.token, "token-2");
  await s.mgr.stop();
});

void test("a renewal refused with 401 leads to a new registration", async () => {
  const s = setup();
  s.mgr.start();
  await settle();
  s.mgr.credentialsRejected("token-1");
  await settle();
  assert.deepEqual(
    s.calls.map((c) => c.kind),
    ["register", "register"],
  );
  assert.equal(s.mgr.token, "token-2");
  s.mgr.credentialsRejected("token-1");
  await settle();
  assert.equal(s.calls.length, 2, "a refusal of an older token changes nothing");
  await s.mgr.stop();
});

void test("renewal racing a re-registration: serialized, and the newest response is what stays installed", async () => {
  const s = setup();
  s.mgr.start();
  await settle();
  // The renewal falls due and the control plane is slow to answer it.
  const slow = deferred();
  s.setHold(slow.promise);
  await s.clock.advance(TTL - TTL / 4);
  assert.equal(s.calls.at(-1)?.kind, "renew");
  // Meanwhile the inventory changes: the re-registration must wait for the renewal.
  s.setInventory(gpus(8));
  await settle();
  assert.equal(s.mgr.gate.waiting, 1);
  assert.equal(s.calls.length, 2, "the registration has not started");
  slow.resolve();
  s.setHold(undefined);
  await settle();
  assert.deepEqual(
    s.calls.map((c) => c.kind),
    ["register", "renew", "register"],
  );
  assert.equal(s.maxInFlight(), 1, "never two credential calls at once");
  assert.equal(s.mgr.token, "token-3", "the last issued credentials are installed");
  assert.deepEqual(s.mgr.installed?.capacity, [{ gpuType: "H100", count: 8 }]);
  const generations = s.persisted.map((p) => p.generation);
  assert.deepEqual(generations, [1, 2, 3]);
  await s.mgr.stop();
});

void test("without the gate, the generation guard still refuses the older response", async () => {
  class OpenGate extends Gate {
    override async run<T>(fn: () => Promise<T> | T): Promise<T> {
      return fn();
    }
  }
  const renewing = deferred();
  let renewCalls = 0;
  const s = setup({
    gate: new OpenGate(),
    renewBeforeMs: TTL,
    api: {
      // The renewal starts first but answers last.
      renew: async () => {
        renewCalls++;
        await renewing.promise;
        return { token: "from-renewal", expiresAt: 1e15, renewBeforeMs: 1 };
      },
      register: () => Promise.resolve({ token: "from-registration", expiresAt: 2e15, renewBeforeMs: 1 }),
    },
  });
  const capacity = [{ gpuType: "H100", count: 4 }];
  s.mgr.restore({
    token: "old",
    expiresAt: s.clock.now() + TTL,
    renewBeforeMs: 1,
    generation: 7,
    capacity,
    issuer: "cp",
    // Half their life is gone: renewal is due at once.
    lifetimeMs: 2 * TTL,
  });
  s.mgr.start();
  await s.clock.advance(0);
  assert.equal(renewCalls, 1, "renewal in flight");
  s.setInventory(gpus(8));
  await settle();
  assert.equal(s.mgr.token, "from-registration");
  renewing.resolve();
  await settle();
  assert.equal(s.mgr.token, "from-registration", "the stale renewal did not overwrite it");
  assert.equal(s.persisted.length, 1);
  assert.ok(s.logs.warnings().some((e) => e.msg === "ignoring credentials older than the installed ones"));
  await s.mgr.stop();
});

void test("isNewer: only a strictly higher generation replaces the installed credentials", () => {
  const c = (generation: number): InstalledCredentials => ({
    token: `t${generation}`,
    expiresAt: 1,
    renewBeforeMs: 1,
    generation,
    capacity: [],
    issuer: "cp",
    lifetimeMs: 1,
  });
  assert.equal(isNewer(c(1), undefined), true);
  assert.equal(isNewer(c(2), c(1)), true);
  assert.equal(isNewer(c(1), c(2)), false);
  assert.equal(isNewer(c(2), c(2)), false);
});

void test("a waiter cancelled while a registration holds the gate runs no side effect", async () => {
  const slow = deferred();
  const s = setup({ renewBeforeMs: TTL });
  s.setHold(slow.promise);
  s.mgr.restore({
    token: "saved",
    expiresAt: s.clock.now() + TTL,
    renewBeforeMs: 1,
    generation: 3,
    capacity: [],
    issuer: "cp",
    lifetimeMs: 2 * TTL,
  });
  s.mgr.start();
  await s.clock.advance(0);
  // The registration (inventory differs from the saved capacity) holds the gate; renewal waits.
  assert.equal(s.mgr.gate.locked, true);
  assert.equal(s.mgr.gate.waiting, 1);
  assert.deepEqual(
    s.calls.map((c) => c.kind),
    ["register"],
  );
  const stopped = s.mgr.stop();
  await settle();
  assert.equal(s.mgr.gate.waiting, 0, "the cancelled renewal left the queue");
  slow.resolve();
  await stopped;
  assert.deepEqual(
    s.calls.map((c) => c.kind),
    ["register"],
    "renew was never called",
  );
  assert.equal(s.persisted.length, 0, "nothing installed after stop");
  assert.equal(s.mgr.token, "saved");
  assert.equal(s.clock.pending, 0, "no timer left behind");
});

void test("restored credentials: ready without registering when the capacity matches", async () => {
  const s = setup();
  s.mgr.restore({
    token: "saved",
    expiresAt: s.clock.now() + TTL,
    renewBeforeMs: TTL / 4,
    generation: 9,
    capacity: [{ gpuType: "H100", count: 4 }],
    issuer: "cp",
    lifetimeMs: TTL,
  });
  s.mgr.start();
  await settle();
  assert.equal(s.calls.length, 0);
  assert.equal(s.mgr.state.ready, true);
  await s.clock.advance(TTL - TTL / 4);
  assert.equal(s.calls[0]?.kind, "renew");
  assert.equal(s.persisted[0]?.generation, 10, "generations continue from the saved one");
  await s.mgr.stop();
});

void test("credentials from another control plane, or expired, are not reused", async () => {
  const s = setup();
  const base = {
    token: "x",
    renewBeforeMs: 1,
    generation: 1,
    capacity: [{ gpuType: "H100", count: 4 }],
    lifetimeMs: TTL,
  };
  assert.equal(s.mgr.restore({ ...base, expiresAt: s.clock.now() + TTL, issuer: "elsewhere" }), false);
  assert.equal(s.mgr.restore({ ...base, expiresAt: s.clock.now() - 1, issuer: "cp" }), false);
  s.mgr.start();
  await settle();
  assert.equal(s.calls[0]?.kind, "register");
  await s.mgr.stop();
});

void test("stop while backing off with a renewal armed leaves no timer", async () => {
  const s = setup({ refreshIntervalMs: 10_000 });
  s.mgr.start();
  await settle();
  s.setFail(true);
  s.setInventory(gpus(2));
  await settle();
  assert.ok(s.clock.pending >= 3, `retry, renewal, expiry and refresh armed (${s.clock.pending})`);
  await s.mgr.stop();
  assert.equal(s.clock.pending, 0);
  await s.clock.advance(10 * TTL);
  assert.equal(s.calls.length, 2, "nothing runs after stop");
});

for (const [what, o, serverRenewBefore] of [
  ["configured", { renewBeforeMs: 2 * TTL }, TTL / 4],
  ["told by the control plane", {}, TTL],
] as const) {
  void test(`a renew-before (${what}) at least as long as the credentials' lifetime renews at half their life, not back to back`, async () => {
    const held = deferred();
    let renewals = 0;
    const s = setup({
      ...o,
      api: {
        register: () =>
          Promise.resolve({
            token: "registered",
            expiresAt: s.clock.now() + TTL,
            renewBeforeMs: serverRenewBefore,
          }),
        renew: async () => {
          // A runaway loop would renew without end at one instant: stop it here so the test ends.
          if (++renewals > 50) await held.promise;
          return {
            token: `renewed-${renewals}`,
            expiresAt: s.clock.now() + TTL,
            renewBeforeMs: serverRenewBefore,
          };
        },
      },
    });
    s.mgr.start();
    await settle();
    assert.equal(s.mgr.token, "registered");
    const renewedAt: number[] = [];
    for (let i = 0; i < 6; i++) {
      await s.clock.advance(TTL / 2);
      renewedAt.push(renewals);
    }
    held.resolve();
    assert.deepEqual(renewedAt, [1, 2, 3, 4, 5, 6], "one renewal per half lifetime");
    assert.equal(s.mgr.renewBefore(s.mgr.installed!), TTL / 2);
    assert.equal(s.mgr.state.ready, true);
    await s.mgr.stop();
  });
}
