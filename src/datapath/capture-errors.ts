/** The ways a capture ends without committing anything of its own. */
import type { Manifest } from "./manifest.js";

/** The destination already holds a committed capture; it was left untouched. */
export class AlreadyCapturedError extends Error {
  readonly code = "EALREADYCAPTURED";
  constructor(
    readonly dest: string,
    readonly manifest: Manifest | undefined,
  ) {
    super(`${dest} is already captured${manifest?.hash ? ` (hash ${manifest.hash})` : ""}; left as is`);
  }
}

/** The capture passed its deadline or was cancelled; nothing was committed. */
export class CaptureStoppedError extends Error {
  readonly code = "ECAPTURESTOPPED";
  constructor(
    readonly why: "deadline" | "aborted",
    message: string,
  ) {
    super(message);
  }
}
