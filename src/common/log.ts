import { createRequire } from "node:module";
import { pino, type Logger } from "pino";

export type { Logger };

const require = createRequire(import.meta.url);

/** Whether a package can be loaded from here (pino-pretty is a development dependency only). */
export function canResolve(name: string): boolean {
  try {
    require.resolve(name);
    return true;
  } catch {
    return false;
  }
}

export interface LoggerOptions {
  level?: string;
  /** Whether output goes to a terminal (default: stderr is a TTY). */
  tty?: boolean;
  /** Whether pino-pretty can be loaded (default: resolve it). */
  prettyAvailable?: () => boolean;
  /** Where JSON lines go (default: stderr). */
  destination?: pino.DestinationStream;
  env?: NodeJS.ProcessEnv;
}

/**
 * One pino logger per process: JSON lines on stderr; pretty only on a TTY and only when
 * pino-pretty is installed (the product image does not carry it). Errors go under `err`, where
 * pino's serializer keeps the type, the stack and the `cause`. Secrets are redacted by path
 * wherever they could appear.
 */
export function createLogger(name: string, levelOrOptions: string | LoggerOptions = {}): Logger {
  const o: LoggerOptions = typeof levelOrOptions === "string" ? { level: levelOrOptions } : levelOrOptions;
  const env = o.env ?? process.env;
  const tty = o.tty ?? process.stderr.isTTY === true;
  const pretty =
    tty && env.WARMSTART_LOG_FORMAT !== "json" && (o.prettyAvailable ?? (() => canResolve("pino-pretty")))();
  return pino(
    {
      name,
      level: o.level ?? env.LOG_LEVEL ?? "info",
      serializers: { err: pino.stdSerializers.err, error: pino.stdSerializers.err },
      redact: {
        paths: [
          "token",
          "*.token",
          "credentials",
          "*.credentials",
          "authorization",
          "*.authorization",
          "secret",
        ],
        censor: "[redacted]",
      },
      ...(pretty
        ? {
            transport: {
              target: "pino-pretty",
              options: { destination: 2, translateTime: "SYS:HH:MM:ss.l" },
            },
          }
        : {}),
    },
    pretty ? undefined : (o.destination ?? pino.destination(2)),
  );
}
