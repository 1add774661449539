/**
 * One lock per request id: a deployment and a termination of the same request never interleave
 * (the deploy and termination loops run side by side). Without it, a termination that runs
 * between a deploy's record and its apply finds nothing to remove, and the apply then brings back
 * a workload the user cancelled. Requests with different ids never wait on each other.
 */
import { Gate } from "../core/gate.js";

export class RequestLock {
  private readonly gates = new Map<string, { gate: Gate; users: number }>();

  /** `onWait` is told when an operation queues behind another on the same request (for tests). */
  constructor(private readonly onWait?: (requestId: string) => void) {}

  /** Ids with an operation running or waiting. */
  get active(): number {
    return this.gates.size;
  }

  async run<T>(requestId: string, fn: () => Promise<T>): Promise<T> {
    let entry = this.gates.get(requestId);
    if (!entry) {
      entry = { gate: new Gate(), users: 0 };
      this.gates.set(requestId, entry);
    }
    entry.users++;
    if (entry.gate.locked) this.onWait?.(requestId);
    try {
      return await entry.gate.run(fn);
    } finally {
      if (--entry.users === 0) this.gates.delete(requestId);
    }
  }
}
