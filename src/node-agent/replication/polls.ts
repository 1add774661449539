/**
 * What a receiver asks the filling copies it is not fetching from: their answers carry what
 * they hold (have.ts), so the ones it does fetch from need no poll.
 */
import type { Source } from "./source.js";

/** Most filling sources asked per poll: what a receiver spends on polls stays flat in the swarm's size. */
export const POLLS_PER_TICK = 4;

/**
 * Every `every` ms, asks the live filling sources not heard from for that long what they hold:
 * at most `POLLS_PER_TICK`, those heard from least recently first. Asking every one of N peers
 * twice a second costs the swarm N² requests; sources a receiver fetches from answer with what
 * they hold anyway, and the rest are asked in turn.
 */
export function pollFilling(
  sources: readonly Source[],
  path: string,
  every: number,
  failed: (s: Source, err: unknown) => void,
): NodeJS.Timeout {
  return setInterval(() => {
    const now = performance.now();
    for (const s of dueForPoll(sources, now, every)) {
      s.heardAt = now;
      s.poll(path).catch((err: unknown) => failed(s, err));
    }
  }, every);
}

/** The filling sources to ask now (see pollFilling). */
export function dueForPoll<S extends Pick<Source, "alive" | "have" | "heardAt">>(
  sources: readonly S[],
  now: number,
  every: number,
  most = POLLS_PER_TICK,
): S[] {
  return sources
    .filter((s) => s.alive && s.have !== "all" && now - s.heardAt >= every)
    .sort((a, b) => a.heardAt - b.heardAt)
    .slice(0, most);
}
