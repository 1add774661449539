/**
 * A value per key, read at most once per `ttlMs` (concurrent readers share one read). A failed
 * read keeps the last value known, if any: a blip of the API server must not change decisions.
 */
export class TtlCache<T> {
  private readonly entries = new Map<string, { at: number; value: T }>();
  private readonly loading = new Map<string, Promise<T>>();

  constructor(
    private readonly ttlMs: number,
    private readonly load: (key: string) => Promise<T>,
    private readonly onStale: (key: string, err: unknown) => void = () => {},
    private readonly now: () => number = Date.now,
  ) {}

  async get(key: string): Promise<T> {
    const hit = this.entries.get(key);
    if (hit && this.now() - hit.at < this.ttlMs) return hit.value;
    let p = this.loading.get(key);
    if (!p) {
      p = this.load(key)
        .then(
          (value) => {
            this.entries.set(key, { at: this.now(), value });
            return value;
          },
          (err: unknown) => {
            if (!hit) throw err;
            this.onStale(key, err);
            return hit.value;
          },
        )
        .finally(() => this.loading.delete(key));
      this.loading.set(key, p);
    }
    return p;
  }

  invalidate(key?: string): void {
    if (key === undefined) this.entries.clear();
    else this.entries.delete(key);
  }
}
