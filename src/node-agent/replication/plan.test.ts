import assert from "node:assert/strict";
import { test } from "node:test";
import { digestOf } from "../../datapath/digest.js";
import type { Manifest } from "../../datapath/manifest.js";
import {
  checkManifest,
  decodeRel,
  encodeRel,
  parseRange,
  pickSource,
  planTree,
  safeRel,
  type SourceLoad,
  type TreeMeta,
} from "./plan.js";

const HASH = "c3".repeat(32);
const EMPTY = digestOf("sha256", "");

function manifest(over: Partial<Manifest> = {}): Manifest {
  return {
    version: 2,
    hash: HASH,
    model: "org/m",
    createdAt: "2026-01-01T00:00:00.000Z",
    captureMethod: "copy",
    exactTimes: true,
    digest: "sha256",
    fileCount: 4,
    totalBytes: 250,
    dirCount: 3,
    split: { model: { files: 2, bytes: 200 }, cache: { files: 2, bytes: 50 }, other: { files: 0, bytes: 0 } },
    files: [
      { path: "cache/a", size: 50, digest: "a".repeat(64) },
      { path: "cache/b", size: 50, digest: "a".repeat(64), linkTo: "cache/a" },
      { path: "model/big", size: 200, digest: "b".repeat(64) },
      { path: "model/empty", size: 0, digest: EMPTY },
    ],
    symlinks: [{ path: "model/link", target: "big" }],
    skipped: [],
    timings: { scanMs: 1, copyMs: 1, digestMs: 1, commitMs: 1, totalMs: 4 },
    ...over,
  };
}

const entry = (path: string, kind: "dir" | "file" | "symlink"): TreeMeta["entries"][number] => ({
  path,
  kind,
  mode: kind === "dir" ? 0o555 : 0o444,
  uid: 1000,
  gid: 1000,
  atimeNs: "1650000000123456789",
  mtimeNs: "1600000000987654321",
});

const meta = (extra: TreeMeta["entries"] = []): TreeMeta => ({
  hash: HASH,
  entries: [
    entry("", "dir"),
    entry("cache", "dir"),
    entry("model", "dir"),
    entry("cache/a", "file"),
    entry("cache/b", "file"),
    entry("model/big", "file"),
    entry("model/empty", "file"),
    entry("model/link", "symlink"),
    ...extra,
  ],
});

void test("names that are not UTF-8 or hold URL syntax round-trip through the URL path", () => {
  const names = ["model/a b", "x/%41?#", "caf\u00e9", "\u00ff\u0080/\u0001", "plain/name.bin"];
  for (const rel of names) {
    const enc = encodeRel(rel);
    assert.match(enc, /^[A-Za-z0-9\-._~/%]*$/, `${rel} is URL-safe`);
    assert.equal(decodeRel(enc), rel);
  }
  assert.equal(decodeRel("a%zz"), undefined);
  assert.equal(decodeRel("a%4"), undefined);
  assert.equal(decodeRel("\u00e9"), undefined);
});

void test("only plain relative paths are tree paths", () => {
  for (const ok of ["a", "a/b", "a/.b", "a..b/c"]) assert.ok(safeRel(ok), ok);
  for (const bad of [
    "",
    "/a",
    "a/",
    "a//b",
    ".",
    "..",
    "a/../b",
    "a/./b",
    "a\0b",
    ".warmstart-ready",
    ".warmstart-manifest.json",
  ])
    assert.ok(!safeRel(bad), JSON.stringify(bad));
});

void test("byte ranges follow RFC 9110: one range, suffixes, clamping and unsatisfiable ones", () => {
  assert.deepEqual(parseRange(undefined, 10), { kind: "full" });
  assert.deepEqual(parseRange("bytes=2-5", 10), { kind: "range", start: 2, end: 5 });
  assert.deepEqual(parseRange("bytes=2-", 10), { kind: "range", start: 2, end: 9 });
  assert.deepEqual(parseRange("bytes=2-100", 10), { kind: "range", start: 2, end: 9 });
  assert.deepEqual(parseRange("bytes=-3", 10), { kind: "range", start: 7, end: 9 });
  assert.deepEqual(parseRange("bytes=-30", 10), { kind: "range", start: 0, end: 9 });
  assert.deepEqual(parseRange("bytes=10-", 10), { kind: "unsatisfiable" });
  assert.deepEqual(parseRange("bytes=0-0", 0), { kind: "unsatisfiable" });
  assert.deepEqual(parseRange("bytes=-0", 10), { kind: "unsatisfiable" });
  assert.deepEqual(parseRange("bytes=0-1,4-5", 10), { kind: "full" });
  assert.deepEqual(parseRange("items=0-1", 10), { kind: "full" });
});

void test("a manifest is refused when it is for another hash or describes an impossible or escaping tree", () => {
  assert.doesNotThrow(() => checkManifest(manifest(), HASH));
  const bad: [string, Partial<Manifest>, RegExp][] = [
    ["another hash", { hash: "d4".repeat(32) }, /not c3/],
    [
      "a traversal path",
      { files: [{ path: "../etc/passwd", size: 250, digest: "a".repeat(64) }], fileCount: 1 },
      /bad or repeated/,
    ],
    [
      "an absolute path",
      { files: [{ path: "/etc/passwd", size: 250, digest: "a".repeat(64) }], fileCount: 1 },
      /bad or repeated/,
    ],
    ["a count that lies", { fileCount: 5 }, /fileCount/],
    ["a total that lies", { totalBytes: 1 }, /totalBytes/],
    ["a symlink out", { symlinks: [{ path: "model/link", target: "../../etc" }] }, /leads out/],
    ["an absolute symlink", { symlinks: [{ path: "model/link", target: "/etc" }] }, /leads out/],
    [
      "a link to nothing",
      {
        files: [
          ...manifest().files.slice(0, 1),
          { path: "cache/b", size: 50, digest: "a".repeat(64), linkTo: "cache/zz" },
          ...manifest().files.slice(2),
        ],
      },
      /hard link/,
    ],
    [
      "an empty file with data's digest",
      { files: [...manifest().files.slice(0, 3), { path: "model/empty", size: 0, digest: "c".repeat(64) }] },
      /empty file/,
    ],
  ];
  for (const [what, over, msg] of bad) assert.throws(() => checkManifest(manifest(over), HASH), msg, what);
});

void test("a plan cuts files into chunks, keeps links and symlinks, and takes directories from the metadata", () => {
  const plan = planTree(manifest(), meta(), 64);
  assert.deepEqual(
    plan.files.map((f) => f.rel),
    ["cache/a", "model/big", "model/empty"],
  );
  assert.deepEqual(plan.links, [{ rel: "cache/b", to: "cache/a" }]);
  assert.deepEqual(
    plan.symlinks.map((s) => [s.rel, s.target]),
    [["model/link", "big"]],
  );
  assert.deepEqual(
    plan.dirs.map((d) => d.rel),
    ["cache", "model"],
  );
  assert.deepEqual(
    plan.chunks.map((c) => [c.file, c.offset, c.length]),
    [
      [0, 0, 50],
      [1, 0, 64],
      [1, 64, 64],
      [1, 128, 64],
      [1, 192, 8],
    ],
  );
  assert.equal(plan.root.mtimeNs, 1600000000987654321n, "nanoseconds kept");
  assert.equal(plan.totalBytes, 250);
});

void test("metadata that does not describe the manifest's tree exactly is refused", () => {
  assert.throws(() => planTree(manifest(), meta([entry("model/extra", "file")]), 64), /does not/);
  assert.throws(() => planTree(manifest(), meta([entry("orphan/x", "dir")]), 64), /no parent/);
  assert.throws(() => planTree(manifest({ dirCount: 4 }), meta(), 64), /directories/);
  const wrongKind = meta();
  (wrongKind.entries[7] as { kind: string }).kind = "file";
  assert.throws(() => planTree(manifest(), wrongKind, 64), /as a symlink/);
  assert.throws(() => planTree(manifest(), meta([entry("../up", "dir")]), 64), /bad or repeated/);
  assert.throws(() => planTree(manifest(), { ...meta(), hash: "0".repeat(64) }, 64), /another tree/);
});

void test("chunks go to the least busy live source and spread over equal ones", () => {
  const loads: SourceLoad[] = [0, 1, 2].map(() => ({ alive: true, inflight: 0, others: 0, bytes: 0 }));
  const picks: number[] = [];
  for (let k = 0; k < 6; k++) {
    const i = pickSource(loads) as number;
    picks.push(i);
    (loads[i] as SourceLoad).inflight++;
  }
  assert.deepEqual(picks.sort(), [0, 0, 1, 1, 2, 2]);
  // A source busy serving others is passed over; a dropped one is never picked.
  const busy: SourceLoad[] = [
    { alive: true, inflight: 0, others: 5, bytes: 0 },
    { alive: false, inflight: 0, others: 0, bytes: 0 },
    { alive: true, inflight: 1, others: 0, bytes: 0 },
  ];
  assert.equal(pickSource(busy), 2);
  assert.equal(pickSource(busy, new Set([2])), 0, "an avoided source only when nothing else is left");
  assert.equal(pickSource([{ alive: false, inflight: 0, others: 0, bytes: 0 }]), undefined);
});
