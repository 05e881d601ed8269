// The status page served at / by every dsecd (actors/front/status_http.hpp): one
// HTML document with its style and script inline, no external assets. Its
// script reads /status.json every 2 s and draws the nodes (their load) and
// the sandboxes on them; every value goes into the page as text, never as
// markup.
#include "actors/front/status_http.hpp"

namespace dsec {

const std::string& StatusPageHtml() {
  static const std::string kPage = R"HTML(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>dsec status</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f5f6f8; }
  header { background: #1d2330; color: #fff; padding: 12px 20px; display: flex; align-items: baseline; gap: 16px; }
  header h1 { font-size: 18px; margin: 0; }
  header .sub { color: #aab2c0; }
  main { padding: 16px 20px; }
  section { background: #fff; border: 1px solid #dde1e7; border-radius: 6px; margin-bottom: 16px; padding: 12px 16px; }
  h2 { font-size: 15px; margin: 0 0 8px; }
  table { border-collapse: collapse; width: 100%; }
  th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #eef0f3; white-space: nowrap; }
  th { color: #5b6475; font-weight: 600; }
  .bar { background: #eef0f3; border-radius: 3px; width: 140px; height: 10px; display: inline-block; vertical-align: middle; }
  .bar > span { background: #3b82f6; display: block; height: 100%; border-radius: 3px; }
  .phase { padding: 1px 6px; border-radius: 3px; background: #eef0f3; }
  .phase-running { background: #dcfce7; } .phase-paused { background: #fef9c3; }
  .phase-failed, .state-down { background: #fee2e2; } .state-draining { background: #fef9c3; } .phase-starting, .phase-pending { background: #e0e7ff; }
  #error { display: none; background: #fee2e2; border: 1px solid #fca5a5; padding: 8px 12px; border-radius: 6px; margin-bottom: 16px; }
  .muted { color: #5b6475; }
  td.warn { color: #8a5a00; } td.bad { color: #b00020; font-weight: 600; }
</style>
</head>
<body>
<header><h1>dsec</h1><span class="sub" id="summary">loading…</span><span class="sub" id="updated"></span></header>
<main>
  <div id="error"></div>
  <section><h2>Nodes</h2>
    <table><thead><tr><th>node</th><th>role</th><th>state</th><th>up</th><th>kinds</th><th>sandboxes</th><th>runs in flight</th>
      <th>memory used</th><th>load</th></tr></thead><tbody id="nodes"></tbody></table>
  </section>
  <section><h2>Sandboxes <span class="muted" id="sbcount"></span></h2>
    <table><thead><tr><th>id</th><th>kind</th><th>image</th><th>phase</th><th>node</th><th>age</th><th>session</th></tr></thead>
      <tbody id="sandboxes"></tbody></table>
  </section>
  <section><h2>Images on demand <span class="muted">(each node's lazy images, since its dsecd started)</span></h2>
    <table><thead><tr><th>node</th><th>images</th><th>fetched</th><th>fetch rate</th><th>cache hits</th><th>cached</th>
      <th>prefetched</th><th>refused / failed</th></tr></thead><tbody id="lazy"></tbody></table>
  </section>
  <section><h2>E2B calls <span class="muted">(this dsecd's door, since it started)</span></h2>
    <table><thead><tr><th>call</th><th>answered</th><th>4xx</th><th>5xx</th></tr></thead>
      <tbody id="e2b"></tbody></table>
  </section>
</main>
<script>
"use strict";
function cell(tr, text, cls) {
  const td = document.createElement("td");
  if (text instanceof Node) td.appendChild(text); else td.textContent = text;
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}
function span(text, cls) { const s = document.createElement("span"); s.textContent = text; s.className = cls; return s; }
function age(ms) {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 120) return s + " s";
  if (s < 7200) return Math.round(s / 60) + " min";
  if (s < 172800) return Math.round(s / 3600) + " h";
  return Math.round(s / 86400) + " d";
}
function gib(b) { return (b / 1073741824).toFixed(1) + " GiB"; }
function bar(fraction, label) {
  const wrap = document.createElement("span");
  const b = document.createElement("span"); b.className = "bar";
  const fill = document.createElement("span"); fill.style.width = Math.round(Math.min(1, Math.max(0, fraction)) * 100) + "%";
  b.appendChild(fill); wrap.appendChild(b); wrap.appendChild(document.createTextNode(" " + label));
  return wrap;
}
const lastLazy = {};  // node -> its bytes fetched at the last refresh (the fetch rate)
function draw(s) {
  const nodes = document.getElementById("nodes"), sbs = document.getElementById("sandboxes");
  nodes.replaceChildren(); sbs.replaceChildren();
  let live = 0, listed = 0, flags = 0;
  for (const n of s.nodes || []) {
    const tr = document.createElement("tr"); tr.dataset.node = n.node;
    // A controller's page: every node with its state; a node down says why and has no figures.
    const state = n.state || "up";
    cell(tr, n.node); cell(tr, n.role);
    cell(tr, span(state === "down" && n.down_reason ? "down: " + n.down_reason : state, "phase state-" + state));
    cell(tr, n.uptime_s === undefined ? "" : age(n.uptime_s * 1000)); cell(tr, (n.kinds || []).join(", "));
    cell(tr, String(n.sandboxes || 0)); cell(tr, n.runs_in_flight === undefined ? "" : String(n.runs_in_flight));
    const m = n.memory || {}, used = (m.total || 0) - (m.available || 0);
    cell(tr, m.total ? bar(used / m.total, gib(used) + " of " + gib(m.total)) : "");
    cell(tr, n.cpus ? (n.load1 || 0).toFixed(2) + " on " + n.cpus + " CPUs" : "");
    nodes.appendChild(tr);
    live += n.sandboxes || 0;
    flags += n.flags || 0;
    for (const sb of n.sandbox_list || []) {
      const r = document.createElement("tr"); r.dataset.sandbox = sb.id;
      cell(r, sb.id); cell(r, sb.kind); cell(r, sb.image); cell(r, span(sb.phase, "phase phase-" + sb.phase));
      cell(r, n.node); cell(r, age(s.now_ms - sb.created_ms)); cell(r, sb.session || "");
      sbs.appendChild(r); listed++;
    }
  }
  const lazy = document.getElementById("lazy");
  lazy.replaceChildren();
  for (const n of s.nodes || []) {
    const l = n.lazy_images;
    if (!l) continue;
    const tr = document.createElement("tr"); tr.dataset.lazyNode = n.node;
    const before = lastLazy[n.node], now = s.now_ms;
    const rate = before && now > before.ms ? (l.bytes_fetched - before.bytes) / ((now - before.ms) / 1000) : 0;
    lastLazy[n.node] = {ms: now, bytes: l.bytes_fetched};
    const reads = l.cache_hits + l.cache_misses;
    cell(tr, n.node); cell(tr, String(l.images));
    cell(tr, l.chunks_fetched + " chunks, " + (l.bytes_fetched / 1048576).toFixed(1) + " MiB");
    cell(tr, (rate / 1048576).toFixed(2) + " MiB/s");
    cell(tr, reads ? (100 * l.cache_hits / reads).toFixed(1) + "% of " + reads : "none yet");
    cell(tr, (l.cached_bytes / 1048576).toFixed(1) + " MiB"); cell(tr, String(l.prefetched_chunks));
    cell(tr, l.digest_failures + " / " + l.fetch_failures, l.digest_failures || l.fetch_failures ? "warn" : "");
    lazy.appendChild(tr);
  }
  if (!lazy.children.length) {
    const tr = document.createElement("tr"); cell(tr, "no node takes lazy images (cluster nodes do)", "muted").colSpan = 8;
    lazy.appendChild(tr);
  }
  const e2b = document.getElementById("e2b");
  e2b.replaceChildren();
  for (const c of s.e2b_calls || []) {
    const tr = document.createElement("tr"); tr.dataset.e2bCall = c.call;
    cell(tr, c.call); cell(tr, String(c.answered));
    cell(tr, String(c.client_errors), c.client_errors ? "warn" : ""); cell(tr, String(c.server_errors), c.server_errors ? "bad" : "");
    e2b.appendChild(tr);
  }
  if (!e2b.children.length) {
    const tr = document.createElement("tr"); cell(tr, "none yet (or the door is off: dsecd --e2b)", "muted").colSpan = 4;
    e2b.appendChild(tr);
  }
  document.getElementById("summary").textContent =
      (s.nodes || []).length + " node(s), " + live + " sandbox(es) live, " + (s.sessions || 0) + " session(s) open, " +
      flags + " misbehaviour flag(s) raised";
  document.getElementById("sbcount").textContent = listed < live ? "(first " + listed + " of " + live + ")" : "";
  document.getElementById("updated").textContent = "updated " + new Date(s.now_ms).toLocaleTimeString();
}
async function refresh() {
  const err = document.getElementById("error");
  try {
    const r = await fetch("/status.json", {cache: "no-store"});
    if (!r.ok) throw new Error("HTTP " + r.status + ": " + (await r.text()));
    const s = await r.json();
    if (!s.ok) throw new Error(s.error || "the node answered an error");
    draw(s);
    err.style.display = "none";
    document.body.dataset.ready = "1";
  } catch (e) {
    err.textContent = "cannot read /status.json: " + e.message;
    err.style.display = "block";
  }
}
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
)HTML";
  return kPage;
}

}  // namespace dsec
