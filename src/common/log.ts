import { pino, type Logger } from "pino";

export type { Logger };

/**
 * One pino logger per process: JSON lines (pretty only on a TTY when pino-pretty is
 * installed), secrets redacted by path wherever they could appear.
 */
export function createLogger(name: string, level = process.env.LOG_LEVEL ?? "info"): Logger {
  const pretty = process.stderr.isTTY && process.env.WARMSTART_LOG_FORMAT !== "json";
  return pino(
    {
      name,
      level,
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
    pretty ? undefined : pino.destination(2),
  );
}
