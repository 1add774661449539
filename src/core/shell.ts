/**
 * A small POSIX-shell word splitter. Model servers are often launched through `sh -c "..."`, so the
 * classifier and the hash must see the words a shell would see: quotes removed, escapes applied,
 * control operators kept apart. It never executes or expands anything, and it never throws: a
 * script with an unterminated quote is read to its end as if the quote were closed.
 */

export interface ShellToken {
  /** The word with quoting removed, or the operator text. */
  text: string;
  /** True for control operators and redirections (`&&`, `;`, `|`, `>`, newline, ...). */
  op: boolean;
}

// Longest first, so `&&` wins over `&` and `>>` over `>`.
const OPERATORS = ["&&", "||", ";;", "|&", ">>", "<<", ">&", "<&", "&>", ";", "&", "|", "(", ")", "<", ">"];
const BLANK = new Set([" ", "\t", "\r"]);

/** Splits a shell script into words and operators. */
export function splitShell(script: string): ShellToken[] {
  const out: ShellToken[] = [];
  let word = "";
  let inWord = false; // distinguishes an empty quoted word ("") from no word
  const s = script;
  let i = 0;

  const endWord = (): void => {
    if (inWord) out.push({ text: word, op: false });
    word = "";
    inWord = false;
  };

  while (i < s.length) {
    const c = s[i] as string;

    if (BLANK.has(c)) {
      endWord();
      i++;
      continue;
    }
    if (c === "\n") {
      endWord();
      out.push({ text: "\n", op: true });
      i++;
      continue;
    }
    if (c === "#" && !inWord) {
      while (i < s.length && s[i] !== "\n") i++;
      continue;
    }
    if (c === "\\") {
      const next = s[i + 1];
      if (next === undefined) {
        word += c;
        inWord = true;
        i++;
      } else if (next === "\n") {
        i += 2; // line continuation
      } else {
        word += next;
        inWord = true;
        i += 2;
      }
      continue;
    }
    if (c === "'") {
      const close = s.indexOf("'", i + 1);
      const end = close === -1 ? s.length : close;
      word += s.slice(i + 1, end);
      inWord = true;
      i = end + 1;
      continue;
    }
    if (c === '"') {
      i++;
      inWord = true;
      while (i < s.length && s[i] !== '"') {
        const d = s[i] as string;
        if (d === "\\" && i + 1 < s.length) {
          const e = s[i + 1] as string;
          if (e === "\n") i += 2;
          else if ('$`"\\'.includes(e)) {
            word += e;
            i += 2;
          } else {
            word += d;
            i++;
          }
        } else if (d === "$" && (s[i + 1] === "(" || s[i + 1] === "{")) {
          const end = skipExpansion(s, i);
          word += s.slice(i, end);
          i = end;
        } else {
          word += d;
          i++;
        }
      }
      i++; // the closing quote (or past the end)
      continue;
    }
    if (c === "$" && (s[i + 1] === "(" || s[i + 1] === "{")) {
      const end = skipExpansion(s, i);
      word += s.slice(i, end);
      inWord = true;
      i = end;
      continue;
    }
    if (c === "`") {
      const close = s.indexOf("`", i + 1);
      const end = close === -1 ? s.length : close + 1;
      word += s.slice(i, end);
      inWord = true;
      i = end;
      continue;
    }
    const op = OPERATORS.find((o) => s.startsWith(o, i));
    if (op) {
      // `2>&1`, `1>file`: a bare fd number belongs to the redirection, not to the words.
      if (inWord && /^\d+$/.test(word) && (op.startsWith(">") || op.startsWith("<"))) {
        out.push({ text: word + op, op: true });
        word = "";
        inWord = false;
      } else {
        endWord();
        out.push({ text: op, op: true });
      }
      i += op.length;
      continue;
    }
    word += c;
    inWord = true;
    i++;
  }
  endWord();
  return out;
}

/** Index just past a `$(...)` or `${...}` starting at `start`, honouring nesting and quotes. */
function skipExpansion(s: string, start: number): number {
  const open = s[start + 1] as string;
  const close = open === "(" ? ")" : "}";
  let depth = 0;
  let i = start + 1;
  while (i < s.length) {
    const c = s[i] as string;
    if (c === "\\") {
      i += 2;
      continue;
    }
    if (c === "'") {
      const q = s.indexOf("'", i + 1);
      i = q === -1 ? s.length : q + 1;
      continue;
    }
    if (c === open) depth++;
    else if (c === close) {
      depth--;
      if (depth === 0) return i + 1;
    }
    i++;
  }
  return s.length;
}

/** The words of a script, operators dropped. */
export function shellWords(script: string): string[] {
  return splitShell(script)
    .filter((t) => !t.op)
    .map((t) => t.text);
}

/** True when a string would be read by a shell as more than one plain word. */
export function looksLikeShell(s: string): boolean {
  return /\s/.test(s);
}

/** True for the option that hands a shell its script (`-c`, `-lc`, `-ec`, ...). */
export function isScriptOption(word: string | undefined): boolean {
  return word !== undefined && /^-[a-zA-Z]*c[a-zA-Z]*$/.test(word);
}

/** Quotes a word so that splitShell reads it back as the same single word. */
export function quoteShellWord(w: string): string {
  if (w !== "" && /^[A-Za-z0-9_\-+=/.,:@%^]+$/.test(w)) return w;
  return `'${w.replace(/'/g, `'\\''`)}'`;
}

/** Joins tokens back into one canonical script: words quoted, operators as they are. */
export function joinShell(tokens: readonly ShellToken[]): string {
  return tokens.map((t) => (t.op ? t.text : quoteShellWord(t.text))).join(" ");
}
