import assert from "node:assert/strict";
import { test } from "node:test";
import { byteSize, durationMs, durationSeconds, kubeQuantity, parseBytes, parseDurationMs } from "./units.js";

void test("durations: each unit, compounds, fractions and bare seconds, in milliseconds", () => {
  assert.equal(parseDurationMs("250ms"), 250);
  assert.equal(parseDurationMs("30s"), 30_000);
  assert.equal(parseDurationMs("2m"), 120_000);
  assert.equal(parseDurationMs("1h"), 3_600_000);
  assert.equal(parseDurationMs("1m30s"), 90_000);
  assert.equal(parseDurationMs("1.5s"), 1500);
  assert.equal(parseDurationMs(" 60 "), 60_000);
  assert.equal(parseDurationMs("0"), 0);
  assert.equal(parseDurationMs(2), 2000);
  assert.equal(parseDurationMs(0.25), 250);
});

void test("durations: every malformed form is an error that says what was given", () => {
  for (const bad of ["3x", "-1s", "", "  ", "s", "1d", "1.s", "30 s", "1m 30s"])
    assert.throws(() => parseDurationMs(bad), /not a duration/, bad);
  assert.throws(() => parseDurationMs(-1), /not a duration: -1/);
  assert.throws(() => parseDurationMs(Number.NaN), /not a duration/);
  assert.throws(() => parseDurationMs("3x"), /"3x"/);
});

void test("byte sizes: binary and decimal suffixes, fractions, bare bytes, an optional B", () => {
  assert.equal(parseBytes("0"), 0);
  assert.equal(parseBytes("512"), 512);
  assert.equal(parseBytes("1k"), 1e3);
  assert.equal(parseBytes("5M"), 5e6);
  assert.equal(parseBytes("500G"), 500e9);
  assert.equal(parseBytes("2T"), 2e12);
  assert.equal(parseBytes("1P"), 1e15);
  assert.equal(parseBytes("1E"), 1e18);
  assert.equal(parseBytes("1Ki"), 1024);
  assert.equal(parseBytes("5Mi"), 5 * 2 ** 20);
  assert.equal(parseBytes("1.5Gi"), 1.5 * 2 ** 30);
  assert.equal(parseBytes("1Ti"), 2 ** 40);
  assert.equal(parseBytes("1Pi"), 2 ** 50);
  assert.equal(parseBytes("1Ei"), 2 ** 60);
  assert.equal(parseBytes("500 GiB"), 500 * 2 ** 30);
  assert.equal(parseBytes(".5Ki"), 512);
  assert.equal(parseBytes(4096), 4096);
});

void test("byte sizes: every malformed form is an error that says what was given", () => {
  for (const bad of ["lots", "", "-1Gi", "1gi", "1GB0", "Gi", "1e3", "1Zi"])
    assert.throws(() => parseBytes(bad), /not a size/, bad);
  assert.throws(() => parseBytes(-5), /not a size: -5/);
  assert.throws(() => parseBytes("lots"), /"lots"/);
});

void test("the zod schemas report the parser's message as an issue", () => {
  assert.equal(durationMs.parse("2m"), 120_000);
  assert.equal(durationSeconds.parse("90s"), 90);
  assert.equal(durationSeconds.parse("1500ms"), 1.5);
  assert.equal(durationSeconds.parse(3600), 3600);
  assert.equal(byteSize.parse("1Gi"), 2 ** 30);
  const r = durationMs.safeParse("3x");
  assert.equal(r.success, false);
  assert.match(r.error?.issues[0]?.message ?? "", /not a duration: "3x"/);
  assert.equal(kubeQuantity.parse(" 200Gi "), "200Gi");
  assert.equal(kubeQuantity.safeParse("200GiB").success, false, "a pod's sizeLimit takes no B");
  assert.equal(kubeQuantity.safeParse("0").success, false, "a size limit is above zero");
});
