import { describe, test } from "node:test";
import assert from "node:assert/strict";
import { redactUrlCredentials } from "./env.js";

void describe("redactUrlCredentials", () => {
  void test("user and password, or a bare token, in a URL's user info", () => {
    assert.equal(
      redactUrlCredentials("https://user:tok3n@hub.local/org/m"),
      "https://<redacted>@hub.local/org/m",
    );
    assert.equal(
      redactUrlCredentials("https://hf_tok3n@hub.local/org/m"),
      "https://<redacted>@hub.local/org/m",
    );
    assert.equal(
      redactUrlCredentials("--model=s3://AKIA:secret@bucket/m"),
      "--model=s3://<redacted>@bucket/m",
    );
  });

  void test("credential query parameters of signed URLs", () => {
    assert.equal(
      redactUrlCredentials("https://b.s3.amazonaws.com/m.bin?X-Amz-Credential=AKIA&X-Amz-Signature=abc&x=1"),
      "https://b.s3.amazonaws.com/m.bin?X-Amz-Credential=<redacted>&X-Amz-Signature=<redacted>&x=1",
    );
    assert.equal(redactUrlCredentials("https://h/m?token=abc#f"), "https://h/m?token=<redacted>#f");
  });

  void test("plain URLs, paths and model names are left as they are; redaction is idempotent", () => {
    for (const v of ["https://hub.local/org/m", "org/model@v2", "/models/a", "meta-llama/Llama-3.1-8B"])
      assert.equal(redactUrlCredentials(v), v);
    const once = redactUrlCredentials("https://u:p@h/x?sig=1");
    assert.equal(redactUrlCredentials(once), once);
  });
});
