/**
 * Entry point of the local model hub process that `warmstart cluster up` starts:
 * `node main.js --port P --model-mib M --mib-s B [--repo ORG/NAME=DIR ...]`.
 */
import { readdir, readFile } from "node:fs/promises";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { ModelHub } from "./server.js";

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    host: { type: "string", default: "127.0.0.1" },
    "model-mib": { type: "string", default: "256" },
    "mib-s": { type: "string", default: "64" },
    repo: { type: "string", multiple: true, default: [] },
  },
});
// A real repository: the files of one folder (not recursive), read once.
const real = new Map<string, Map<string, Buffer>>();
for (const spec of values.repo) {
  const eq = spec.indexOf("=");
  if (eq < 1) throw new Error(`--repo: expected ORG/NAME=DIR, got "${spec}"`);
  const dir = spec.slice(eq + 1);
  const files = new Map<string, Buffer>();
  for (const e of await readdir(dir, { withFileTypes: true }))
    if (e.isFile()) files.set(e.name, await readFile(join(dir, e.name)));
  real.set(spec.slice(0, eq), files);
}
const MiB = 2 ** 20;
const hub = new ModelHub({
  modelBytes: Number(values["model-mib"]) * MiB,
  bytesPerSecond: Number(values["mib-s"]) * MiB,
  real,
});
const server = await hub.listen(Number(values.port), values.host);
const addr = server.address();
process.stdout.write(
  `model hub listening on http://${values.host}:${typeof addr === "object" && addr ? addr.port : values.port}\n`,
);
for (const sig of ["SIGTERM", "SIGINT"] as const)
  process.once(sig, () => server.close(() => process.exit(0)));
