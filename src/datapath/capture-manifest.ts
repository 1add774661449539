/** The manifest a capture writes into its tree, and how it is written. */
import { constants as fsc } from "node:fs";
import { open, writeFile } from "node:fs/promises";
import type { CaptureOptions } from "./capture.js";
import type { Copied } from "./copy-tree.js";
import type { DigestAlgorithm } from "./digest.js";
import { exactTimes } from "./native.js";
import { areaOf, MANIFEST_VERSION, nameFields, type Manifest } from "./manifest.js";
import type { Scan, Skipped } from "./tree.js";
import { redactUrlCredentials } from "../core/env.js";

export async function writeDurably(path: string, body: string): Promise<void> {
  await writeFile(path, body, { mode: 0o444 });
  const fh = await open(path, fsc.O_RDONLY);
  try {
    await fh.sync();
  } finally {
    await fh.close();
  }
}

export function buildManifest(
  opts: Pick<CaptureOptions, "hash" | "model">,
  digest: DigestAlgorithm,
  scan: Scan,
  c: Copied,
  timings: Manifest["timings"],
): Manifest {
  const split: Manifest["split"] = {
    model: { files: 0, bytes: 0 },
    cache: { files: 0, bytes: 0 },
    other: { files: 0, bytes: 0 },
  };
  let totalBytes = 0;
  for (const f of c.files) {
    const area = split[areaOf(f.path)];
    area.files += 1;
    if (f.linkTo === undefined) {
      area.bytes += f.size;
      totalBytes += f.size;
    }
  }
  const round = (ms: number): number => Math.round(ms * 10) / 10;
  const byPath = (a: Skipped, b: Skipped): number => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0);
  return {
    version: MANIFEST_VERSION,
    hash: opts.hash ?? "",
    // What the tree holds, never how it was fetched: credentials in a URL stay out of the store.
    model: redactUrlCredentials(opts.model ?? ""),
    createdAt: new Date().toISOString(),
    captureMethod: c.method,
    directBytes: c.directBytes,
    exactTimes,
    digest,
    fileCount: c.files.length,
    totalBytes,
    dirCount: c.dirs,
    split,
    files: c.files.map((f) => ({
      ...nameFields(f.path, "path"),
      size: f.size,
      digest: f.digest,
      ...(f.linkTo === undefined ? {} : nameFields(f.linkTo, "linkTo")),
    })),
    symlinks: c.symlinks.map((l) => ({ ...nameFields(l.path, "path"), ...nameFields(l.target, "target") })),
    skipped: [...scan.skipped, ...c.skipped]
      .sort(byPath)
      .map((s) => ({ ...nameFields(s.path, "path"), reason: s.reason })),
    timings: {
      scanMs: round(timings.scanMs),
      copyMs: round(timings.copyMs),
      digestMs: round(timings.digestMs),
      commitMs: round(timings.commitMs),
      totalMs: round(timings.totalMs),
    },
  };
}
