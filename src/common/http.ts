import type { Server as HttpServer } from "node:http";
import type { Server as HttpsServer } from "node:https";
import type { AddressInfo } from "node:net";

export interface Listening {
  /** Where a client on this machine reaches the server (a wildcard address becomes loopback). */
  url: string;
  close(): Promise<void>;
}

/**
 * Listen with explicit timeouts (a slow or stuck client must not hold a socket for minutes), and
 * turn a bind failure into one clear error naming the role.
 */
export async function listen(
  server: HttpServer | HttpsServer,
  opts: { host: string; port: number; role: string; scheme?: "http" | "https" },
): Promise<Listening> {
  server.headersTimeout = 10_000;
  server.requestTimeout = 15_000;
  server.keepAliveTimeout = 5_000;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port, opts.host, () => {
      server.off("error", reject);
      resolve();
    });
  }).catch((err: unknown) => {
    throw new Error(`${opts.role} cannot listen on ${opts.host}:${opts.port}: ${(err as Error).message}`, {
      cause: err,
    });
  });
  const addr = server.address() as AddressInfo;
  const host =
    addr.address === "0.0.0.0" || addr.address === "::"
      ? "127.0.0.1"
      : addr.family === "IPv6"
        ? `[${addr.address}]`
        : addr.address;
  return {
    url: `${opts.scheme ?? "http"}://${host}:${addr.port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
