/**
 * Runs `fn` over `items` with at most `parallel` calls in flight. The first failure stops new
 * work from starting; calls already running finish before the failure is thrown, so nothing is
 * left writing behind the caller's back (cleanup can then remove what they wrote).
 */
export async function runPool<T>(
  items: readonly T[],
  parallel: number,
  fn: (item: T, worker: number) => Promise<void>,
): Promise<void> {
  let next = 0;
  let failed = false;
  let firstError: unknown;
  const worker = async (id: number): Promise<void> => {
    while (!failed && next < items.length) {
      const item = items[next++] as T;
      try {
        await fn(item, id);
      } catch (err) {
        if (!failed) firstError = err;
        failed = true;
      }
    }
  };
  const n = Math.max(1, Math.min(parallel, items.length));
  await Promise.all(Array.from({ length: n }, (_, i) => worker(i)));
  if (failed) throw firstError;
}
