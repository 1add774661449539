/**
 * The dashboard: one self-contained page that polls /api/snapshot and draws tables and a chart.
 * The page itself holds no data; when the server asks for a token it prompts for one, keeps it for
 * the browser tab only (sessionStorage) and sends it as a bearer token. Its inline script and style
 * are allowed by hash in a strict Content-Security-Policy, so nothing else can run in the page.
 */
import { createHash } from "node:crypto";

export const DASHBOARD_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Warmstart</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2430; background: #f7f8fa; }
  h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 15px; margin: 24px 0 8px; }
  .tiles { display: flex; gap: 12px; margin: 16px 0; }
  .tile { background: #fff; border: 1px solid #dde1e7; border-radius: 8px; padding: 12px 16px; min-width: 150px; }
  .tile b { display: block; font-size: 22px; }
  table { border-collapse: collapse; width: 100%; background: #fff; border: 1px solid #dde1e7; }
  th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid #eef0f3; font-variant-numeric: tabular-nums; }
  th { background: #f0f2f5; font-weight: 600; }
  .phase-Ready { color: #0a7a35; } .phase-Failed { color: #b3261e; } .muted { color: #6b7480; }
  svg text { font: 12px system-ui, sans-serif; fill: #1d2430; }
  form { margin: 16px 0; } input { font: inherit; padding: 4px 8px; min-width: 320px; }
</style></head>
<body>
<h1>Warmstart</h1><div class="muted" id="updated">loading...</div>
<form id="login" hidden><label>Token <input id="token" type="password" autocomplete="off"></label> <button>Show</button></form>
<div class="tiles">
  <div class="tile"><span class="muted">Ready caches</span><b id="t-caches">-</b></div>
  <div class="tile"><span class="muted">Restores</span><b id="t-restores">-</b></div>
  <div class="tile"><span class="muted">Time saved</span><b id="t-saved">-</b></div>
  <div class="tile"><span class="muted">Downloads avoided</span><b id="t-bytes">-</b></div>
</div>
<h2>Time to ready: leader (cold) vs restored, per cache</h2><svg id="chart" width="100%" height="40"></svg>
<h2>Start by phase, as the engines logged it: leader vs restored (mean), per cache</h2><svg id="phases" width="100%" height="40"></svg>
<h2>Caches</h2><table id="caches"></table>
<h2>Node stores</h2><table id="stores"></table>
<h2>Elections in progress</h2><table id="elections"></table>
<h2>Pods</h2><table id="pods"></table>
<script>
const fmtBytes = (n) => { const u = ["B","KiB","MiB","GiB","TiB"]; let i = 0; while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; } return n.toFixed(i ? 1 : 0) + " " + u[i]; };
const fmtS = (s) => s == null ? "-" : s < 120 ? s.toFixed(1) + " s" : (s / 60).toFixed(1) + " min";
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);
function table(el, cols, rows) {
  el.innerHTML = "<tr>" + cols.map(([h]) => "<th>" + h + "</th>").join("") + "</tr>" +
    (rows.length ? rows.map((r) => "<tr>" + cols.map(([, f]) => "<td>" + f(r) + "</td>").join("") + "</tr>").join("")
                 : '<tr><td class="muted" colspan="' + cols.length + '">none</td></tr>');
}
function chart(caches) {
  const svg = document.getElementById("chart"); const rows = caches.filter((c) => c.leaderReadySeconds != null);
  const w = svg.clientWidth || 800, bar = 14, gap = 30, left = 170;
  svg.setAttribute("height", Math.max(40, rows.length * gap + 20));
  const max = Math.max(1, ...rows.map((c) => Math.max(c.leaderReadySeconds || 0, c.restoredReadySeconds || 0)));
  const x = (v) => ((w - left - 80) * v) / max;
  svg.innerHTML = rows.map((c, i) => { const y = 10 + i * gap;
    return '<text x="0" y="' + (y + 11) + '">' + esc(c.hash) + '</text>' +
      '<rect x="' + left + '" y="' + y + '" width="' + x(c.leaderReadySeconds) + '" height="' + (bar / 2) + '" fill="#c4453c"><title>leader ' + fmtS(c.leaderReadySeconds) + '</title></rect>' +
      (c.restoredReadySeconds != null ? '<rect x="' + left + '" y="' + (y + bar / 2) + '" width="' + x(c.restoredReadySeconds) + '" height="' + (bar / 2) + '" fill="#2f8f5b"><title>restored ' + fmtS(c.restoredReadySeconds) + '</title></rect>' : "") +
      '<text x="' + (left + x(c.leaderReadySeconds) + 6) + '" y="' + (y + 11) + '">' + fmtS(c.leaderReadySeconds) + " / " + fmtS(c.restoredReadySeconds) + '</text>'; }).join("");
}
// Disjoint segments: the engines' lines overlap (vLLM's model load holds its download and weight
// load, its engine init its compile), so each bar stacks what only one phase took, and the rest of
// its time to ready as "other".
const SEGMENTS = [["download", "#c4453c"], ["load", "#e08a2c"], ["compile", "#5b6fd6"], ["cudaGraph", "#8a5bd6"], ["other", "#9aa3ad"]];
function segments(s) {
  const v = { download: s.download || 0, compile: s.compile || 0, cudaGraph: s.cudaGraph || 0 };
  v.load = s.weightLoad != null ? s.weightLoad : Math.max(0, (s.modelLoad || 0) - v.download);
  const sum = v.download + v.load + v.compile + v.cudaGraph;
  v.other = Math.max(0, (s.ready || 0) - sum);
  return v;
}
function phaseChart(caches) {
  const svg = document.getElementById("phases");
  const rows = caches.filter((c) => c.leaderStart).flatMap((c) => [[c.hash + " leader", c.leaderStart], [c.hash + " restored", c.restoredStart]]).filter((r) => r[1]).map(([l, s]) => [l, segments(s)]);
  const w = svg.clientWidth || 800, bar = 12, gap = 20, left = 170, top = 24;
  svg.setAttribute("height", Math.max(40, rows.length * gap + top + 10));
  const total = (v) => SEGMENTS.reduce((n, [k]) => n + v[k], 0);
  const max = Math.max(1, ...rows.map((r) => total(r[1])));
  const x = (v) => ((w - left - 80) * v) / max;
  const legend = SEGMENTS.map(([k, c], i) => '<rect x="' + (left + i * 100) + '" y="2" width="10" height="10" fill="' + c + '"></rect><text x="' + (left + i * 100 + 14) + '" y="11">' + k + "</text>").join("");
  svg.innerHTML = legend + rows.map(([label, v], i) => { const y = top + i * gap; let at = left;
    return '<text x="0" y="' + (y + 10) + '">' + esc(label) + "</text>" + SEGMENTS.filter(([k]) => v[k] > 0).map(([k, c]) => {
      const r = '<rect x="' + at + '" y="' + y + '" width="' + x(v[k]) + '" height="' + bar + '" fill="' + c + '"><title>' + k + " " + fmtS(v[k]) + "</title></rect>"; at += x(v[k]); return r; }).join("") +
      '<text x="' + (at + 6) + '" y="' + (y + 10) + '">' + fmtS(total(v)) + "</text>"; }).join("");
}
const login = document.getElementById("login");
login.addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("warmstart-token", document.getElementById("token").value.trim());
  login.hidden = true;
  refresh();
});
async function refresh() {
  try {
    const token = sessionStorage.getItem("warmstart-token");
    const res = await fetch("api/snapshot", { headers: token ? { authorization: "Bearer " + token } : {}, cache: "no-store" });
    if (res.status === 401) {
      login.hidden = false;
      document.getElementById("updated").textContent = "this server needs a token";
      return;
    }
    if (!res.ok) throw new Error((await res.json()).error || res.status);
    const s = await res.json();
    document.getElementById("t-caches").textContent = s.totals.caches;
    document.getElementById("t-restores").textContent = s.totals.restores;
    document.getElementById("t-saved").textContent = fmtS(s.totals.savedSeconds);
    document.getElementById("t-bytes").textContent = fmtBytes(s.totals.savedBytes);
    chart(s.caches); phaseChart(s.caches);
    table(document.getElementById("caches"), [["hash", (c) => esc(c.hash)], ["model", (c) => esc(c.model)],
      ["phase", (c) => '<span class="phase-' + esc(c.phase) + '">' + esc(c.phase) + "</span>" + (c.reason ? ' <span class="muted">' + esc(c.reason) + "</span>" : "")],
      ["size", (c) => fmtBytes(c.sizeBytes)], ["restores", (c) => c.restores], ["leader ready", (c) => fmtS(c.leaderReadySeconds)],
      ["restored ready", (c) => fmtS(c.restoredReadySeconds)], ["saved", (c) => fmtS(c.savedSeconds)],
      ["not downloaded", (c) => fmtBytes(c.savedBytes)], ["node", (c) => esc(c.node || "-")],
      ["copies on other nodes", (c) => c.copies.filter((n) => n !== c.node).map(esc).join(", ") + c.filling.map((f) =>
        ' <span class="muted">' + esc(f.node) + '</span> <progress max="100" value="' + f.percent + '"></progress> ' + f.percent + "%").join("")],
      ["failed captures", (c) => c.failedCaptures]], s.caches);
    table(document.getElementById("stores"), [["node", (n) => esc(n.node)], ["used", (n) => fmtBytes(n.usedBytes)],
      ["budget", (n) => n.budgetBytes ? fmtBytes(n.budgetBytes) : "none"], ["caches", (n) => n.caches.length]], s.stores || []);
    table(document.getElementById("elections"), [["hash", (e) => esc(e.hash)], ["leader namespace", (e) => esc(e.leaderNamespace)],
      ["acquired", (e) => esc(e.acquired)], ["deadline", (e) => esc(e.deadline)], ["waiting followers", (e) => e.followers]], s.elections);
    table(document.getElementById("pods"), [["namespace", (p) => esc(p.namespace)], ["pod", (p) => esc(p.name)], ["hash", (p) => esc(p.hash)],
      ["role", (p) => esc(p.role)], ["phase", (p) => esc(p.phase)], ["ready in", (p) => fmtS(p.readySeconds)], ["node", (p) => esc(p.node)],
      ["download", (p) => fmtS(p.startup && p.startup.seconds.download)], ["load", (p) => fmtS(p.startup && (p.startup.seconds.weightLoad ?? p.startup.seconds.modelLoad))],
      ["compile", (p) => fmtS(p.startup && p.startup.seconds.compile)],
      ["compile cache", (p) => p.startup ? esc(p.startup.compileCache) + (p.startup.cause ? ' <span class="muted">' + esc(p.startup.cause) + "</span>" : "") : "-"]], s.pods);
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) { document.getElementById("updated").textContent = "cannot reach the server: " + e; }
}
refresh(); setInterval(refresh, 2000);
</script></body></html>`;

const inline = (tag: string): string => {
  const m = new RegExp(`<${tag}>([\\s\\S]*?)</${tag}>`).exec(DASHBOARD_HTML);
  if (!m) throw new Error(`the dashboard has no <${tag}>`);
  return `'sha256-${createHash("sha256").update(m[1]!).digest("base64")}'`;
};

/** The page's policy: its own inline script and style (by hash), calls to this origin, nothing else. */
export const DASHBOARD_CSP = [
  "default-src 'none'",
  `script-src ${inline("script")}`,
  `style-src ${inline("style")}`,
  "connect-src 'self'",
  "img-src 'self' data:",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'",
].join("; ");
