/**
 * A crash at a chosen point of a process's SQLite work, for the fault tests. Loaded only with
 * `node --import` by a test that sets WARMSTART_TEST_CRASH_AT (the product never imports it), it
 * wraps better-sqlite3's Statement#run and sends the process SIGKILL:
 *
 * - `in-transaction`: right after the `nth` statement whose SQL contains `statement` ran, so the
 *   rest of its transaction and the commit never happen;
 * - `after-commit`: right after the COMMIT of the transaction that ran it, so the change is on disk
 *   but the caller is never answered.
 *
 * Before dying it writes to `marker` (JSON: the statement, its parameters, the point), so the test
 * knows which request the crash cut short. better-sqlite3 is synchronous and Node runs one
 * transaction at a time, so the point is exact whatever the concurrency of the HTTP calls.
 */
import Database from "better-sqlite3";
import { writeFileSync } from "node:fs";

export interface CrashPoint {
  statement: string;
  nth: number;
  at: "in-transaction" | "after-commit";
  marker: string;
}

export interface CrashMarker {
  statement: string;
  params: unknown[];
  at: CrashPoint["at"];
}

export const CRASH_ENV = "WARMSTART_TEST_CRASH_AT";

function install(point: CrashPoint): void {
  const probe = new Database(":memory:");
  const proto = Object.getPrototypeOf(probe.prepare("SELECT 1")) as {
    run: (this: Database.Statement, ...params: unknown[]) => Database.RunResult;
  };
  probe.close();
  const run = proto.run;
  let seen = 0;
  let pending: CrashMarker | undefined;
  const die = (m: CrashMarker): never => {
    writeFileSync(point.marker, JSON.stringify(m));
    process.kill(process.pid, "SIGKILL");
    // SIGKILL to oneself is delivered before the kill call returns to this code.
    throw new Error("unreachable");
  };
  proto.run = function (this: Database.Statement, ...params: unknown[]): Database.RunResult {
    const result = run.apply(this, params);
    if (pending && this.source === "COMMIT") die(pending);
    if (this.source.includes(point.statement) && ++seen === point.nth) {
      const m: CrashMarker = { statement: this.source, params, at: point.at };
      if (point.at === "in-transaction") die(m);
      pending = m;
    }
    return result;
  };
}

const raw = process.env[CRASH_ENV];
if (raw) install(JSON.parse(raw) as CrashPoint);
