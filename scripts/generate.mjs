#!/usr/bin/env node
// Writes the files generated from src/api (run after the build: `npm run generate`):
// deploy/crds/modelcache.yaml, and the chart's copy when it is not a link to it.
import { lstat, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import prettier from "prettier";

const root = new URL("..", import.meta.url).pathname;
const { renderCrdYaml, CRD_FILE, CHART_CRD_FILE } = await import(join(root, "dist/src/api/crd.js"));

async function write(rel, text) {
  const path = join(root, rel);
  const options = { ...(await prettier.resolveConfig(path)), filepath: path };
  const formatted = await prettier.format(text, options);
  const before = await readFile(path, "utf8").catch(() => undefined);
  if (before === formatted) return console.log(`${rel}: up to date`);
  await writeFile(path, formatted);
  console.log(`${rel}: written`);
}

await write(CRD_FILE, renderCrdYaml());
const chart = await lstat(join(root, CHART_CRD_FILE)).catch(() => undefined);
if (!chart?.isSymbolicLink()) await write(CHART_CRD_FILE, renderCrdYaml());
