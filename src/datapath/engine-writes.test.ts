import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { engineWritesSince } from "./engine-writes.js";

function file(root: string, rel: string, at: Date): void {
  mkdirSync(join(root, rel, ".."), { recursive: true });
  writeFileSync(join(root, rel), "x");
  utimesSync(join(root, rel), at, at);
}

test("a restored engine's writes: files newer than its start, outside model/ and locks; symlinks never followed", (t) => {
  const dir = mkdtempSync(join(tmpdir(), "writes-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const [shadow, elsewhere] = [join(dir, "shadow"), join(dir, "elsewhere")];
  const seeded = new Date("2026-12-01T10:00:00Z");
  const started = new Date("2026-12-01T10:05:00Z");
  const later = new Date("2026-12-01T10:05:30Z");
  // What the seed copied keeps the leader's times.
  file(shadow, "cache/torchinductor/ab/cab.so", seeded);
  file(shadow, "cache/vllm/modelinfos/llama.json", seeded);
  assert.deepEqual(engineWritesSince(shadow, started.getTime()), { files: 0 }, "nothing compiled again");

  file(shadow, "cache/torchinductor/cd/ccd.main.so", later);
  file(shadow, "cache/torchinductor/locks/ccd.lock", later);
  file(shadow, "model/huggingface/hub/.locks/x.lock", later);
  file(shadow, "model/huggingface/hub/models--a--b/refs/main", later);
  // The pod points a name of its shadow at another folder full of new files: not walked.
  file(elsewhere, "secret/new-1", later);
  file(elsewhere, "secret/new-2", later);
  symlinkSync(elsewhere, join(shadow, "cache", "outside"));
  assert.deepEqual(engineWritesSince(shadow, started.getTime()), {
    files: 1,
    example: "cache/torchinductor/cd/ccd.main.so",
  });
  // A shadow that is itself a symlink is refused, not followed.
  const link = join(dir, "link");
  symlinkSync(shadow, link);
  assert.throws(() => engineWritesSince(link, started.getTime()), /ELOOP|ENOTDIR/);
});

test("a shadow past the walk's bounds says nothing rather than a partial count", (t) => {
  const dir = mkdtempSync(join(tmpdir(), "writes-"));
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  let deep = join(dir, "cache");
  for (let i = 0; i < 30; i++) deep = join(deep, "d");
  mkdirSync(deep, { recursive: true });
  assert.equal(engineWritesSince(dir, 0), undefined, "30 folders deep");
  rmSync(join(dir, "cache"), { recursive: true });
  for (let i = 0; i < 60; i++) file(dir, `cache/f${i}`, new Date());
  assert.equal(engineWritesSince(dir, 0, { maxEntries: 50 }), undefined, "more entries than the bound");
  assert.equal(engineWritesSince(dir, 0, { maxEntries: 100 })?.files, 60);
});
