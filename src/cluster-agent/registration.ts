/**
 * The registration manager: keeps the control plane told about the GPUs this cluster has and
 * keeps valid queue credentials installed.
 *
 * Registration (on GPU arrival, on inventory change, on refresh, and to report capacity zero)
 * and credential renewal all run through one gate that spans reading the inventory, the call
 * and installing the response, so a response can never be applied over a newer one. Failures
 * are warnings: they retry with bounded exponential backoff that starts at the GPU poll interval.
 */
import type { Logger } from "../common/log.js";
import type { InventoryItem } from "../control-plane/api.js";
import { Backoff } from "../core/backoff.js";
import { Gate, isAbortError } from "../core/gate.js";
import { Alarm, type Clock } from "../common/clock.js";
import { isNewer, type InstalledCredentials } from "./credentials.js";
import { describe, sameCapacity, type GpuInventory } from "./inventory.js";

/** What the control plane hands back for a registration or a renewal. */
export interface IssuedCredentials {
  token: string;
  expiresAt: number;
  renewBeforeMs: number;
}

export interface RegistrationApi {
  register(capacity: InventoryItem[], signal: AbortSignal): Promise<IssuedCredentials>;
  /** Renew with the installed token. */
  renew(token: string, signal: AbortSignal): Promise<IssuedCredentials>;
}

export interface RegistrationState {
  ready: boolean;
  reason: string;
  /** Whether valid credentials are installed (terminations can be processed even when not ready). */
  hasCredentials: boolean;
}

export interface RegistrationEvents {
  attempt?(kind: "register" | "renew"): void;
  failure?(kind: "register" | "renew", retryInMs: number): void;
  installed?(creds: InstalledCredentials): void;
}

export interface RegistrationOptions {
  clock: Clock;
  log: Logger;
  api: RegistrationApi;
  /** The accepted GPU inventory (undefined until known); read inside the gate. */
  inventory: () => GpuInventory | undefined;
  /** Persist installed credentials (best effort: they are already in use when this runs). */
  persist: (creds: InstalledCredentials) => Promise<void>;
  /** Identifies the control plane, so credentials from another one are never reused. */
  issuer: string;
  pollIntervalMs: number;
  backoffCapMs: number;
  refreshIntervalMs: number;
  /** Overrides the control plane's renew-before. */
  renewBeforeMs?: number;
  onState: (s: RegistrationState) => void;
  events?: RegistrationEvents;
  gate?: Gate;
}

/** A control plane answer that says the credentials are no good (as opposed to "try later"). */
function isRejected(err: unknown): boolean {
  const status = (err as { status?: unknown }).status;
  return status === 401 || status === 403;
}

export class RegistrationManager {
  readonly gate: Gate;
  private creds: InstalledCredentials | undefined;
  private generation = 0;
  /** Whether the control plane may know this cluster (then capacity zero must be reported). */
  private known = false;
  private refreshDue = false;
  private lastError: string | undefined;
  private readonly registerBackoff: Backoff;
  private readonly renewBackoff: Backoff;
  private readonly retry: Alarm;
  private readonly renewal: Alarm;
  private readonly refresh: Alarm;
  private readonly expiry: Alarm;
  private readonly stopping = new AbortController();
  private readonly inflight = new Set<Promise<void>>();
  private syncWaiting = false;
  private renewWaiting = false;
  private lastState: RegistrationState | undefined;
  private started = false;

  constructor(private readonly o: RegistrationOptions) {
    this.gate = o.gate ?? new Gate();
    const backoff = { initialMs: o.pollIntervalMs, maxMs: o.backoffCapMs };
    this.registerBackoff = new Backoff(backoff);
    this.renewBackoff = new Backoff(backoff);
    this.retry = new Alarm(o.clock, () => this.kick());
    this.renewal = new Alarm(o.clock, () => this.renewSoon());
    this.refresh = new Alarm(o.clock, () => {
      this.refreshDue = true;
      this.kick();
    });
    this.expiry = new Alarm(o.clock, () => {
      this.o.log.warn("queue credentials expired");
      this.emit();
      this.kick();
    });
  }

  /** The installed token, if valid now. */
  get token(): string | undefined {
    const c = this.creds;
    return c && c.expiresAt > this.o.clock.now() ? c.token : undefined;
  }

  get installed(): InstalledCredentials | undefined {
    return this.creds;
  }

  /** Time until the next registration retry, if one is scheduled (for tests and metrics). */
  get nextRetryInMs(): number | undefined {
    const due = this.retry.due;
    return due === undefined ? undefined : due - this.o.clock.now();
  }

  get state(): RegistrationState {
    const inv = this.o.inventory();
    const hasCredentials = this.token !== undefined;
    const failing = this.lastError ? `: ${this.lastError}` : "";
    if (!inv) return { ready: false, reason: "GPU inventory not known yet", hasCredentials };
    if (inv.total === 0) return { ready: false, reason: "no GPUs in the cluster", hasCredentials };
    if (!this.creds || this.creds.capacity.every((c) => c.count === 0))
      return {
        ready: false,
        reason: this.lastError ? `registration failing${failing}` : "registering with the control plane",
        hasCredentials,
      };
    if (!hasCredentials)
      return { ready: false, reason: `queue credentials expired${failing}`, hasCredentials };
    return { ready: true, reason: `registered: ${describe(inv)}`, hasCredentials };
  }

  /**
   * Take credentials persisted by an earlier run, when they are still valid and from the same
   * control plane. Call before start().
   */
  restore(persisted: InstalledCredentials | undefined): boolean {
    if (!persisted || persisted.issuer !== this.o.issuer) return false;
    this.generation = Math.max(this.generation, persisted.generation);
    this.known = true;
    if (persisted.expiresAt <= this.o.clock.now()) return false;
    this.creds = persisted;
    return true;
  }

  start(): void {
    if (this.started) return;
    this.started = true;
    if (this.creds) {
      this.scheduleRenewal(this.creds);
      this.refresh.set(this.o.refreshIntervalMs);
    }
    this.emit();
    this.kick();
  }

  /**
   * The accepted GPU state changed: start over from the first retry wait and try now. Readiness
   * follows at once (losing the last GPU makes the agent not ready before the control plane hears).
   */
  inventoryChanged(): void {
    this.registerBackoff.reset();
    this.retry.clear();
    this.emit();
    this.kick();
  }

  /** The control plane refused the installed credentials (401/403) on some other call. */
  credentialsRejected(token: string): void {
    if (this.creds?.token !== token) return;
    this.o.log.warn("the control plane refused the queue credentials; registering again");
    this.creds = undefined;
    this.expiry.clear();
    this.renewal.clear();
    this.emit();
    this.kick();
  }

  /** Cancel waiters, clear every timer, and wait for the call in flight to end. */
  async stop(): Promise<void> {
    this.started = false;
    this.stopping.abort();
    const alarms = [this.retry, this.renewal, this.refresh, this.expiry];
    for (const a of alarms) a.clear();
    while (this.inflight.size > 0) await Promise.allSettled([...this.inflight]);
    // A pass that was finishing may have armed one again.
    for (const a of alarms) a.clear();
  }

  /** Ask for a registration pass; passes that are already waiting for the gate absorb the ask. */
  kick(): void {
    if (!this.started || this.syncWaiting) return;
    this.syncWaiting = true;
    this.track(
      this.gate.run(() => {
        this.syncWaiting = false;
        return this.sync();
      }, this.stopping.signal),
    );
  }

  private renewSoon(): void {
    if (!this.started || this.renewWaiting) return;
    this.renewWaiting = true;
    this.track(
      this.gate.run(() => {
        this.renewWaiting = false;
        return this.renew();
      }, this.stopping.signal),
    );
  }

  private track(p: Promise<void>): void {
    const t = p.catch((err: unknown) => {
      if (!isAbortError(err)) this.o.log.error({ err }, "registration task failed unexpectedly");
    });
    this.inflight.add(t);
    void t.finally(() => this.inflight.delete(t));
  }

  /** Decide from the state of the world (never from what woke us) whether to register now. */
  private needsRegistration(inv: GpuInventory): string | undefined {
    const c = this.creds;
    const now = this.o.clock.now();
    if (inv.total === 0) {
      if (!this.known) return undefined; // never registered: nothing to take back
      if (!c) return "report capacity zero";
      if (c.capacity.some((x) => x.count > 0)) return "report capacity zero";
      if (c.expiresAt <= now) return "credentials expired";
      return this.refreshDue ? "periodic refresh" : undefined;
    }
    if (!c) return "GPUs available";
    if (c.expiresAt <= now) return "credentials expired";
    if (!sameCapacity(c.capacity, inv.byType)) return "inventory changed";
    return this.refreshDue ? "periodic refresh" : undefined;
  }

  private async sync(): Promise<void> {
    const signal = this.stopping.signal;
    const inv = this.o.inventory();
    if (!inv) return;
    const why = this.needsRegistration(inv);
    if (!why) {
      this.refreshDue = false;
      return;
    }
    const capacity = inv.total === 0 ? [] : inv.byType;
    const generation = ++this.generation;
    this.o.events?.attempt?.("register");
    this.o.log.info({ why, gpus: describe(inv), generation }, "registering with the control plane");
    try {
      const issued = await this.o.api.register(capacity, signal);
      if (signal.aborted) return;
      await this.install(this.installable(issued, generation, capacity));
      this.known = true;
      this.refreshDue = false;
      this.lastError = undefined;
      this.registerBackoff.reset();
      this.retry.clear();
      this.refresh.set(this.o.refreshIntervalMs);
      this.o.log.info({ gpus: describe(inv), generation }, "registered");
    } catch (err) {
      if (signal.aborted) return;
      const delay = this.registerBackoff.next();
      this.lastError = err instanceof Error ? err.message : String(err);
      this.o.events?.failure?.("register", delay);
      // Recoverable: the agent keeps running and retries, so this is a warning, not an error.
      this.o.log.warn(
        { err, why, attempt: this.registerBackoff.failures, retryInMs: delay },
        "registration failed; will retry",
      );
      this.retry.set(delay);
    } finally {
      this.emit();
    }
  }

  private async renew(): Promise<void> {
    const signal = this.stopping.signal;
    const c = this.creds;
    if (!c) return;
    const now = this.o.clock.now();
    // A registration that ran while this waited may have installed fresh credentials already.
    if (c.expiresAt - now > this.renewBefore(c)) {
      this.scheduleRenewal(c);
      return;
    }
    if (c.expiresAt <= now) {
      this.kick();
      return;
    }
    const generation = ++this.generation;
    this.o.events?.attempt?.("renew");
    try {
      const issued = await this.o.api.renew(c.token, signal);
      if (signal.aborted) return;
      await this.install(this.installable(issued, generation, c.capacity));
      this.renewBackoff.reset();
      this.o.log.info(
        { generation, expiresAt: new Date(issued.expiresAt).toISOString() },
        "queue credentials renewed",
      );
    } catch (err) {
      if (signal.aborted) return;
      if (isRejected(err)) {
        this.credentialsRejected(c.token);
        return;
      }
      const delay = Math.min(this.renewBackoff.next(), Math.max(0, c.expiresAt - this.o.clock.now()));
      this.o.events?.failure?.("renew", delay);
      this.o.log.warn({ err, retryInMs: delay }, "credential renewal failed; will retry");
      this.renewal.set(delay);
    } finally {
      this.emit();
    }
  }

  /** Apply a response: only a newer generation replaces the installed set, and it is persisted first. */
  private async install(candidate: InstalledCredentials): Promise<void> {
    if (!isNewer(candidate, this.creds)) {
      this.o.log.warn(
        { generation: candidate.generation, installed: this.creds?.generation },
        "ignoring credentials older than the installed ones",
      );
      return;
    }
    this.creds = candidate;
    this.scheduleRenewal(candidate);
    this.o.events?.installed?.(candidate);
    try {
      await this.o.persist(candidate);
    } catch (err) {
      // The credentials are valid in memory; only a restart would have to register again.
      this.o.log.warn({ err }, "could not save the queue credentials; a restart will register again");
    }
  }

  private installable(
    issued: IssuedCredentials,
    generation: number,
    capacity: InventoryItem[],
  ): InstalledCredentials {
    return {
      ...issued,
      generation,
      capacity,
      issuer: this.o.issuer,
      lifetimeMs: Math.max(0, issued.expiresAt - this.o.clock.now()),
    };
  }

  /**
   * How long before expiry to renew: the configured or the control plane's value, at most half the
   * credentials' lifetime. A renew-before as long as the lifetime would renew as soon as new
   * credentials arrive, back to back, forever.
   */
  renewBefore(c: InstalledCredentials): number {
    const wanted = this.o.renewBeforeMs ?? c.renewBeforeMs;
    return Math.min(wanted, Math.floor(c.lifetimeMs / 2));
  }

  private scheduleRenewal(c: InstalledCredentials): void {
    const now = this.o.clock.now();
    this.renewal.set(Math.max(0, c.expiresAt - this.renewBefore(c) - now));
    this.expiry.set(Math.max(0, c.expiresAt - now));
  }

  private emit(): void {
    if (!this.started) return;
    const s = this.state;
    const l = this.lastState;
    if (l && l.ready === s.ready && l.reason === s.reason && l.hasCredentials === s.hasCredentials) return;
    this.lastState = s;
    this.o.onState(s);
  }
}
