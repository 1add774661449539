/**
 * One admission server for the benchmark, in its own process so the load generator does not
 * share its CPU: `noop` answers every review with an unchanged admit on the same server stack
 * (the baseline); `webhook` runs the real decision against the cluster in $KUBECONFIG.
 */
import { pino } from "pino";
import { startAdmissionServer } from "../src/webhook/server.js";
import { runWebhook } from "../src/webhook/run.js";
import { loadWebhookConfig } from "../src/webhook/config.js";
import { createCA, issueCert } from "../src/common/certs.js";

const mode = process.argv[2];
const log = pino({ level: "warn" });
let url: string;
if (mode === "noop") {
  const ca = await createCA("bench");
  const leaf = await issueCert(ca, { commonName: "bench", ips: ["127.0.0.1"], usage: "server" });
  const srv = await startAdmissionServer({
    host: "127.0.0.1",
    port: 0,
    cert: leaf,
    maxBodyBytes: 3 * 1024 * 1024,
    handler: (review) => Promise.resolve({ uid: review.request.uid, allowed: true }),
    onHandlerError: (_err, review) => ({ uid: review.request.uid, allowed: true }),
    log,
  });
  url = srv.url;
} else {
  const cfg = loadWebhookConfig({ host: "127.0.0.1", port: 0, electionEnabled: "true" });
  url = (await runWebhook(cfg, { log })).url;
}
process.stdout.write(`${url}\n`);
