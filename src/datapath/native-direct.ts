/**
 * What a copy needs to write past the page cache and keep holes (native.ts's koffi helpers):
 * where a file's data is (SEEK_DATA, SEEK_HOLE) and buffers aligned as O_DIRECT asks.
 */
import { constants as osConstants } from "node:os";
import { nativeLibc } from "./native.js";

const libc = nativeLibc();

const SEEK_DATA = 3;
const SEEK_HOLE = 4;

/**
 * The first range [start, end) of `fd` at or after `from` (and before `size`) that holds data,
 * found with SEEK_DATA and SEEK_HOLE, or null when only holes are left. A filesystem that cannot
 * tell (or no native helpers) answers as if everything were data, which copies holes as zeros.
 */
export function nextDataRange(fd: number, from: number, size: number): [number, number] | null {
  if (from >= size) return null;
  if (!libc) return [from, size];
  const start = Number(libc.lseek(fd, from, SEEK_DATA));
  if (start < 0) return libc.errno() === osConstants.errno.ENXIO ? null : [from, size];
  if (start >= size) return null;
  const end = Number(libc.lseek(fd, start, SEEK_HOLE));
  return [start, end < 0 ? size : Math.min(end, size)];
}

/** O_DIRECT wants the buffer's address, each offset and each length to be multiples of the
 * device's logical block size; 4096 is a multiple of every one in use. */
export const DIRECT_ALIGN = 4096;

/**
 * A buffer of `size` bytes whose first byte is at a multiple of DIRECT_ALIGN in memory, as
 * O_DIRECT needs; undefined without the native helpers (koffi gives the address). It lives on
 * the JavaScript heap's terms: no mapping to unmap when its thread ends.
 */
export function alignedBuffer(size: number): Buffer | undefined {
  if (!libc) return undefined;
  const raw = Buffer.allocUnsafeSlow(size + DIRECT_ALIGN);
  const skip = (DIRECT_ALIGN - Number(libc.address(raw) % BigInt(DIRECT_ALIGN))) % DIRECT_ALIGN;
  return raw.subarray(skip, skip + size);
}
