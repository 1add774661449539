/**
 * The node agent's `store.warmstart.dev` driver, from its configuration and parts: on with
 * `--csi-plugin-dir`, registered in `<kubelet root>/plugins_registry` (or
 * `--csi-registration-dir`), and filling the store from peers before a publish when the node
 * lacks the tree (fill.ts).
 */
import { join } from "node:path";
import type { AgentParts } from "../parts.js";
import { StoreDriver } from "./driver.js";
import { shortHash } from "../../core/contract.js";
import { fetchTree, reportTampered, type FillDeps } from "./fill.js";

/** The driver the agent serves, or undefined when `--csi-plugin-dir` is not given. */
export function storeDriverFor(p: AgentParts, o: FillDeps): StoreDriver | undefined {
  const { cfg } = p;
  if (!cfg.csiPluginDir) return undefined;
  return new StoreDriver({
    socket: join(cfg.csiPluginDir, "csi.sock"),
    registrationDir: cfg.csiRegistrationDir ?? join(cfg.kubeletRoot, "plugins_registry"),
    nodeId: cfg.node,
    store: p.store,
    ensureTree: (hash, signal) => fetchTree(p, hash, signal, o),
    expectedDigest: (hash) => p.record(shortHash(hash))?.status?.manifestDigest,
    tampered: (hash, message) => {
      p.metrics.replication.tampered.inc({ reason: "stored" });
      p.log.error({ hash: shortHash(hash) }, `tampered tree: ${message}`);
      reportTampered(p, shortHash(hash), message);
    },
    log: p.log.child({ component: "csi" }),
  });
}
