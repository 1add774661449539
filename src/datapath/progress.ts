/**
 * A one-line progress display for long copies and reads: files and bytes done and the rate,
 * redrawn in place a few times a second on a TTY, and nothing at all when not a TTY (logs and
 * init containers stay clean).
 */
export interface ProgressSink {
  isTTY?: boolean;
  write(s: string): boolean;
}

export class Progress {
  private readonly start = performance.now();
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;

  constructor(
    private readonly label: string,
    private readonly totalFiles: number,
    private readonly totalBytes: number,
    /** The counts so far (kept by whoever does the work, worker threads included). */
    private readonly sample: () => { files: number; bytes: number },
    /** Where to draw; null: nowhere. */
    private readonly out: ProgressSink | null,
    intervalMs = 250,
  ) {
    if (this.out?.isTTY) {
      this.timer = setInterval(() => this.draw(), intervalMs);
      this.timer.unref();
    }
  }

  /** Final line (on a TTY, however short the work was); safe to call more than once. */
  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    if (this.out?.isTTY && !this.stopped) {
      this.draw();
      this.out.write("\n");
    }
    this.stopped = true;
  }

  private draw(): void {
    const { files, bytes } = this.sample();
    const secs = (performance.now() - this.start) / 1000;
    const rate = secs > 0 ? bytes / 1e6 / secs : 0;
    const line =
      `${this.label}: ${files}/${this.totalFiles} files, ` +
      `${formatBytes(bytes)}/${formatBytes(this.totalBytes)}, ${rate.toFixed(0)} MB/s`;
    this.out?.write(`\r${line}\x1b[K`);
  }
}

export function formatBytes(n: number): string {
  if (n >= 1e9) return `${(n / 1e9).toFixed(2)} GB`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} MB`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)} kB`;
  return `${n} B`;
}
