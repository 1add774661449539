/**
 * The dashboard in a real headless Chromium: loaded from `warmstart server`, it shows a run's
 * election while the leader downloads, then (without a reload) its Ready cache, its pods and what
 * was saved; its strict Content-Security-Policy lets its own script run and nothing else. The
 * screenshot it leaves is the README's (docs/dashboard.png). A second test serves the page with a
 * token: it asks for one, and shows nothing until it has the right one.
 */
import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { pino } from "pino";
import { Registry } from "prom-client";
import * as k8s from "@kubernetes/client-node";
import type { Page } from "playwright-core";
import { isPodReady, kube, listPods, localCluster, tempNamespace, uniqueName, waitFor } from "../harness.js";
import { ensureChromium, openBrowser } from "../browser.js";
import { apiServer } from "../../src/server/run.js";
import { buildSnapshot } from "../../src/server/dashboard/views.js";
import { listen } from "../../src/common/http.js";
import type { ModelCacheObject } from "../../src/common/modelcache.js";
import { CACHE_VOLUME, LABEL_HASH, MODELCACHE } from "../../src/core/contract.js";
import { emptyDirPath } from "../../src/node-agent/store.js";
import { PACKAGE_ROOT } from "../../tools/localcluster/versions.js";

const SCREENSHOT = join(PACKAGE_ROOT, "docs/dashboard.png");
const merge = k8s.setHeaderOptions("Content-Type", k8s.PatchStrategy.MergePatch);

/** One table's rows (the "none" row excluded), each cell by its column's header (read in the page). */
const rows = async (page: Page, table: string): Promise<Record<string, string>[]> => {
  const [head = [], ...body] = await page.evaluate<string[][]>(
    `[...document.querySelectorAll("#${table} tr")].map((tr) => [...tr.querySelectorAll("th, td")].map((c) => c.textContent ?? ""))`,
  );
  return body
    .filter((cells) => cells.length === head.length)
    .map((cells) => Object.fromEntries(head.map((h, i) => [h, cells[i] ?? ""])));
};

/**
 * Errors the page reports: script errors, refused content (CSP) and failed loads show up on its
 * console. The browser's own request for /favicon.ico (the page names no icon) is not the page's.
 */
function pageErrors(page: Page): string[] {
  const errors: string[] = [];
  page.on("pageerror", (e) => errors.push(`pageerror: ${e.message}`));
  page.on("console", (m) => {
    if (m.type() !== "error") return;
    if (/Failed to load resource/.test(m.text()) && /\/favicon\.ico$/.test(m.location().url)) return;
    errors.push(`console: ${m.text()} (${m.location().url})`);
  });
  return errors;
}

void test("the dashboard shows a run's election, then its Ready cache, pods and savings, without a reload", async (t) => {
  const chromium = await ensureChromium(t);
  if (!chromium) return;
  const st = await localCluster();
  if (!st?.roles.server || !st.roles.webhook) {
    t.skip("needs the local cluster's server and webhook (`warmstart cluster up`)");
    return;
  }
  const { core, apps } = await kube();
  const ns = await tempNamespace(t, "dash");
  const model = `org/dashboard-${uniqueName("m")}`;
  // A chart of 3 workers whose leader is "downloading" (Running, not Ready) until told otherwise.
  await apps.createNamespacedDeployment({
    namespace: ns,
    body: {
      metadata: { name: "worker" },
      spec: {
        replicas: 3,
        selector: { matchLabels: { app: "worker" } },
        template: {
          metadata: { labels: { app: "worker" }, annotations: { "sim.warmstart.dev/manual-ready": "true" } },
          spec: {
            containers: [
              {
                name: "vllm",
                image: "vllm/vllm-openai:v0.6.3",
                args: ["--model", model],
                resources: { limits: { "nvidia.com/gpu": "1" } },
              },
            ],
          },
        },
      },
    },
  });
  const leader = await waitFor(
    "the leader bound",
    async () =>
      (await listPods(ns, "app=worker")).find(
        (p) => p.metadata?.annotations?.["warmstart.dev/role"] === "leader" && p.spec?.nodeName,
      ),
    60_000,
  );
  const short = leader.metadata!.labels![LABEL_HASH]!;
  // The run's cache goes with the test (the release controller rolls it back).
  t.after(async () => {
    const { custom } = await kube();
    await custom.deleteClusterCustomObject({ ...MODELCACHE, name: short }).catch(() => undefined);
  });

  const context = await openBrowser(t, chromium);
  const page = await context.newPage();
  const errors = pageErrors(page);
  await page.goto(st.roles.server);
  const inTable =
    (table: string, ...cells: string[]) =>
    async (): Promise<Record<string, string>[] | undefined> => {
      const r = await rows(page, table);
      const mine = r.filter((row) => cells.every((c) => Object.values(row).includes(c)));
      return mine.length ? mine : undefined;
    };
  await waitFor("the election on the page", inTable("elections", short, ns), 30_000);
  const waiting = await waitFor("the run's pods on the page", async () => {
    const mine = (await rows(page, "pods")).filter((r) => r.namespace === ns);
    return mine.length === 3 ? mine : undefined;
  });
  assert.deepEqual(waiting.map((r) => r.role).sort(), ["follower", "follower", "leader"]);
  // Marks this document: a reload would lose it.
  await page.evaluate("window.mark = 1");

  // The leader finishes its download: its cache folder fills and it turns Ready.
  const node = st.nodes.find((n) => n.name === leader.spec!.nodeName)!;
  const root = emptyDirPath(node.kubeletRoot, leader.metadata!.uid!, CACHE_VOLUME);
  await mkdir(join(root, "model/huggingface/hub"), { recursive: true });
  await mkdir(join(root, "cache/triton"), { recursive: true });
  await writeFile(join(root, "model/huggingface/hub/model.safetensors"), Buffer.alloc(3 << 20, 7));
  await writeFile(join(root, "cache/triton/kernel.bin"), Buffer.alloc(64 << 10, 1));
  const ready = { metadata: { annotations: { "sim.warmstart.dev/ready": "true" } } };
  await core.patchNamespacedPod({ name: leader.metadata!.name!, namespace: ns, body: ready }, merge);
  // Released followers start as they would once their engine is up.
  await waitFor(
    "3 Ready workers",
    async () => {
      const pods = await listPods(ns, "app=worker");
      for (const p of pods.filter((x) => x.spec?.nodeName && !isPodReady(x)))
        await core.patchNamespacedPod({ name: p.metadata!.name!, namespace: ns, body: ready }, merge);
      return pods.length === 3 && pods.every(isPodReady);
    },
    90_000,
  );

  const cache = await waitFor(
    "the Ready cache with its restores on the page",
    async () =>
      (await inTable("caches", short, model)())?.find(
        (r) => r.phase?.startsWith("Ready") && r.restores === "2",
      ),
    30_000,
  );
  assert.match(cache.size ?? "", /MiB/, "its size");
  await waitFor(
    "the election gone from the page",
    async () => !(await inTable("elections", short)()),
    30_000,
  );
  const pods = await waitFor("the pods Ready on the page", async () => {
    const mine = (await rows(page, "pods")).filter((r) => r.namespace === ns);
    return mine.length === 3 && mine.every((r) => r.phase === "Running" && r["ready in"] !== "-")
      ? mine
      : undefined;
  });
  assert.deepEqual(
    pods.map((r) => r.hash),
    [short, short, short],
  );
  assert.ok(Number(await page.textContent("#t-caches")) >= 1, "the tile counts Ready caches");
  assert.notEqual(await page.textContent("#t-bytes"), "-", "the tile shows the bytes not downloaded");
  assert.ok((await page.$$("#chart rect")).length >= 1, "the chart draws the cache's times");
  assert.equal(await page.evaluate("window.mark"), 1, "no reload");
  assert.deepEqual(errors, [], "the page ran without errors or refused content");

  await page.screenshot({ path: SCREENSHOT, fullPage: true });
  t.diagnostic(`screenshot: ${SCREENSHOT}`);
});

void test("a dashboard served off loopback asks for its token and shows nothing without the right one", async (t) => {
  const chromium = await ensureChromium(t);
  if (!chromium) return;
  const token = "dashboard-test-token-0123456789";
  const hash = "ab".repeat(32);
  const cache = {
    apiVersion: "warmstart.dev/v1alpha1",
    kind: "ModelCache",
    metadata: { name: hash.slice(0, 16) },
    spec: { hash, model: "org/token-model" },
    status: { phase: "Ready", sizeBytes: 5 << 20, restores: 1 },
  } as unknown as ModelCacheObject;
  // A host that is not loopback: the server then insists on the token.
  const server = apiServer({
    snapshot: () => buildSnapshot([cache], [], []),
    registry: new Registry(),
    log: pino({ level: "silent" }),
    token,
    host: "0.0.0.0",
  });
  const listening = await listen(server, { host: "127.0.0.1", port: 0, role: "dashboard-test" });
  t.after(() => listening.close());

  const context = await openBrowser(t, chromium);
  const page = await context.newPage();
  const errors = pageErrors(page);
  await page.goto(listening.url);
  await page.waitForSelector("#login:not([hidden])");
  assert.equal(await page.textContent("#updated"), "this server needs a token");
  assert.deepEqual(await rows(page, "caches"), [], "no data before the token");

  await page.fill("#token", "not-the-token-at-all");
  await page.click("#login button");
  await page.waitForSelector("#login:not([hidden])");
  assert.deepEqual(await rows(page, "caches"), [], "no data with a wrong token");

  await page.fill("#token", token);
  await page.click("#login button");
  await waitFor("the cache on the page", async () =>
    (await rows(page, "caches")).find((r) => r.model === "org/token-model" && r.phase?.startsWith("Ready")),
  );
  // The wrong token's 401s are the only errors the browser logged.
  assert.deepEqual(
    errors.filter((e) => !/status of 401/.test(e)),
    [],
  );
});
