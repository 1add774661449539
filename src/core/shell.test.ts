import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { joinShell, quoteShellWord, shellWords, splitShell } from "./shell.js";

void describe("splitShell", () => {
  void test("splits on blanks and removes quotes", () => {
    assert.deepEqual(shellWords(`vllm serve "meta-llama/Llama 3" --port  8000 'a b'`), [
      "vllm",
      "serve",
      "meta-llama/Llama 3",
      "--port",
      "8000",
      "a b",
    ]);
  });

  void test("keeps control operators apart from words", () => {
    const t = splitShell("cd /app && exec vllm serve m; echo done|tee x");
    assert.deepEqual(
      t.map((x) => (x.op ? `<${x.text}>` : x.text)),
      ["cd", "/app", "<&&>", "exec", "vllm", "serve", "m", "<;>", "echo", "done", "<|>", "tee", "x"],
    );
  });

  void test("applies backslash escapes outside and inside double quotes; single quotes are literal", () => {
    assert.deepEqual(shellWords(`a\\ b "c\\"d" 'e\\f' "g\\h"`), ["a b", 'c"d', "e\\f", "g\\h"]);
  });

  void test("line continuations join, newlines separate commands, comments are dropped", () => {
    const t = splitShell("vllm serve m \\\n  --port 1 # a comment\nnext");
    assert.deepEqual(
      t.map((x) => x.text),
      ["vllm", "serve", "m", "--port", "1", "\n", "next"],
    );
  });

  void test("keeps $(...) and ${...} as part of one word", () => {
    assert.deepEqual(shellWords(`--x=$(date +%s) "\${A:-b c}" y`), ["--x=$(date +%s)", "${A:-b c}", "y"]);
  });

  void test("fd redirections are one operator", () => {
    const t = splitShell("run 2>&1 >/dev/null");
    assert.deepEqual(
      t.map((x) => [x.text, x.op]),
      [
        ["run", false],
        ["2>&", true],
        ["1", false],
        [">", true],
        ["/dev/null", false],
      ],
    );
  });

  void test("an unterminated quote is read to the end instead of throwing", () => {
    assert.deepEqual(shellWords(`vllm serve "meta/m --port 1`), ["vllm", "serve", "meta/m --port 1"]);
    assert.deepEqual(shellWords(`a 'b`), ["a", "b"]);
  });

  void test("an empty quoted word is a word", () => {
    assert.deepEqual(shellWords(`a "" b`), ["a", "", "b"]);
  });

  void test("quoteShellWord and joinShell round-trip through splitShell", () => {
    const words = ["plain", "with space", "it's", "", "$HOME", '{"a": 1}'];
    assert.deepEqual(shellWords(words.map(quoteShellWord).join(" ")), words);
    const script = `A=1 vllm serve 'x y' && echo "z"`;
    assert.deepEqual(splitShell(joinShell(splitShell(script))), splitShell(script));
  });
});
