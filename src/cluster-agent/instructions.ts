/**
 * The control plane's instruction, carried out: `cordon` takes no new deployment requests, `drain`
 * also removes every workload this agent applied (each reported Failed), `none` is back to normal.
 * A drain runs once per instruction; if it fails, the next heartbeat's drain tries again.
 */
import type { Logger } from "../common/log.js";
import type { Instruction } from "../control-plane/api.js";
import type { RequestLock } from "./request-lock.js";
import type { StatusReporter } from "./status.js";
import type { Workloads } from "./workloads.js";

export interface InstructionOptions {
  log: Logger;
  workloads: Pick<Workloads, "listRecords" | "readRecord" | "remove" | "writeRecord">;
  status: Pick<StatusReporter, "forget" | "reportNow">;
  /** Deploy, terminate and drain of one request never interleave. */
  requestLock: RequestLock;
  /** Stop (true) or resume (false) taking deployment requests. */
  cordon: (on: boolean) => void;
}

export class InstructionHandler {
  private draining = false;

  constructor(private readonly o: InstructionOptions) {}

  async apply(i: Instruction): Promise<void> {
    this.o.cordon(i !== "none");
    if (i !== "drain") {
      this.draining = false;
      return;
    }
    if (this.draining) return;
    this.draining = true;
    try {
      const records = await this.o.workloads.listRecords();
      for (const rec of records.filter((r) => r.state === "applied")) {
        const removed = await this.o.requestLock.run(rec.requestId, async () => {
          // A termination may have removed it while this waited for the lock.
          const now = await this.o.workloads.readRecord(rec.requestId);
          if (now?.state !== "applied") return false;
          await this.o.workloads.remove(rec.requestId, rec.namespace, rec.name);
          await this.o.workloads.writeRecord({
            ...rec,
            state: "terminated",
            updatedAt: new Date().toISOString(),
          });
          return true;
        });
        if (!removed) continue;
        this.o.status.forget(rec.requestId);
        this.o.log.info(
          { requestId: rec.requestId, name: rec.name, namespace: rec.namespace },
          "drained: workload removed",
        );
        await this.o.status
          .reportNow(rec.requestId, {
            phase: "Failed",
            message: "removed: the cluster was drained",
            instances: [],
          })
          .catch((err: unknown) => this.o.log.warn({ err }, "could not report the drained request"));
      }
    } catch (err) {
      // The next drain instruction must try again.
      this.draining = false;
      throw err;
    }
  }
}
