import assert from "node:assert/strict";
import { test } from "node:test";
import type { V1Pod } from "@kubernetes/client-node";
import { pinnedOn, pinOf, planRoom, type HeldTree, type RoomAsk } from "./fair-share.js";

const H = "ab".repeat(32);
const OTHER = "cd".repeat(32);
const short = (h: string): string => h.slice(0, 16);

const pod = (
  o: {
    role?: string;
    hash?: string;
    claim?: string;
    volume?: string;
    namespace?: string;
    node?: string;
  } = {},
): V1Pod => ({
  metadata: {
    name: "p",
    namespace: o.namespace ?? "ns",
    annotations: {
      ...(o.role === undefined
        ? { "warmstart.dev/role": "restore" }
        : o.role
          ? { "warmstart.dev/role": o.role }
          : {}),
      "warmstart.dev/hash": o.hash ?? H,
    },
  },
  spec: {
    ...(o.node === "" ? {} : { nodeName: o.node ?? "n1" }),
    containers: [{ name: "e", image: "i" }],
    volumes: [
      {
        name: o.volume ?? "warmstart-ro",
        persistentVolumeClaim: { claimName: o.claim ?? `rox-${short(H)}` },
      },
    ],
  },
});

void test("pinOf: a restore or follower Warmstart admitted pins the tree of its read-only volume", () => {
  assert.equal(pinOf(pod()), short(H));
  assert.equal(pinOf(pod({ role: "follower" })), short(H));
  // restore-from: the claim admission chose is another cache's.
  assert.equal(pinOf(pod({ claim: `rox-${short(OTHER)}` })), short(OTHER));
});

void test("pinOf: nothing else pins", () => {
  const none: Array<[string, V1Pod]> = [
    ["no role (a plain pod mounting the claim by hand)", pod({ role: "" })],
    ["a leader (its decoration mounts no claim)", pod({ role: "leader" })],
    ["a cold pod", pod({ role: "cold" })],
    ["the claim under a volume of the pod's own", pod({ volume: "models" })],
    ["a follower whose claim is not its own hash's", pod({ role: "follower", claim: `rox-${short(OTHER)}` })],
    ["no full hash stamped", pod({ hash: short(H) })],
    ["a namespace the webhook never sees", pod({ namespace: "kube-system" })],
    ["not a rox claim", pod({ claim: "data" })],
  ];
  for (const [why, p] of none) assert.equal(pinOf(p), undefined, why);
});

void test("pinnedOn: the pod's own node, or wherever it runs on the node of the live tree; never outside a namespace scope", () => {
  const where = { scope: "namespace:ns", node: "n0" };
  assert.deepEqual([...pinnedOn([pod()], "n1", () => where)], [short(H)]);
  assert.deepEqual([...pinnedOn([pod({ node: "n2" })], "n1", () => where)], [], "another node's engine");
  assert.deepEqual([...pinnedOn([pod({ node: "" })], "n1", () => where)], [], "not scheduled yet");
  assert.deepEqual([...pinnedOn([pod({ node: "" })], "n0", () => where)], [short(H)], "live tree's node");
  assert.deepEqual([...pinnedOn([pod({ node: "n2" })], "n0", () => where)], [short(H)], "live tree's node");
  assert.deepEqual([...pinnedOn([pod({ namespace: "other" })], "n1", () => where)], [], "outside the scope");
  assert.deepEqual(
    [...pinnedOn([pod({ namespace: "other" })], "n1", () => ({ scope: "cluster" }))],
    [short(H)],
  );
  assert.deepEqual([...pinnedOn([pod()], "n1", () => undefined)], [short(H)], "no record: its node only");
  assert.deepEqual(
    [...pinnedOn([pod({ node: "n2" })], undefined, () => where)],
    [short(H)],
    "a shared store",
  );
});

const tree = (
  s: string,
  scope: string | undefined,
  bytes: number,
  lastUsed: number,
  evictable = true,
): HeldTree => ({
  short: s,
  scope,
  bytes,
  lastUsed,
  evictable,
});
const ask = (o: Partial<RoomAsk> & Pick<RoomAsk, "trees">): RoomAsk => ({
  short: "new",
  scope: "namespace:a",
  needed: 30,
  budget: 100,
  share: 0.5,
  reserved: [],
  ...o,
});
const evicted = (a: RoomAsk): string[] => {
  const r = planRoom(a);
  assert.ok(r.ok, r.ok ? "" : r.message);
  return r.evict.map((e) => e.short);
};

void test("planRoom: free room is anyone's, whatever its scope holds", () => {
  assert.deepEqual(evicted(ask({ trees: [tree("a1", "namespace:a", 70, 1)] })), []);
});

void test("planRoom: a scope over its share takes room from its own unused trees only, least recently restored first", () => {
  const trees = [
    tree("b1", "namespace:b", 20, 1),
    tree("a1", "namespace:a", 20, 3),
    tree("a2", "namespace:a", 20, 2),
    tree("a3", "namespace:a", 30, 9, false),
  ];
  assert.deepEqual(evicted(ask({ trees, needed: 40 })), ["a2", "a1"]);
});

void test("planRoom: a scope over its share is refused, with nothing evicted, when its own unused trees are not enough", () => {
  const trees = [
    tree("b1", "namespace:b", 30, 1),
    tree("a1", "namespace:a", 10, 2),
    tree("a2", "namespace:a", 60, 3, false),
  ];
  const r = planRoom(ask({ trees }));
  assert.equal(r.ok, false);
  assert.equal(!r.ok && r.why, "scope-over-share");
  assert.match(
    !r.ok ? r.message : "",
    /sharing scope namespace:a holds 70 B .*own unused caches, and those hold 10 B/,
  );
});

void test("planRoom: what a scope reserved for its fills in progress counts toward its share", () => {
  const trees = [tree("b1", "namespace:b", 55, 1), tree("a1", "namespace:a", 10, 2)];
  const reserved = [{ short: "a9", scope: "namespace:a", bytes: 20 }];
  // Without it a stays within its share and takes room from b, over its own.
  assert.deepEqual(evicted(ask({ trees, needed: 40 })), ["b1"]);
  // With it a would pass its share, and its own a1 is not enough.
  assert.equal(planRoom(ask({ trees, reserved, needed: 40 })).ok, false);
});

void test("planRoom: a scope that holds nothing else is never over, so a tree larger than the share still comes in", () => {
  const trees = [tree("b1", "namespace:b", 50, 1), tree("b2", "namespace:b", 40, 2)];
  assert.deepEqual(evicted(ask({ trees, needed: 70 })), ["b1", "b2"]);
});

void test("planRoom: a scope within its share takes the over-share scope's unused trees first, then the least recently restored", () => {
  const trees = [
    tree("c1", "namespace:c", 20, 1),
    tree("b1", "namespace:b", 30, 5),
    tree("b2", "namespace:b", 30, 4),
  ];
  // b holds 60 > 50: b2 goes (b is then at 30, within), then the least recently restored, c1.
  assert.deepEqual(evicted(ask({ trees, needed: 60 })), ["b2", "c1"]);
});

void test("planRoom: trees without a record go first, even for a scope over its share", () => {
  const trees = [
    tree("x", undefined, 30, 9),
    tree("b1", "namespace:b", 10, 1),
    tree("a1", "namespace:a", 60, 1, false),
  ];
  assert.deepEqual(evicted(ask({ trees })), ["x"]);
});

void test("planRoom: with only trees in use left, the store is full", () => {
  const trees = [tree("b1", "namespace:b", 50, 1, false), tree("a1", "namespace:a", 40, 1, false)];
  const r = planRoom(ask({ trees, scope: "namespace:c" }));
  assert.equal(!r.ok && r.why, "store-full");
  assert.match(
    !r.ok ? r.message : "",
    /the store budget is 100 B: 90 B held, 2 cache\(s\) in use, 30 B needed and only 0 B unused/,
  );
});

void test("planRoom: a larger share lets a scope take more before others are spared", () => {
  const trees = [tree("b1", "namespace:b", 30, 1), tree("a1", "namespace:a", 40, 2, false)];
  assert.equal(planRoom(ask({ trees, needed: 40 })).ok, false);
  assert.deepEqual(evicted(ask({ trees, needed: 40, share: 0.9 })), ["b1"]);
});
