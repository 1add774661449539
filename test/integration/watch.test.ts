/**
 * Informers on the real API server: a stop never leaves a watch open, whenever it lands. The
 * informer lists and opens its watch again on its own; a stop between the two used to leave
 * that watch open for good (and the process that made it alive).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type * as k8s from "@kubernetes/client-node";
import { makeInformer } from "../../src/common/watch.js";
import { kube } from "../harness.js";

void test("an informer stopped while it lists never opens its watch", async (t) => {
  const { kc, core } = await kube();
  let release!: () => void;
  const listed = new Promise<void>((r) => (release = r));
  const informer = makeInformer<k8s.V1Namespace>(kc, "/api/v1/namespaces", async () => {
    const list = await core.listNamespace();
    await listed;
    return list;
  });
  const request = (): AbortController | undefined =>
    (informer as unknown as { request?: AbortController }).request;
  // Whatever the outcome, nothing stays open after this test.
  t.after(() => request()?.abort());
  const started = informer.start();
  await informer.stop();
  release();
  await started;
  assert.ok(request(), "the informer went on to open its watch after its list");
  assert.equal(request()!.signal.aborted, true, "and that watch was closed at once");
});
