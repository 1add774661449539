/**
 * The PNG plot of `npm run bench:e2e` (e2e.ts) and `npm run bench:swarm` (swarm-report.ts): one
 * column per metric, each its own y scale, a line per series over N (log 2 scale, a tick at each N
 * run), compiled with vega-lite and rendered at twice its size.
 */
import { Resvg } from "@resvg/resvg-js";
import * as vega from "vega";
import { compile } from "vega-lite";

/** One point: its N, its metric (the column), its value, and its series under the plot's `series` field. */
export interface PlotRow {
  N: number;
  metric: string;
  value: number;
  [field: string]: string | number;
}

export async function plotByN(o: {
  title: string;
  /** The x axis's title: what N counts. */
  xTitle: string;
  /** The rows' field that names each line (its colour). */
  series: string;
  rows: PlotRow[];
}): Promise<Buffer> {
  const spec = compile({
    $schema: "https://vega.github.io/schema/vega-lite/v6.json",
    title: o.title,
    data: { values: o.rows },
    facet: { column: { field: "metric", type: "nominal", title: null } },
    spec: {
      width: 260,
      height: 220,
      mark: { type: "line", point: true },
      encoding: {
        x: {
          field: "N",
          type: "quantitative",
          title: o.xTitle,
          scale: { type: "log", base: 2 },
          axis: { values: [...new Set(o.rows.map((r) => r.N))] },
        },
        y: { field: "value", type: "quantitative", title: null },
        color: { field: o.series, type: "nominal" },
      },
    },
    resolve: { scale: { y: "independent" } },
    config: { background: "white" },
  }).spec;
  const view = new vega.View(vega.parse(spec), { renderer: "none" });
  return new Resvg(await view.toSVG(), { fitTo: { mode: "zoom", value: 2 } }).render().asPng();
}
