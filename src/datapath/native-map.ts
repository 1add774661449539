/**
 * Page-cache work through mappings (native.ts's koffi helpers): a prewarm brings a range into
 * the page cache without copying it to the process, mapping at most 64 MiB at a time.
 */
import { constants as osConstants } from "node:os";
import { MAP_SHARED, nativeLibc, PROT_READ } from "./native.js";

const libc = nativeLibc();

const MADV_SEQUENTIAL = 2;
const MADV_POPULATE_READ = 22; // Linux 5.14
/** Files are mapped this much at a time: page tables for 64 MiB, never the whole file. */
const MAP_WINDOW = 64 << 20;
let populateWorks = libc !== null && process.env.WARMSTART_NO_POPULATE !== "1";

/**
 * Reads [offset, offset + len) of `fd` into the page cache without copying a byte to this
 * process: the range is mapped read-only, marked sequential (so the kernel reads ahead as for a
 * reader), and populated (madvise MADV_POPULATE_READ), which waits for the pages like a read
 * does; a file shorter than the range is an error code, never a SIGBUS. Returns the bytes
 * brought in, or undefined when this cannot be done here (no native helpers, a kernel before
 * 5.14, a range past the end): the caller reads instead. `offset` is a multiple of the page size.
 */
export function populateRange(
  fd: number,
  offset: number,
  len: number,
  stopped?: () => boolean,
): number | undefined {
  if (!libc || !populateWorks) return undefined;
  let done = 0;
  while (done < len) {
    if (stopped?.()) return done;
    const n = Math.min(MAP_WINDOW, len - done);
    const addr = libc.mmap(0, n, PROT_READ, MAP_SHARED, fd, offset + done);
    if (Number(addr) === -1) return done || undefined;
    try {
      libc.madvise(addr, n, MADV_SEQUENTIAL);
      if (libc.madvise(addr, n, MADV_POPULATE_READ) !== 0) {
        if (libc.errno() === osConstants.errno.EINVAL) populateWorks = false;
        return done || undefined;
      }
    } finally {
      libc.munmap(addr, n);
    }
    done += n;
  }
  return done;
}

/** Turns populateRange off for this thread (tests of the read fallback); returns a function that
 * puts back what was there. */
export function disablePopulate(): () => void {
  const was = populateWorks;
  populateWorks = false;
  return () => void (populateWorks = was);
}
