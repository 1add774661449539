/**
 * Entry point of the local model hub process that `warmstart cluster up` starts:
 * `node main.js --port P --model-mib M --mib-s B`.
 */
import { parseArgs } from "node:util";
import { ModelHub } from "./server.js";

const { values } = parseArgs({
  options: {
    port: { type: "string", default: "0" },
    host: { type: "string", default: "127.0.0.1" },
    "model-mib": { type: "string", default: "256" },
    "mib-s": { type: "string", default: "64" },
  },
});
const MiB = 2 ** 20;
const hub = new ModelHub({
  modelBytes: Number(values["model-mib"]) * MiB,
  bytesPerSecond: Number(values["mib-s"]) * MiB,
});
const server = await hub.listen(Number(values.port), values.host);
const addr = server.address();
process.stdout.write(
  `model hub listening on http://${values.host}:${typeof addr === "object" && addr ? addr.port : values.port}\n`,
);
for (const sig of ["SIGTERM", "SIGINT"] as const)
  process.once(sig, () => server.close(() => process.exit(0)));
