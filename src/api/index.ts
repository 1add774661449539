/**
 * The ModelCache API, in one package: its names, its schema (the TypeScript type, the validator of
 * records read from the API server, and the source of the generated CRD), its conditions, and the
 * one table of phase transitions every writer of the record goes through.
 *
 * Generated from here: deploy/crds/modelcache.yaml (`npm run generate`; a unit test fails when it
 * is stale).
 */
export * from "./names.js";
export * from "./reasons.js";
export * from "./modelcache.js";
export * from "./conditions.js";
export * from "./transitions.js";
export { buildCrd, renderCrdYaml, CRD_FILE, CHART_CRD_FILE } from "./crd.js";
