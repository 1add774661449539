/**
 * One graceful shutdown for every role: the first SIGTERM or SIGINT runs the role's close
 * functions in order within a deadline and exits 0 (1 when one failed or the deadline passed); a
 * second signal exits at once.
 */
import type { Logger } from "./log.js";

export interface Closer {
  /** What is closed, for the log. */
  name: string;
  close: () => unknown;
}

export interface ShutdownOptions {
  log: Logger;
  /** Run in this order. */
  closers: readonly Closer[];
  /** The whole shutdown's budget before exiting 1 anyway (default 25 s, within Kubernetes' 30 s grace). */
  deadlineMs?: number;
  signals?: readonly NodeJS.Signals[];
  /** For tests: the process to listen on and the exit to call. */
  process?: Pick<NodeJS.EventEmitter, "on" | "off">;
  exit?: (code: number) => void;
}

export interface Shutdown {
  /** Starts the shutdown as a signal would (a role that cannot go on calls it); resolves to the exit code. */
  begin: (reason: string, code?: number) => Promise<number>;
  /** Stops listening for signals (tests). */
  dispose: () => void;
}

/** Runs the closers in order; resolves to 0, or 1 when one threw or the deadline passed. */
export async function runClosers(
  closers: readonly Closer[],
  log: Logger,
  deadlineMs: number,
): Promise<number> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<number>((resolve) => {
    timer = setTimeout(() => {
      log.error({ deadlineMs }, "shutdown deadline passed; exiting");
      resolve(1);
    }, deadlineMs);
  });
  const all = (async (): Promise<number> => {
    let code = 0;
    for (const c of closers) {
      try {
        await c.close();
        log.debug({ closed: c.name }, "closed");
      } catch (err) {
        log.error({ err, closing: c.name }, "close failed");
        code = 1;
      }
    }
    return code;
  })();
  try {
    return await Promise.race([all, deadline]);
  } finally {
    clearTimeout(timer);
  }
}

/** Listens for the signals; on the first, closes everything and exits; on a second, exits at once. */
export function onShutdown(opts: ShutdownOptions): Shutdown {
  const proc = opts.process ?? process;
  const exit = opts.exit ?? ((code: number): void => process.exit(code));
  const signals = opts.signals ?? ["SIGTERM", "SIGINT"];
  const deadlineMs = opts.deadlineMs ?? 25_000;
  let running: Promise<number> | undefined;
  const begin = (reason: string, code = 0): Promise<number> => {
    if (running) return running;
    opts.log.info({ reason }, "shutting down");
    running = runClosers(opts.closers, opts.log, deadlineMs).then((closed) => {
      const exitCode = Math.max(code, closed);
      opts.log.info({ code: exitCode }, "stopped");
      exit(exitCode);
      return exitCode;
    });
    return running;
  };
  const onSignal = (signal: NodeJS.Signals): void => {
    if (running) {
      opts.log.warn({ signal }, "second signal; exiting now");
      exit(1);
      return;
    }
    void begin(signal);
  };
  for (const s of signals) proc.on(s, onSignal);
  return {
    begin,
    dispose: () => {
      for (const s of signals) proc.off(s, onSignal);
    },
  };
}
