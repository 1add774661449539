import assert from "node:assert/strict";
import { test } from "node:test";
import { deflateRawSync } from "node:zlib";
import { HaveBits, parseHave, perSourceLimit, pickWork, rotatedOrder, type Holder } from "./have.js";
import { pickSource } from "./plan.js";

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

/** pickWork as its comment defines it, chunk by chunk and holder by holder: what the bitmap
 * version must always agree with. */
function pickWorkByDefinition(
  queue: readonly number[],
  holders: readonly Holder[],
  perSource: number,
): { at: number; source: number } | undefined {
  const bit = (b: Uint8Array | undefined, i: number): boolean => (((b?.[i >> 3] ?? 0) >> (i & 7)) & 1) === 1;
  const holds = (h: Holder, c: number): boolean => h.have === "all" || bit(h.have, c);
  const fetches = (h: Holder, c: number): boolean => bit(h.fetching, c);
  const open = holders.map((h) => h.alive && h.inflight < perSource);
  const rarity = queue.map((c) => holders.filter((h) => h.alive && (holds(h, c) || fetches(h, c))).length);
  const spread = queue.map((c) =>
    holders.some((h, i) => h.have !== "all" && ((open[i] && holds(h, c)) || (h.alive && fetches(h, c)))),
  );
  const wanted = (h: Holder, at: number): boolean =>
    holds(h, queue[at] as number) && (h.have !== "all" || !spread[at]);
  const useful = holders.map((h, i) => (open[i] as boolean) && queue.some((_, at) => wanted(h, at)));
  const source = pickSource(holders.map((h, i) => ({ ...h, alive: useful[i] as boolean })));
  if (source === undefined) return undefined;
  let best: number | undefined;
  for (let at = 0; at < queue.length; at++)
    if (
      wanted(holders[source] as Holder, at) &&
      (best === undefined || (rarity[at] as number) < (rarity[best] as number))
    )
      best = at;
  return best === undefined ? undefined : { at: best, source };
}

void test("the scheduler agrees with its definition on random swarms (queues, holders, loads, dead and filling copies)", () => {
  let seed = 20261203;
  const rnd = (): number => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  const bitmap = (chunks: number, p: number): Uint8Array => {
    const b = new HaveBits(chunks);
    for (let i = 0; i < chunks; i++) if (rnd() < p) b.set(i, true);
    return b.bits;
  };
  for (let round = 0; round < 2000; round++) {
    const chunks = 1 + Math.floor(rnd() * 70);
    const queue = rotatedOrder(chunks, rnd()).filter(() => rnd() < 0.7);
    if (rnd() < 0.3) queue.unshift(...queue.splice(Math.floor(rnd() * queue.length), 1)); // a retry
    const holders: Holder[] = Array.from({ length: 1 + Math.floor(rnd() * 6) }, () =>
      holder(rnd() < 0.3 ? "all" : bitmap(chunks, rnd()), {
        alive: rnd() < 0.85,
        inflight: Math.floor(rnd() * 4),
        others: Math.floor(rnd() * 3),
        bytes: Math.floor(rnd() * 3),
        ...(rnd() < 0.6 ? { fetching: bitmap(chunks, rnd() * 0.3) } : {}),
      }),
    );
    const perSource = 1 + Math.floor(rnd() * 3);
    assert.deepEqual(
      pickWork(queue, holders, perSource),
      pickWorkByDefinition(queue, holders, perSource),
      `round ${round}: ${JSON.stringify({ queue, perSource })}`,
    );
  }
});

void test("a have header stays small for a big tree, follows every change, and refuses what does not inflate to the plan", () => {
  const chunks = 16_384; // 1 GiB in 64 KiB chunks
  const own = new HaveBits(chunks);
  const fetching = new HaveBits(chunks);
  for (let i = 4096; i < 12_000; i++) own.set(i, true);
  fetching.set(12_000, true);
  const header = own.header(65_536, fetching);
  assert.ok(header.length < 200, `a filling copy's runs take ${header.length} characters, not 5,400`);
  assert.equal(parseHave(header, 65_536, chunks)?.have.filter((b) => b === 0xff).length, 7904 / 8);
  own.set(12_000, true);
  fetching.set(12_000, false);
  const next = parseHave(own.header(65_536, fetching), 65_536, chunks);
  assert.equal(next?.have[12_000 >> 3], 1, "the next answer says what changed");
  assert.equal(next?.fetching[12_000 >> 3], 0);

  const b64 = (b: Buffer): string => b.toString("base64");
  const bomb = b64(deflateRawSync(Buffer.alloc(64 << 20)));
  assert.equal(parseHave(`65536:${bomb}:${bomb}`, 65_536, chunks), undefined, "inflates past the plan");
  const raw = b64(Buffer.from(own.bits));
  assert.equal(parseHave(`65536:${raw}:${raw}`, 65_536, chunks), undefined, "not deflated");
});
