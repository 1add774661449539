import assert from "node:assert/strict";
import { test } from "node:test";
import { HaveBits, parseHave, perSourceLimit, pickWork, rotatedOrder, type Holder } from "./have.js";

const holder = (have: Holder["have"], o: Partial<Holder> = {}): Holder => ({
  alive: true,
  inflight: 0,
  others: 0,
  bytes: 0,
  have,
  ...o,
});

const bitsOf = (n: number, held: number[]): Uint8Array => {
  const b = new HaveBits(n);
  for (const i of held) b.set(i, true);
  return b.bits;
};

void test("a have bitmap round-trips through its header, and one made for another plan is refused", () => {
  const b = new HaveBits(11);
  b.set(0, true);
  b.set(9, true);
  b.set(9, true);
  b.set(12, true);
  assert.equal(b.held, 2, "setting twice or out of range counts nothing");
  const fetching = new HaveBits(11);
  fetching.set(3, true);
  const parsed = parseHave(b.header(4096, fetching), 4096, 11);
  const on = (bits: Uint8Array | undefined): number[] =>
    [...Array(11).keys()].filter((i) => ((bits?.[i >> 3] ?? 0) & (1 << (i & 7))) !== 0);
  assert.deepEqual(on(parsed?.have), [0, 9]);
  assert.deepEqual(on(parsed?.fetching), [3]);
  assert.equal(parseHave(b.header(4096), 8192, 11), undefined, "another chunk size");
  assert.equal(parseHave(b.header(4096), 4096, 40), undefined, "another chunk count");
  assert.equal(parseHave("garbage", 4096, 11), undefined);
  b.set(0, false);
  assert.equal(b.held, 1);
});

void test("the origin is asked for what no open filling copy holds, the rarest first, from each receiver's own place", () => {
  const queue = rotatedOrder(8, 0.5);
  assert.deepEqual(queue, [4, 5, 6, 7, 0, 1, 2, 3], "a receiver starting half way");
  // Only the origin holds anything: the first chunk of this receiver's own order.
  assert.deepEqual(pickWork(queue, [holder("all"), holder(bitsOf(8, []))], 2), { at: 0, source: 0 });
  // A filling copy holds chunk 4 (and is less busy): it gets chunk 4, not the origin.
  const peer = holder(bitsOf(8, [4]));
  const origin = holder("all", { others: 6 });
  assert.deepEqual(pickWork(queue, [origin, peer], 2), { at: 0, source: 1 });
  // With the copy at its limit of our requests, the origin is asked, for a chunk only it holds
  // when there is one (rarest), even if it comes later in the queue.
  const full = holder(bitsOf(8, [4]), { inflight: 2 });
  assert.deepEqual(pickWork(queue, [origin, full], 2), { at: 1, source: 0 });
  // The origin is never asked for a chunk an open copy holds, however busy that copy is.
  const busyPeer = holder(bitsOf(8, [0, 1, 2, 3, 4, 5, 6, 7]), { others: 50 });
  assert.deepEqual(pickWork(queue, [holder("all"), busyPeer], 2), { at: 0, source: 1 });
  // Nor for one a live filling copy is fetching now: that copy will hold it soon.
  const getting = { ...holder(bitsOf(8, [])), fetching: bitsOf(8, [4]) };
  assert.deepEqual(pickWork(queue, [holder("all"), getting], 2), { at: 1, source: 0 });
  // Nothing to ask: every holder at its limit, or dead, or holding nothing queued.
  assert.equal(pickWork(queue, [holder("all", { inflight: 2 }), holder(bitsOf(8, []))], 2), undefined);
  assert.equal(pickWork([], [holder("all")], 2), undefined);
  assert.equal(pickWork(queue, [holder("all", { alive: false })], 2), undefined);
});

void test("one source gets every stream, many share them with at least two each", () => {
  assert.equal(perSourceLimit(8, 1), 8);
  assert.equal(perSourceLimit(8, 3), 3);
  assert.equal(perSourceLimit(8, 17), 2);
  assert.equal(perSourceLimit(8, 0), 8);
});
