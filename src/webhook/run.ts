import { readFile, writeFile, mkdir } from "node:fs/promises";
import { join } from "node:path";
import * as k8s from "@kubernetes/client-node";
import { createLogger, type Logger } from "../common/log.js";
import { loadKubeConfig, makeApiClient } from "../common/kube.js";
import { createCA, issueCert } from "../common/certs.js";
import type { WebhookConfig } from "./config.js";
import { createWebhookMetrics } from "./metrics.js";
import { startAdmissionServer, type RunningServer } from "./server.js";
import { PodEventRecorder } from "./events.js";
import { recordElection, releaseLease, tryAcquire } from "./election.js";
import { getModelCache } from "../common/modelcache.js";
import type { AdmissionDeps, ClusterView } from "./admission.js";
import { admissionHandler, failOpen } from "./handler.js";
import { recordsHandler } from "./records-review.js";
import {
  recordsWebhookConfiguration,
  registerRecordsWebhook,
  registerWebhook,
  webhookConfiguration,
} from "./registration.js";
import { retry } from "../promote/promote.js";
import { promotion } from "../promote/webhook.js";
import { CacheEnvConfig, DraLookups, draApi, namespaceLabels } from "./lookups.js";

export interface RunningWebhook extends RunningServer {
  caBundle: string;
  stop(): Promise<void>;
}

/** A serving certificate for development: a throwaway CA and a cert for loopback and the Service name. */
async function devCertificate(cfg: WebhookConfig): Promise<{ cert: string; key: string; ca: string }> {
  const ca = await createCA("warmstart-webhook-ca");
  const leaf = await issueCert(ca, {
    commonName: "warmstart-webhook",
    dns: [
      "localhost",
      `warmstart-webhook.${cfg.systemNamespace}.svc`,
      `warmstart-webhook.${cfg.systemNamespace}.svc.cluster.local`,
    ],
    ips: ["127.0.0.1"],
    usage: "server",
  });
  return { cert: leaf.cert, key: leaf.key, ca: ca.cert };
}

export async function runWebhook(
  cfg: WebhookConfig,
  opts: { kubeConfig?: k8s.KubeConfig; log?: Logger; certOut?: string } = {},
): Promise<RunningWebhook> {
  const log = opts.log ?? createLogger("webhook");
  const kc = opts.kubeConfig ?? loadKubeConfig();
  const core = makeApiClient(kc, k8s.CoreV1Api);
  const coordination = makeApiClient(kc, k8s.CoordinationV1Api);
  const custom = makeApiClient(kc, k8s.CustomObjectsApi);
  const metrics = createWebhookMetrics();
  const events = new PodEventRecorder(core, log, cfg.maxPendingEvents, (result) =>
    metrics.events.inc({ result }),
  );

  const ttlMs = cfg.lookupTtlSeconds * 1000;
  const namespaces = namespaceLabels(core, log, ttlMs);
  const cacheEnv = new CacheEnvConfig(core, cfg.systemNamespace, log, ttlMs, (invalid) =>
    metrics.configInvalid.set({ config: "cache-env" }, invalid ? 1 : 0),
  );
  const dra = new DraLookups(
    draApi(makeApiClient(kc, k8s.ResourceV1Api), makeApiClient(kc, k8s.ResourceV1beta1Api)),
    log,
    ttlMs,
  );
  const cluster: ClusterView = {
    namespaceLabels: (ns) => namespaces.get(ns),
    claimGpuClasses: (ns, refs) => dra.gpuClasses(ns, refs),
    cacheEnvTemplate: () => cacheEnv.template(),
    getModelCache: (h) => getModelCache(custom, h),
    tryAcquire: (hash, electionId, podNamespace, group) =>
      tryAcquire(coordination, {
        namespace: cfg.systemNamespace,
        hash,
        electionId,
        deadlineSeconds: cfg.electionDeadline,
        podNamespace,
        ...(group ? { group } : {}),
      }),
    recordElection: (o) => recordElection(custom, o),
    releaseLease: (hash, uid) => releaseLease(coordination, cfg.systemNamespace, hash, uid),
    restoreProfile: (cache) => promotion(kc, cfg.systemNamespace, log).restoreProfile(cache),
    followerProfile: () =>
      promotion(kc, cfg.systemNamespace, log).storeProfile(cfg.storeProvisioner, cfg.storeVolumeType),
    ensureClaim: (cache, namespace) =>
      promotion(kc, cfg.systemNamespace, log)
        .ensureClaim(cache, namespace)
        .then(() => undefined),
  };
  const deps: AdmissionDeps = { cfg, cluster, log, metrics, recordEvent: (ev) => events.record(ev) };

  let cert: { certFile: string; keyFile: string } | { cert: string; key: string };
  let caBundle: string;
  if (cfg.certFile && cfg.keyFile) {
    cert = { certFile: cfg.certFile, keyFile: cfg.keyFile };
    caBundle = await readFile(cfg.caFile ?? cfg.certFile, "utf8");
  } else {
    const dev = await devCertificate(cfg);
    cert = { cert: dev.cert, key: dev.key };
    caBundle = dev.ca;
    if (opts.certOut) {
      await mkdir(opts.certOut, { recursive: true });
      await writeFile(join(opts.certOut, "ca.crt"), dev.ca);
    }
    log.info("serving with a generated development certificate");
  }

  if (!cfg.clientCaFile)
    log.warn("no --client-ca-file: the webhook answers any caller that reaches it, not only the API server");
  const server = await startAdmissionServer({
    host: cfg.host,
    port: cfg.port,
    cert,
    ...(cfg.clientCaFile
      ? {
          clientAuth: {
            caFile: cfg.clientCaFile,
            names: cfg.clientNames,
            onRefused: (why) => metrics.unauthenticated.inc({ why }),
          },
        }
      : {}),
    maxBodyBytes: cfg.maxBodyBytes,
    handler: admissionHandler(deps),
    recordsHandler: recordsHandler({ core, coordination, systemNamespace: cfg.systemNamespace }, log),
    onHandlerError: (err, review) => failOpen(deps, err, review),
    registry: metrics.registry,
    log,
  });
  log.info({ url: server.url, election: cfg.electionEnabled }, "webhook serving");

  // Registration is retried in the background: a blip of the API server at start must not end
  // the process (until it is registered, the API server admits pods unchanged anyway).
  const stopRegistering = new AbortController();
  if (cfg.registerUrl) {
    const admission = kc.makeApiClient(k8s.AdmissionregistrationV1Api);
    const config = webhookConfiguration({
      name: cfg.configurationName,
      url: cfg.registerUrl,
      caBundle,
      timeoutSeconds: cfg.timeoutSeconds,
    });
    const records = recordsWebhookConfiguration({
      name: `${cfg.configurationName}-records`,
      url: cfg.registerUrl,
      caBundle,
      timeoutSeconds: cfg.timeoutSeconds,
      nodeAgentUser: cfg.nodeAgentAccount,
    });
    const register = async (): Promise<void> => {
      await registerWebhook(admission, config);
      await registerRecordsWebhook(admission, records);
    };
    void retry(register, {
      attempts: Number.POSITIVE_INFINITY,
      initialMs: 250,
      maxMs: 30_000,
      signal: stopRegistering.signal,
      onRetry: (attempt, err, delayMs) =>
        log.warn({ err, attempt, delayMs }, "registering the webhook failed; retrying"),
    }).then(
      () =>
        log.info(
          { name: cfg.configurationName, url: cfg.registerUrl },
          "registered MutatingWebhookConfiguration",
        ),
      (err: unknown) => {
        if (!stopRegistering.signal.aborted) log.error({ err }, "registering the webhook failed");
      },
    );
  }

  return {
    ...server,
    caBundle,
    stop: async () => {
      stopRegistering.abort();
      await server.close();
      await events.stop();
    },
  };
}
