/**
 * Seed: build a pod's writable shadow of a read-only captured tree.
 *
 * Model files stay where they are: the shadow holds symlinks into the read-only tree, so a
 * multi-GB model costs nothing to seed. Compile caches (everything outside `model/`) are copied
 * with their nanosecond times, because engines write into them and rebuild what looks newer. The
 * hub's `.locks` and `refs` are copied too, since engines write there next to the model.
 * Directories are real and owned by whoever runs the seed, so new files can go anywhere. Nothing
 * here needs root or chown: a pod running as any UID can seed its own shadow.
 *
 * The tree is checked against its manifest before anything is seeded (the hash it was captured
 * for, when given; the same regular files with the same sizes, the same symlinks, the same
 * number of directories, nothing else), and every file seed copies is digested as it is copied
 * and must match the manifest. Model files used in place are checked by size only: digesting
 * 100 GB on every pod start would cost more than the download it replaces.
 *
 * The shadow is the pod's and may hold symlinks left by an earlier container of the same pod:
 * every name in it is created or replaced below a directory descriptor, never through a symlink
 * (beneath.ts). A symlink where the tree has a directory or a copied file is replaced, not
 * followed.
 */
import { createHash, randomBytes } from "node:crypto";
import type { BigIntStats } from "node:fs";
import {
  closeSync,
  constants as fsc,
  chmodSync,
  fchmodSync,
  fstatSync,
  futimesSync,
  lstatSync,
  mkdirSync,
  openSync,
  readSync,
  readlinkSync,
  renameSync,
  rmSync,
  symlinkSync,
  unlinkSync,
  writeSync,
} from "node:fs";
import { mkdir, realpath } from "node:fs/promises";
import { posix, resolve } from "node:path";
import type { Logger } from "../common/log.js";
import { MANIFEST_FILE, READY_MARKER } from "../core/contract.js";
import {
  at,
  bytes,
  closeFd,
  O_PATH,
  openBeneath,
  openDirNoFollow,
  openScannedFile,
  requireProcFd,
  skipReasonOf,
  toBin,
} from "./beneath.js";
import { createDigest, digestAvailable } from "./digest.js";
import { nameOf, parseManifest, type Manifest } from "./manifest.js";
import { exactTimes, setFdTimesNs, setTimesNsSync } from "./native.js";
import type { FileStat } from "./native-file.js";
import { usedInPlace } from "./in-place.js";
import { isReady } from "./ready.js";
import { isMissing, scanTree, yieldNow, type Scan, type TreeEntry } from "./tree.js";

export interface SeedOptions {
  /** The read-only captured tree (must carry the ready marker and its manifest). */
  from: string;
  /** The writable shadow; created if missing. */
  to: string;
  /** The full cache hash the tree must have been captured for (sha256 hex). */
  hash?: string;
  /** sha256 (hex) of the manifest's bytes, from the cache's record: the tree must be that one. */
  manifestDigest?: string;
  /**
   * Make the shadow writable by any UID: for a workload whose UID is not known when its pod is
   * admitted (it comes from its image). Only the containers of that one pod ever see the shadow.
   */
  anyUid?: boolean;
  log?: Logger;
}

export interface SeedResult {
  /** Model files reached through a symlink into the read-only tree. */
  linked: number;
  /** Files copied (compile caches, `.locks`, `refs`). */
  copied: number;
  bytesCopied: number;
  dirs: number;
  /** The tree's own symlinks, recreated as they are. */
  symlinks: number;
  /** Entries already in the shadow from an earlier seed (or written by the engine since): kept. */
  kept: number;
  /** Symlinks found in the shadow where the tree has a directory or a copied file: replaced. */
  replaced: number;
}

const CHUNK = 1 << 20;
const sha256 = (b: Buffer): string => createHash("sha256").update(b).digest("hex");

export async function seed(opts: SeedOptions): Promise<SeedResult> {
  requireProcFd("seed");
  const from = await realpath(opts.from).catch((err: unknown) => {
    throw new Error(
      `cannot seed from ${opts.from}: ${isMissing(err) ? "no such directory" : (err as Error).message}`,
    );
  });
  if (!(await isReady(from))) {
    throw new Error(`${from} has no ${READY_MARKER}: the capture is not complete; refusing to seed from it`);
  }
  const toAbs = resolve(opts.to);
  await mkdir(toAbs, { recursive: true });
  const to = await realpath(toAbs);
  if (to === from || to.startsWith(`${from}/`) || from.startsWith(`${to}/`)) {
    throw new Error(`the shadow ${to} and the captured tree ${from} must not contain one another`);
  }

  const fromFd = openDirNoFollow(from);
  let toFd: number | undefined;
  try {
    const { manifest, raw } = readManifestAt(fromFd, from);
    if (opts.manifestDigest !== undefined && sha256(raw) !== opts.manifestDigest) {
      throw new Error(
        `refusing to seed from ${from}: its manifest is not the one the cache's record names (tampered, or another tree)`,
      );
    }
    if (opts.hash !== undefined && manifest.hash !== opts.hash) {
      throw new Error(
        `refusing to seed from ${from}: it was captured for hash ${manifest.hash || "(none)"}, not ${opts.hash}`,
      );
    }
    const scan = await scanTree(fromFd, { reserved: [READY_MARKER, MANIFEST_FILE] });
    const digests = checkAgainstManifest(scan, manifest, from);
    try {
      toFd = openDirNoFollow(toAbs);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === "ELOOP" || (code === "ENOTDIR" && lstatSync(toAbs).isSymbolicLink()))
        throw new Error(`refusing to seed into ${toAbs}: it is a symlink`);
      throw err;
    }
    // The kubelet makes an emptyDir 0777 already; a root this process created it opens up itself.
    if (opts.anyUid && (fstatSync(toFd).mode & 0o777) !== 0o777) fchmodSync(toFd, 0o777);
    const res = await build(fromFd, toFd, toBin(from), scan, manifest, digests, opts.anyUid ?? false);
    opts.log?.info({ from, to, ...res }, "seeded");
    return res;
  } finally {
    closeSync(fromFd);
    if (toFd !== undefined) closeSync(toFd);
  }
}

/** The manifest at the root of the tree, opened as a regular file (never through a symlink). */
function readManifestAt(fromFd: number, from: string): { manifest: Manifest; raw: Buffer } {
  const where = `${from}/${MANIFEST_FILE}`;
  let fd: number;
  try {
    fd = openBeneath(fromFd, MANIFEST_FILE, fsc.O_RDONLY | fsc.O_NONBLOCK);
  } catch (err) {
    const why =
      skipReasonOf(err) === "vanished"
        ? "it has no manifest"
        : `its manifest cannot be opened (${(err as Error).message})`;
    throw new Error(`refusing to seed from ${from}: ${why}`);
  }
  try {
    const st = fstatSync(fd);
    if (!st.isFile()) throw new Error(`refusing to seed from ${from}: ${where} is not a regular file`);
    if (st.size > 1 << 30) throw new Error(`refusing to seed from ${from}: ${where} is too large`);
    const buf = Buffer.alloc(st.size);
    let off = 0;
    while (off < buf.length) {
      const n = readSync(fd, buf, off, buf.length - off, off);
      if (n === 0) break;
      off += n;
    }
    const raw = buf.subarray(0, off);
    return { manifest: parseManifest(raw.toString("utf8"), where), raw };
  } catch (err) {
    const msg = (err as Error).message;
    throw new Error(msg.startsWith("refusing") ? msg : `refusing to seed from ${from}: ${msg}`, {
      cause: err,
    });
  } finally {
    closeFd(fd);
  }
}

/**
 * Compares the scanned tree with its manifest: the same regular files with the same sizes, the
 * same symlinks with the same targets, as many directories, and nothing the capture would have
 * left out (special files, links out of the tree). Returns each file's digest by path.
 */
function checkAgainstManifest(scan: Scan, m: Manifest, from: string): Map<string, string> {
  const problems: string[] = [];
  const show = (bin: string): string => Buffer.from(bin, "latin1").toString("utf8");
  for (const s of scan.skipped) {
    if (s.reason !== "reserved") problems.push(`${show(s.path)} is left out (${s.reason})`);
  }
  const files = new Map(m.files.map((f) => [nameOf(f.path, f.pathBytes), f]));
  const links = new Map(
    m.symlinks.map((l) => [nameOf(l.path, l.pathBytes), nameOf(l.target, l.targetBytes)]),
  );
  let dirs = 0;
  const seen = new Set<string>();
  for (const e of scan.entries) {
    if (e.kind === "dir") dirs += 1;
    else if (e.kind === "file") {
      const f = files.get(e.rel);
      seen.add(e.rel);
      if (!f) problems.push(`${show(e.rel)} is not in the manifest`);
      else if (BigInt(f.size) !== e.stat.size)
        problems.push(`${show(e.rel)} is ${e.stat.size} bytes, the manifest says ${f.size}`);
    } else if (e.kind === "symlink") {
      seen.add(e.rel);
      const t = links.get(e.rel);
      if (t === undefined) problems.push(`symlink ${show(e.rel)} is not in the manifest`);
      else if (t !== e.target) problems.push(`symlink ${show(e.rel)} does not point where the manifest says`);
    }
  }
  for (const rel of [...files.keys(), ...links.keys()])
    if (!seen.has(rel)) problems.push(`${show(rel)} is in the manifest but not in the tree`);
  if (dirs !== m.dirCount) problems.push(`${dirs} directories, the manifest says ${m.dirCount}`);
  if (problems.length) {
    const more = problems.length > 3 ? ` (and ${problems.length - 3} more)` : "";
    throw new Error(
      `refusing to seed from ${from}: the tree does not match its manifest: ${problems.slice(0, 3).join("; ")}${more}`,
    );
  }
  return new Map([...files].map(([rel, f]) => [rel, f.digest]));
}

const parentOf = (rel: string): string => posix.dirname(rel).replace(/^\.$/, "");
const baseOf = (rel: string): string => posix.basename(rel);

/** The directory `rel` of the shadow, opened below its root (no symlink on the way). */
const openShadowDir = (toFd: number, rel: string): number => openBeneath(toFd, rel, O_PATH | fsc.O_DIRECTORY);

function lstatOrUndefined(path: Buffer): BigIntStats | undefined {
  try {
    return lstatSync(path, { bigint: true });
  } catch (err) {
    if (isMissing(err)) return undefined;
    throw err;
  }
}

async function build(
  fromFd: number,
  toFd: number,
  from: string,
  scan: Scan,
  m: Manifest,
  digests: Map<string, string>,
  anyUid: boolean,
): Promise<SeedResult> {
  const res: SeedResult = {
    linked: 0,
    copied: 0,
    bytesCopied: 0,
    dirs: 0,
    symlinks: 0,
    kept: 0,
    replaced: 0,
  };

  // Sorted by path, a directory comes before everything below it.
  const dirs = scan.entries.filter((e) => e.kind === "dir" && e.rel !== "");
  for (const d of dirs) {
    const parent = openShadowDir(toFd, parentOf(d.rel));
    try {
      const path = at(parent, baseOf(d.rel));
      const st = lstatOrUndefined(path);
      if (st?.isSymbolicLink()) {
        unlinkSync(path);
        res.replaced += 1;
      } else if (st && !st.isDirectory()) {
        throw new Error(
          `cannot seed ${Buffer.from(d.rel, "latin1").toString()}: something that is not a directory is in the way`,
        );
      }
      if (!st || st.isSymbolicLink()) mkdirSync(path, { mode: (Number(d.stat.mode) & 0o777) | 0o700 });
    } finally {
      closeFd(parent);
    }
    if (anyUid) {
      // Through the directory's own descriptor: nothing put in its place is ever chmod-ed.
      const fd = openShadowDir(toFd, d.rel);
      try {
        chmodSync(at(fd), 0o777);
      } finally {
        closeFd(fd);
      }
    }
    res.dirs += 1;
  }

  const toCopy: TreeEntry[] = [];
  let n = 0;
  for (const e of scan.entries) {
    if (e.kind === "file" && !usedInPlace(e.rel)) toCopy.push(e);
    else if (e.kind === "file") {
      if (placeLink(toFd, e.rel, `${from}/${e.rel}`)) res.linked += 1;
      else res.kept += 1;
    } else if (e.kind === "symlink") {
      if (placeLink(toFd, e.rel, e.target as string, e.stat)) res.symlinks += 1;
      else res.kept += 1;
    }
    if (++n % 256 === 0) await yieldNow();
  }

  // One file at a time: each copy is a run of synchronous calls (compile caches are small files).
  for (const e of toCopy) {
    await yieldNow();
    let r: ReturnType<typeof copyIn>;
    try {
      r = copyIn(fromFd, toFd, e, digests.get(e.rel) as string, m, anyUid ? 0o666 : 0o600);
    } catch (err) {
      // A model folder's file only its writer may read (a hub client's 0600 metadata), seeded by
      // a process whose UID is not the workload's: the workload reads it in place, as itself.
      if ((err as NodeJS.ErrnoException).code !== "EACCES" || !e.rel.startsWith("model/")) throw err;
      if (placeLink(toFd, e.rel, `${from}/${e.rel}`)) res.linked += 1;
      else res.kept += 1;
      continue;
    }
    if (r === "kept") res.kept += 1;
    else {
      if (r === "replaced") res.replaced += 1;
      res.copied += 1;
      res.bytesCopied += Number(e.stat.size);
    }
  }

  // Directory times after their contents, deepest first (the root of the shadow is the pod's).
  dirs.sort((a, b) => b.rel.split("/").length - a.rel.split("/").length);
  for (const d of dirs) {
    const fd = openShadowDir(toFd, d.rel);
    try {
      setTimesNsSync(at(fd), d.stat.atimeNs, d.stat.mtimeNs, false);
    } finally {
      closeFd(fd);
    }
  }
  return res;
}

/**
 * Makes `rel` in the shadow a symlink to `target` (byte strings). Returns false when something is
 * already there and kept: the same link, or a file or directory (the engine's own). A link to
 * elsewhere is replaced.
 */
function placeLink(toFd: number, rel: string, target: string, times?: FileStat): boolean {
  const parent = openShadowDir(toFd, parentOf(rel));
  try {
    const name = baseOf(rel);
    const path = at(parent, name);
    const st = lstatOrUndefined(path);
    if (
      st &&
      (!st.isSymbolicLink() || readlinkSync(path, { encoding: "buffer" }).toString("latin1") === target)
    )
      return false;
    const tmp = at(parent, `${name}.seed-${randomBytes(4).toString("hex")}`);
    symlinkSync(bytes(target), tmp);
    if (times) setTimesNsSync(tmp, times.atimeNs, times.mtimeNs, true);
    renameSync(tmp, path);
    return true;
  } finally {
    closeFd(parent);
  }
}

/**
 * Copies one file of the tree into the shadow, beside its place and renamed in, so an interrupted
 * seed never leaves a short file; digested as it is copied and checked against the manifest.
 * "kept" when a file or directory is there already (the engine's, or an earlier seed's).
 */
function copyIn(
  fromFd: number,
  toFd: number,
  e: TreeEntry,
  want: string,
  m: Manifest,
  /** Permission bits every copy gets on top of its own (owner-writable, or writable by all). */
  writable: number,
): "copied" | "replaced" | "kept" {
  const parent = openShadowDir(toFd, parentOf(e.rel));
  try {
    const name = baseOf(e.rel);
    const path = at(parent, name);
    const st = lstatOrUndefined(path);
    if (st && !st.isSymbolicLink()) return "kept";
    const src = openScannedFile(fromFd, e.rel, e.stat);
    const show = Buffer.from(e.rel, "latin1").toString();
    if (src.skip) throw new Error(`cannot seed ${show}: it changed in the read-only tree (${src.skip})`);
    const tmp = at(parent, `${name}.seed-${randomBytes(4).toString("hex")}`);
    try {
      // O_EXCL|O_NOFOLLOW: a fresh file, never something planted under that name.
      const out = openSync(tmp, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, 0o600);
      try {
        // A process that cannot compute the manifest's digest still checks the size.
        const h = digestAvailable(m.digest) ? createDigest(m.digest) : undefined;
        const buf = Buffer.allocUnsafe(CHUNK);
        let pos = 0;
        for (;;) {
          const got = readSync(src.fd, buf, 0, buf.length, pos);
          if (got === 0) break;
          h?.update(buf.subarray(0, got));
          for (let off = 0; off < got;) off += writeSync(out, buf, off, got - off, pos + off);
          pos += got;
        }
        if (pos !== Number(e.stat.size))
          throw new Error(`refusing to seed ${show}: it changed size while it was copied`);
        if (h && h.hex() !== want)
          throw new Error(
            `refusing to seed ${show}: its content does not match the manifest's ${m.digest} digest`,
          );
        fchmodSync(out, (Number(e.stat.mode) & 0o777) | writable);
        if (exactTimes) setFdTimesNs(out, e.stat.atimeNs, e.stat.mtimeNs, show);
        else futimesSync(out, Number(e.stat.atimeNs) / 1e9, Number(e.stat.mtimeNs) / 1e9);
      } finally {
        closeSync(out);
      }
      renameSync(tmp, path);
    } catch (err) {
      rmSync(tmp, { force: true });
      throw err;
    } finally {
      closeFd(src.fd);
    }
    return st ? "replaced" : "copied";
  } finally {
    closeFd(parent);
  }
}
