/** A container's argv as the words a shell would see: the one reading both the classifier and the location plan use. */
import type { V1Container } from "@kubernetes/client-node";
import { listOf, textOf } from "./env.js";
import { isScriptOption, looksLikeShell, splitShell } from "./shell.js";

/** A word of the container's argv, after splitting any shell strings in it. */
export interface ArgvToken {
  text: string;
  op: boolean;
  /** Read out of a shell string, so `$VAR` there is the shell's. */
  shell: boolean;
}

/**
 * The container's command and args as one token stream. Items with whitespace (`"--model X"`, the
 * script of `sh -c`) are split as a shell would, recursively for scripts nested in scripts.
 */
export function argvTokens(container: V1Container): ArgvToken[] {
  const out: ArgvToken[] = [];
  const split = (text: string, depth: number): void => {
    let prev: string | undefined;
    for (const t of splitShell(text)) {
      if (t.op) out.push({ text: t.text, op: true, shell: true });
      // Only the script handed to a nested shell is split again; other quoted words are values.
      else if (takesScript(prev) && looksLikeShell(t.text) && depth < 3) split(t.text, depth + 1);
      else out.push({ text: t.text, op: false, shell: true });
      prev = t.op ? undefined : t.text;
    }
  };
  for (const item of [...listOf(container.command), ...listOf(container.args)]) {
    const text = textOf(item);
    if (looksLikeShell(text)) split(text, 0);
    else out.push({ text, op: false, shell: false });
  }
  return out;
}

/** The word before a script: a shell's `-c` option, or `eval` (KServe's `eval "exec vllm serve ..."`). */
export function takesScript(prev: string | undefined): boolean {
  return prev === "eval" || isScriptOption(prev);
}

/** The value of a flag (`--flag V` or `--flag=V`, dashes and underscores alike) among the tokens, the last one winning. */
export function flagValue(tokens: readonly ArgvToken[], flags: ReadonlySet<string>): ArgvToken | undefined {
  let found: ArgvToken | undefined;
  tokens.forEach((t, i) => {
    if (t.op) return;
    const eq = t.text.indexOf("=");
    const name = (eq === -1 ? t.text : t.text.slice(0, eq)).replace(/_/g, "-");
    if (!flags.has(name)) return;
    if (eq !== -1) found = { ...t, text: t.text.slice(eq + 1) };
    else {
      const next = tokens[i + 1];
      if (next && !next.op && next.text && !next.text.startsWith("-")) found = next;
    }
  });
  return found;
}
