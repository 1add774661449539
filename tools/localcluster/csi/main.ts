/**
 * Entry point of the CSI driver stand-in process that `warmstart cluster up` starts:
 * `node main.js --socket S --data D --node-id N --proto-dir P [--registration-dir R]`.
 */
import { parseArgs } from "node:util";
import { FolderDriver } from "./driver.js";

const { values } = parseArgs({
  options: {
    socket: { type: "string" },
    data: { type: "string" },
    "node-id": { type: "string" },
    "proto-dir": { type: "string" },
    "registration-dir": { type: "string" },
  },
});
for (const k of ["socket", "data", "node-id", "proto-dir"] as const)
  if (!values[k]) throw new Error(`--${k} is required`);
const driver = new FolderDriver({
  socket: values.socket!,
  dataDir: values.data!,
  nodeId: values["node-id"]!,
  protoDir: values["proto-dir"]!,
  ...(values["registration-dir"] ? { registrationDir: values["registration-dir"] } : {}),
  log: (line) => process.stdout.write(`${new Date().toISOString()} ${line}\n`),
});
await driver.start();
process.stdout.write(`CSI driver listening on ${values.socket}\n`);
for (const sig of ["SIGTERM", "SIGINT"] as const)
  process.once(sig, () => {
    driver.stop().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  });
