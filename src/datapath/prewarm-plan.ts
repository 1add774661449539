/**
 * What a prewarm has to read: each file is looked up in the page cache first (native.ts:
 * cachestat, else mincore, neither of which reads anything). A file wholly there is left out, a
 * file partly there is read only in the chunks that are missing, anything else is read whole.
 * The lookups are a few system calls a file, made on the calling thread before any reader
 * starts, so a tree that is already in memory costs no reader at all.
 */
import { closeSync, constants as fsc, openSync } from "node:fs";
import { fileSize, missingPages, pageSize, residencyMethod, type ResidencyMethod } from "./native.js";
import { closeRawFd, openAtRaw } from "./native-file.js";

export interface ReadTask {
  path: string;
  /** The file's size when it was looked up. */
  size: number;
  /** [start, end) byte ranges to read; absent: the whole file. */
  ranges?: [number, number][];
}

export interface ReadPlan {
  tasks: ReadTask[];
  /** Files wholly in the page cache, and the bytes not to read (those files and the resident
   * chunks of the others). */
  residentFiles: number;
  residentBytes: number;
  /** How residency was looked up; null when it could not be (every file is read whole). */
  residency: ResidencyMethod | null;
}

/** Looks up each of `paths` (in order) and says what to read of it. */
export function planReads(
  paths: string[],
  chunkBytes: number,
  note: (path: string, err: unknown) => void,
): ReadPlan {
  const plan: ReadPlan = { tasks: [], residentFiles: 0, residentBytes: 0, residency: null };
  // Each file is opened by its name in its folder, the folder kept open while the next file is
  // in it too: a file's look-up is then four short calls (openat, lseek, cachestat, close).
  const folder = { path: "", fd: -1 };
  const flags = fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK;
  const openFile = (path: string): [number, boolean] => {
    const slash = path.lastIndexOf("/");
    const dir = path.slice(0, slash + 1);
    if (dir !== folder.path) {
      if (folder.fd >= 0) closeSync(folder.fd);
      folder.fd = -1;
      folder.path = dir;
      folder.fd = openSync(dir || ".", fsc.O_RDONLY | fsc.O_DIRECTORY);
    }
    const raw = openAtRaw(folder.fd, path.slice(slash + 1), flags);
    return raw === undefined ? [openSync(path, flags), false] : [raw, true];
  };
  try {
    for (const path of paths) {
      let fd: [number, boolean] | undefined;
      try {
        fd = openFile(path);
        // A name swapped for a FIFO or a device since the listing fails here (ESPIPE) or when
        // it is read: an error counted, never a hang (O_NONBLOCK) or a device read to its end.
        planFile(plan, path, fd[0], fileSize(fd[0]), chunkBytes);
      } catch (err) {
        note(path, err);
      } finally {
        if (fd) (fd[1] ? closeRawFd : closeSync)(fd[0]);
      }
    }
  } finally {
    if (folder.fd >= 0) closeSync(folder.fd);
  }
  plan.residency = residencyMethod() ?? null;
  return plan;
}

function planFile(plan: ReadPlan, path: string, fd: number, size: number, chunk: number): void {
  const missing = missingPages(fd, 0, size);
  if (missing === 0) {
    plan.residentFiles += 1;
    plan.residentBytes += size;
    return;
  }
  // Nothing there, or no way to tell: one sequential read, which the kernel reads ahead of.
  if (missing === undefined || missing >= Math.ceil(size / pageSize())) {
    plan.tasks.push({ path, size });
    return;
  }
  // Partly there (another replica on this node read part of it): the missing chunks, runs of
  // them merged into one range each. Every chunk is looked up before anything is read, so what
  // the kernel reads ahead later is not taken for what was there before.
  const ranges: [number, number][] = [];
  for (let pos = 0; pos < size; pos += chunk) {
    const end = Math.min(size, pos + chunk);
    if (missingPages(fd, pos, end - pos) === 0) {
      plan.residentBytes += end - pos;
    } else {
      const last = ranges[ranges.length - 1];
      if (last && last[1] === pos) last[1] = end;
      else ranges.push([pos, end]);
    }
  }
  plan.tasks.push({ path, size, ranges });
}
