/** The server's options: flag, env, default, help and schema, read once at start. */
import { z } from "zod";
import { defineOptions, intOption } from "../common/options.js";

export const SERVER_OPTIONS = {
  host: {
    flag: "--host <host>",
    env: "WARMSTART_SERVER_HOST",
    default: "127.0.0.1",
    doc: "listen address",
    schema: z.string().min(1),
  },
  port: {
    flag: "--port <port>",
    env: "WARMSTART_SERVER_PORT",
    default: 8080,
    doc: "listen port (0 = any free port)",
    schema: intOption(0, 65535),
  },
  tokenFile: {
    flag: "--token-file <file>",
    env: "WARMSTART_SERVER_TOKEN_FILE",
    doc: "bearer token for the API and dashboard; required off loopback",
    schema: z.string().optional(),
  },
  token: {
    flag: "--token <token>",
    env: "WARMSTART_SERVER_TOKEN",
    doc: "the token itself (prefer --token-file or WARMSTART_SERVER_TOKEN)",
    schema: z.string().optional(),
  },
};

export const serverOptions = defineOptions("server", SERVER_OPTIONS);
export type ServerOptions = ReturnType<typeof serverOptions.load>;
