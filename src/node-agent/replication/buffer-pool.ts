/**
 * Buffers for chunk bodies, kept for the next request rather than left to the garbage
 * collector. V8 counts memory allocated outside its heap since its last full collection against
 * the heap's own budget: with a fresh buffer per chunk sent and received, a replicating node
 * ran a full mark-compact about once a second, a fifth of its CPU, with a heap of 10 MB.
 */

/** Buffers come in powers of two from this size up. */
const MIN_BYTES = 4096;

export class BufferPool {
  private readonly free = new Map<number, Buffer[]>();
  private keptBytes = 0;
  private lastUse = 0;
  private drainTimer?: NodeJS.Timeout;

  /**
   * Keeps at most `maxBytes` of free buffers (more are left to the collector), and none once
   * nothing has taken or handed back a buffer for `idleMs`: a node agent does not hold a
   * replication's buffers for good after it.
   */
  constructor(
    private readonly maxBytes: number,
    private readonly idleMs = 30_000,
  ) {}

  /** A buffer of at least `size` bytes: its length is `size` rounded up to a power of two. */
  take(size: number): Buffer {
    this.lastUse = performance.now();
    const bytes = classOf(size);
    const b = this.free.get(bytes)?.pop();
    if (!b) return Buffer.allocUnsafe(bytes);
    this.keptBytes -= bytes;
    return b;
  }

  /** Hands back a buffer of `take` that nothing reads or writes any more. */
  give(b: Buffer): void {
    this.lastUse = performance.now();
    if (b.length !== classOf(b.length) || this.keptBytes + b.length > this.maxBytes) return;
    let list = this.free.get(b.length);
    if (!list) this.free.set(b.length, (list = []));
    list.push(b);
    this.keptBytes += b.length;
    this.drainTimer ??= setTimeout(() => this.drainIfIdle(), this.idleMs).unref();
  }

  /** Bytes held by free buffers. */
  get kept(): number {
    return this.keptBytes;
  }

  private drainIfIdle(): void {
    const idle = performance.now() - this.lastUse;
    this.drainTimer = undefined;
    if (idle < this.idleMs) {
      this.drainTimer = setTimeout(() => this.drainIfIdle(), this.idleMs - idle).unref();
      return;
    }
    this.free.clear();
    this.keptBytes = 0;
  }
}

function classOf(size: number): number {
  let bytes = MIN_BYTES;
  while (bytes < size) bytes *= 2;
  return bytes;
}

/** The peer server's and the receiver's buffers, shared by every tree this process moves. */
export const chunkBuffers = new BufferPool(32 << 20);
