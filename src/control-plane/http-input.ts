/**
 * Reading a call's input: the body, capped in size and checked to be JSON, and any input checked
 * against its zod schema, so bad input is a 4xx with every problem named, never a crash.
 */
import type { IncomingMessage } from "node:http";
import type { z } from "zod";
import { ApiError } from "./errors.js";

/** Reads the body up to the cap; past it, drains (so the caller reads the answer) and refuses. */
function readBody(req: IncomingMessage, maxBodyBytes: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let tooLarge = false;
    const declared = Number(req.headers["content-length"] ?? 0);
    if (declared > maxBodyBytes * 16) {
      reject(new ApiError(413, `request body of ${declared} bytes is over the ${maxBodyBytes}-byte limit`));
      return;
    }
    const over = (): ApiError => new ApiError(413, `request body is over the ${maxBodyBytes}-byte limit`);
    req.on("data", (chunk: Buffer) => {
      size += chunk.length;
      if (size > maxBodyBytes) tooLarge = true;
      else chunks.push(chunk);
      // Far past the cap without a declared length: stop reading and hang up.
      if (size > maxBodyBytes * 16) {
        reject(over());
        req.destroy();
      }
    });
    req.on("end", () => (tooLarge ? reject(over()) : resolve(Buffer.concat(chunks))));
    req.on("close", () => {
      if (!req.complete) reject(new ApiError(400, "request body was cut short"));
    });
    req.on("error", reject);
  });
}

export function validate<T>(schema: z.ZodType<T>, value: unknown, what: string): T {
  const r = schema.safeParse(value);
  if (r.success) return r.data;
  const issues = r.error.issues.map((i) => ({ path: i.path.map(String).join("."), message: i.message }));
  const summary = issues.map((i) => (i.path ? `${i.path}: ${i.message}` : i.message)).join("; ");
  throw new ApiError(400, `invalid ${what}: ${summary}`, issues);
}

export async function parseJsonBody(
  req: IncomingMessage,
  schema: z.ZodType,
  maxBodyBytes: number,
): Promise<unknown> {
  const raw = await readBody(req, maxBodyBytes);
  const type = (req.headers["content-type"] ?? "").split(";")[0]?.trim().toLowerCase() ?? "";
  if (raw.length > 0 && type !== "" && type !== "application/json" && !type.endsWith("+json")) {
    throw new ApiError(415, `request body must be application/json, not ${type}`);
  }
  let value: unknown = {};
  if (raw.length > 0) {
    try {
      value = JSON.parse(raw.toString("utf8"));
    } catch (err) {
      throw new ApiError(400, `request body is not valid JSON: ${(err as Error).message}`);
    }
  }
  return validate(schema, value, "request body");
}
