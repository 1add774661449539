/**
 * Which answers the API clients retry in place: a 429 for any method, a 5xx or a dropped
 * connection for reads only (never a watch), a bounded number of times.
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import * as k8s from "@kubernetes/client-node";
import { RetryingHttpLibrary } from "./kube.js";

/** An HTTP layer that answers from a script, one entry per request, and counts what it was sent. */
function scripted(answers: (number | "drop")[]): { lib: k8s.HttpLibrary; sent: () => number } {
  let n = 0;
  const lib: k8s.HttpLibrary = {
    send: () => {
      const a = answers[Math.min(n++, answers.length - 1)]!;
      if (a === "drop") return new k8s.Observable(Promise.reject(new Error("socket hang up")));
      const body = { text: () => Promise.resolve("{}"), binary: () => Promise.resolve(Buffer.alloc(0)) };
      return new k8s.Observable(Promise.resolve(new k8s.ResponseContext(a, {}, body)));
    },
  };
  return { lib, sent: () => n };
}

const request = (method: k8s.HttpMethod, url = "https://api/api/v1/pods"): k8s.RequestContext =>
  new k8s.RequestContext(url, method);

async function status(lib: k8s.HttpLibrary, req: k8s.RequestContext): Promise<number> {
  return (await lib.send(req).toPromise()).httpStatusCode;
}

void test("a read retries 5xx, 429 and dropped connections until it gets an answer", async () => {
  const s = scripted([500, 429, "drop", 200]);
  assert.equal(await status(new RetryingHttpLibrary(4, s.lib), request(k8s.HttpMethod.GET)), 200);
  assert.equal(s.sent(), 4);
});

void test("a write retries a 429 only: a 5xx may have been applied, and is the caller's to judge", async () => {
  const throttled = scripted([429, 201]);
  assert.equal(await status(new RetryingHttpLibrary(4, throttled.lib), request(k8s.HttpMethod.POST)), 201);
  const failed = scripted([500, 201]);
  assert.equal(await status(new RetryingHttpLibrary(4, failed.lib), request(k8s.HttpMethod.POST)), 500);
  assert.equal(failed.sent(), 1);
  const dropped = scripted(["drop", 201]);
  await assert.rejects(
    new RetryingHttpLibrary(4, dropped.lib).send(request(k8s.HttpMethod.PATCH)).toPromise(),
  );
  assert.equal(dropped.sent(), 1);
});

void test("attempts are bounded: the last answer is returned as it is", async () => {
  const s = scripted([503]);
  assert.equal(await status(new RetryingHttpLibrary(3, s.lib), request(k8s.HttpMethod.GET)), 503);
  assert.equal(s.sent(), 3);
});

void test("a watch is never retried here (its informer re-lists and re-watches)", async () => {
  const s = scripted([500, 200]);
  const watch = request(k8s.HttpMethod.GET, "https://api/api/v1/pods?watch=true&resourceVersion=1");
  assert.equal(await status(new RetryingHttpLibrary(4, s.lib), watch), 500);
  assert.equal(s.sent(), 1);
});
