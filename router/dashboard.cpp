#include "router/dashboard.hpp"

#include <cctype>
#include <fstream>
#include <sstream>

namespace sy::router {

const std::string& chart_js() {
  static const std::string js = [] {
    for (const char* path :
         {"/usr/share/javascript/chart.js/chart.min.js", "/usr/share/javascript/chart.js/Chart.min.js"}) {
      std::ifstream in(path, std::ios::binary);
      if (!in) continue;
      std::ostringstream ss;
      ss << in.rdbuf();
      return ss.str();
    }
    return std::string();
  }();
  return js;
}

// The page is self-contained: inline CSS and script, Chart.js 3.x (UMD) from /dashboard/chart.js,
// data from /v1/cache/stats and /metrics (authenticated by the sign-in cookie). Every
// string that comes from the data (tenant and model names, prompt previews) reaches the DOM only
// through textContent or attributes set from script, never through innerHTML. After the first
// render from /v1/cache/stats, <body> gets data-ready="1" (for headless-browser tests).
const std::string& dashboard_html() {
  static const std::string html = R"HTML(<!doctype html>
<html lang="en"><head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Switchyard · response cache</title>
<style>
  :root { --bg:#f4f6f9; --card:#fff; --ink:#1d2430; --muted:#667085; --line:#e3e7ee;
          --hit:#2e9e5b; --coal:#2a7fb8; --miss:#e08a2c; --bypass:#9aa0a6; --bad:#c0392b; }
  * { box-sizing: border-box; }
  body { margin:0; background:var(--bg); color:var(--ink);
         font:14px/1.4 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif; }
  header { display:flex; align-items:center; gap:16px; flex-wrap:wrap; padding:14px 24px;
           background:#1d2430; color:#fff; }
  header h1 { margin:0; font-size:18px; font-weight:600; }
  header .sub { color:#aab3c2; font-size:12px; }
  header .spacer { flex:1; }
  .range button { border:1px solid #4a5568; background:transparent; color:#dfe4ec; padding:4px 10px;
                  font:inherit; font-size:12px; cursor:pointer; }
  .range button:first-child { border-radius:4px 0 0 4px; }
  .range button:last-child { border-radius:0 4px 4px 0; }
  .range button + button { border-left:none; }
  .range button.on { background:#dfe4ec; color:#1d2430; }
  main { padding:18px 24px 32px; max-width:1400px; margin:0 auto; }
  #error { margin:0 0 16px; padding:10px 14px; border-radius:6px; background:#fdecea; color:var(--bad);
           border:1px solid #f5c2bd; font-weight:500; }
  #error[hidden] { display:none; }
  .grid { display:grid; gap:14px; }
  .cards { grid-template-columns: 1.6fr repeat(5, 1fr); margin-bottom:14px; }
  .cards2 { grid-template-columns: repeat(4, 1fr); margin-bottom:14px; }
  .card { background:var(--card); border:1px solid var(--line); border-radius:8px; padding:12px 14px; }
  .card .label { color:var(--muted); font-size:12px; text-transform:uppercase; letter-spacing:.04em; }
  .card .value { font-size:24px; font-weight:600; margin-top:4px; font-variant-numeric:tabular-nums; }
  .card .note { color:var(--muted); font-size:12px; margin-top:2px; }
  .card.big .value { font-size:44px; color:var(--hit); line-height:1.1; }
  .dot { display:inline-block; width:8px; height:8px; border-radius:50%; margin-right:6px; }
  .charts { grid-template-columns: 2fr 1fr; margin-bottom:14px; }
  .charts2 { grid-template-columns: 1fr 1fr 1fr; margin-bottom:14px; }
  .card h2 { margin:0 0 8px; font-size:14px; font-weight:600; }
  .chart { position:relative; height:240px; }
  .nochart { color:var(--muted); padding:20px 0; }
  table { width:100%; border-collapse:collapse; }
  th, td { text-align:left; padding:6px 8px; border-bottom:1px solid var(--line); vertical-align:top; }
  th { color:var(--muted); font-weight:500; font-size:12px; text-transform:uppercase; letter-spacing:.04em; }
  td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
  td.hash { font-family:ui-monospace, "DejaVu Sans Mono", monospace; font-size:12px; white-space:nowrap; }
  td.preview { max-width:640px; overflow:hidden; text-overflow:ellipsis; white-space:nowrap; }
  td.empty { color:var(--muted); text-align:center; padding:16px; }
  .muted { color:var(--muted); }
  @media (max-width: 1000px) { .cards, .cards2, .charts, .charts2 { grid-template-columns: 1fr 1fr; } }
</style>
<script src="/dashboard/chart.js"></script>
</head>
<body>
<header>
  <h1>Switchyard · response cache</h1>
  <span class="sub" id="updated">loading…</span>
  <span class="spacer"></span>
  <span class="range" id="range">
    <button type="button" data-s="900">15 min</button><button type="button" data-s="3600">1 h</button><button
      type="button" data-s="86400">24 h</button>
  </span>
  <span class="sub">auto-refresh 5 s</span>
</header>
<main>
  <div id="error" role="alert" hidden></div>

  <div class="grid cards">
    <div class="card big"><div class="label">Hit rate</div><div class="value" id="hit-rate">—</div>
      <div class="note">served from cache incl. coalesced: <span id="served-rate">—</span></div></div>
    <div class="card"><div class="label">Requests</div><div class="value" id="t-requests">—</div></div>
    <div class="card"><div class="label"><span class="dot" style="background:var(--hit)"></span>Hits</div>
      <div class="value" id="t-hit">—</div></div>
    <div class="card"><div class="label"><span class="dot" style="background:var(--miss)"></span>Misses</div>
      <div class="value" id="t-miss">—</div></div>
    <div class="card"><div class="label"><span class="dot" style="background:var(--coal)"></span>Coalesced</div>
      <div class="value" id="t-coalesced">—</div></div>
    <div class="card"><div class="label"><span class="dot" style="background:var(--bypass)"></span>Bypass</div>
      <div class="value" id="t-bypass">—</div></div>
  </div>

  <div class="grid cards2">
    <div class="card"><div class="label">Tokens saved</div><div class="value" id="t-tokens">—</div>
      <div class="note">not generated by a worker</div></div>
    <div class="card"><div class="label">Device time saved</div><div class="value" id="t-device">—</div>
      <div class="note">estimated worker seconds</div></div>
    <div class="card"><div class="label">Lookup latency p50 / p99</div>
      <div class="value"><span id="lat-p50">—</span> / <span id="lat-p99">—</span></div>
      <div class="note" id="lat-note">Redis GET, since router start</div></div>
    <div class="card"><div class="label">Lookups since start</div><div class="value" id="lk-total">—</div>
      <div class="note" id="lk-detail">—</div></div>
  </div>

  <div class="grid charts">
    <div class="card"><h2>Hit rate over time <span class="muted">(per minute)</span></h2>
      <div class="chart"><canvas id="c-series"></canvas></div></div>
    <div class="card"><h2>Hits by entry age</h2><div class="chart"><canvas id="c-age"></canvas></div></div>
  </div>

  <div class="grid charts2">
    <div class="card"><h2>By tenant</h2><div class="chart"><canvas id="c-tenant"></canvas></div></div>
    <div class="card"><h2>By model</h2><div class="chart"><canvas id="c-model"></canvas></div></div>
    <div class="card"><h2>Saved per minute</h2><div class="chart"><canvas id="c-saved"></canvas></div></div>
  </div>

  <div class="card"><h2>Top repeated prompts</h2>
    <table><thead><tr><th class="num">#</th><th>Prompt hash</th><th class="num">Count</th><th>Preview</th></tr></thead>
      <tbody id="top"><tr><td class="empty" colspan="4">—</td></tr></tbody></table></div>
</main>
<script>
"use strict";
(function () {
  const params = new URLSearchParams(location.search);
  const ranges = {"15m": 900, "1h": 3600, "24h": 86400};
  let rangeS = ranges[params.get("range")] || 3600;
  let clockSkewS = 0;  // server unix time minus ours, learnt from each response's "to"
  const REFRESH_MS = 5000;
  const $ = (id) => document.getElementById(id);
  const colors = {hit: "#2e9e5b", coalesced: "#2a7fb8", miss: "#e08a2c", bypass: "#9aa0a6"};
  const kinds = ["hit", "coalesced", "miss", "bypass"];

  // ---- formatting -------------------------------------------------------------------------
  const int = (n) => (typeof n === "number" && isFinite(n)) ? Math.round(n).toLocaleString("en-US") : "—";
  function pct(rate) { return (rate * 100).toFixed(1) + " %"; }
  function seconds(s) {
    if (typeof s !== "number" || !isFinite(s)) return "—";
    if (s < 60) return s.toFixed(s < 10 ? 2 : 1) + " s";
    if (s < 3600) return (s / 60).toFixed(1) + " min";
    return (s / 3600).toFixed(1) + " h";
  }
  function latency(s) {
    if (s === null || !isFinite(s)) return "—";
    if (s < 1e-3) return (s * 1e6).toFixed(0) + " µs";
    if (s < 1) return (s * 1e3).toFixed(s < 0.01 ? 2 : 1) + " ms";
    return s.toFixed(2) + " s";
  }
  function hhmm(unixS) {
    const d = new Date(unixS * 1000);
    const p = (x) => String(x).padStart(2, "0");
    return p(d.getHours()) + ":" + p(d.getMinutes());
  }
  function setText(id, text) { const e = $(id); if (e) e.textContent = text; }

  function showError(msg) {
    const e = $("error");
    if (msg) { e.textContent = msg; e.hidden = false; } else { e.textContent = ""; e.hidden = true; }
  }

  // ---- Prometheus text --------------------------------------------------------------------
  function parseLabels(s) {
    const out = {};
    const re = /(\w+)="((?:[^"\\]|\\.)*)"/g;
    let m;
    while ((m = re.exec(s || "")) !== null) out[m[1]] = m[2].replace(/\\(.)/g, (_, c) => c === "n" ? "\n" : c);
    return out;
  }
  function parseProm(text) {
    const samples = [];
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const m = /^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const v = m[3] === "+Inf" ? Infinity : m[3] === "-Inf" ? -Infinity : parseFloat(m[3]);
      samples.push({name: m[1], labels: parseLabels(m[2]), value: v});
    }
    return samples;
  }
  // Like PromQL's histogram_quantile: linear within the bucket; the +Inf bucket answers with the
  // highest finite bound. null when the histogram is empty.
  function histogramQuantile(q, buckets) {
    const bs = buckets.filter((b) => !isNaN(b.le)).sort((a, b) => a.le - b.le);
    if (!bs.length) return null;
    const total = bs[bs.length - 1].count;
    if (!(total > 0)) return null;
    const rank = q * total;
    let prevLe = 0, prevCount = 0;
    for (const b of bs) {
      if (b.count >= rank) {
        if (b.le === Infinity) return prevLe;
        if (b.count === prevCount) return b.le;
        return prevLe + (b.le - prevLe) * (rank - prevCount) / (b.count - prevCount);
      }
      prevLe = b.le === Infinity ? prevLe : b.le;
      prevCount = b.count;
    }
    return prevLe;
  }
  function renderMetrics(text) {
    const samples = parseProm(text);
    const buckets = samples.filter((s) => s.name === "switchyard_router_cache_lookup_seconds_bucket")
                           .map((s) => ({le: s.labels.le === "+Inf" ? Infinity : parseFloat(s.labels.le),
                                         count: s.value}));
    setText("lat-p50", latency(histogramQuantile(0.5, buckets)));
    setText("lat-p99", latency(histogramQuantile(0.99, buckets)));
    const lookups = samples.filter((s) => s.name === "switchyard_router_cache_lookups_total");
    if (!lookups.length) {
      setText("lk-total", "—");
      setText("lk-detail", "no cache metrics (cache off?)");
      return;
    }
    let total = 0;
    const parts = [];
    for (const s of lookups) {
      total += s.value;
      if (s.value > 0) parts.push((s.labels.status || "?") + " " + int(s.value));
    }
    setText("lk-total", int(total));
    setText("lk-detail", parts.length ? parts.join(" · ") : "none yet");
  }

  // ---- charts -----------------------------------------------------------------------------
  const charts = {};
  function makeCharts() {
    if (typeof Chart === "undefined") {
      for (const id of ["c-series", "c-age", "c-tenant", "c-model", "c-saved"]) {
        const c = $(id), p = document.createElement("div");
        p.className = "nochart";
        p.textContent = "Charts unavailable: /dashboard/chart.js did not load (install libjs-chart.js).";
        c.parentNode.replaceChild(p, c);
      }
      return;
    }
    Chart.defaults.font.family = getComputedStyle(document.body).fontFamily;
    Chart.defaults.color = "#667085";
    const base = {responsive: true, maintainAspectRatio: false, animation: false,
                  plugins: {legend: {position: "bottom", labels: {boxWidth: 10}}}};
    charts.series = new Chart($("c-series"), {
      data: {labels: [], datasets: [
        {type: "line", label: "hit rate %", data: [], yAxisID: "y", borderColor: colors.hit,
         backgroundColor: colors.hit, pointRadius: 2, borderWidth: 2, spanGaps: false, tension: 0.2},
        {type: "line", label: "served from cache %", data: [], yAxisID: "y", borderColor: colors.coalesced,
         backgroundColor: colors.coalesced, pointRadius: 0, borderWidth: 1, borderDash: [4, 3], spanGaps: false},
        {type: "bar", label: "requests", data: [], yAxisID: "y1", backgroundColor: "rgba(102,112,133,0.25)"}]},
      options: Object.assign({}, base, {
        interaction: {mode: "index", intersect: false},
        scales: {y: {min: 0, max: 100, position: "left", title: {display: true, text: "%"}},
                 y1: {beginAtZero: true, position: "right", grid: {drawOnChartArea: false},
                      title: {display: true, text: "requests / min"}, ticks: {precision: 0}},
                 x: {ticks: {maxTicksLimit: 12, autoSkip: true, maxRotation: 0}}}})});
    const stacked = (extra) => ({
      type: "bar",
      data: {labels: [], datasets: kinds.map((k) => ({label: k, data: [], backgroundColor: colors[k]}))},
      options: Object.assign({}, base, {scales: {x: {stacked: true}, y: {stacked: true, beginAtZero: true,
                                                                          ticks: {precision: 0}}}}, extra)});
    charts.tenant = new Chart($("c-tenant"), stacked({}));
    charts.model = new Chart($("c-model"), stacked({}));
    charts.age = new Chart($("c-age"), {
      type: "bar",
      data: {labels: [], datasets: [{label: "hits", data: [], backgroundColor: colors.hit}]},
      options: Object.assign({}, base, {plugins: {legend: {display: false}},
                                        scales: {y: {beginAtZero: true, ticks: {precision: 0}}}})});
    charts.saved = new Chart($("c-saved"), {
      data: {labels: [], datasets: [
        {type: "bar", label: "tokens", data: [], yAxisID: "y", backgroundColor: "rgba(46,158,91,0.6)"},
        {type: "line", label: "device-seconds", data: [], yAxisID: "y1", borderColor: colors.coalesced,
         backgroundColor: colors.coalesced, pointRadius: 0, borderWidth: 2}]},
      options: Object.assign({}, base, {
        interaction: {mode: "index", intersect: false},
        scales: {y: {beginAtZero: true, ticks: {precision: 0}},
                 y1: {beginAtZero: true, position: "right", grid: {drawOnChartArea: false}},
                 x: {ticks: {maxTicksLimit: 6, autoSkip: true, maxRotation: 0}}}})});
  }
  function setGroups(chart, groups) {
    if (!chart) return;
    const names = Object.keys(groups || {}).sort();
    chart.data.labels = names;
    chart.data.datasets.forEach((ds, i) => { ds.data = names.map((n) => groups[n][kinds[i]] || 0); });
    chart.update("none");
  }

  // ---- stats ------------------------------------------------------------------------------
  function renderTop(list) {
    const body = $("top");
    body.replaceChildren();
    if (!list || !list.length) {
      const tr = document.createElement("tr"), td = document.createElement("td");
      td.colSpan = 4;
      td.className = "empty";
      td.textContent = "No repeated prompts in this range.";
      tr.appendChild(td);
      body.appendChild(tr);
      return;
    }
    list.forEach((p, i) => {
      const tr = document.createElement("tr");
      const cell = (cls, text, title) => {
        const td = document.createElement("td");
        if (cls) td.className = cls;
        td.textContent = text;  // never innerHTML: previews are user text
        if (title) td.title = title;
        tr.appendChild(td);
      };
      cell("num", String(i + 1));
      const h = String(p.hash || "");
      cell("hash", h.length > 20 ? h.slice(0, 20) + "…" : h, h);
      cell("num", int(p.count));
      if (typeof p.preview === "string") cell("preview", p.preview, p.preview);
      else cell("preview muted", "(preview off for this tenant)");
      body.appendChild(tr);
    });
  }

  function renderStats(s) {
    const t = s.totals || {};
    const requests = t.requests || 0;
    // Exactly the API's totals.hit_rate × 100, one decimal; "—" when there was nothing to rate.
    setText("hit-rate", requests > 0 ? pct(t.hit_rate || 0) : "—");
    setText("served-rate", requests > 0 ? pct(t.served_from_cache_rate || 0) : "—");
    setText("t-requests", int(requests));
    for (const k of kinds) setText("t-" + k, int(t[k] || 0));
    setText("t-tokens", int(t.tokens_saved || 0));
    setText("t-device", seconds(t.device_s_saved || 0));

    const series = Array.isArray(s.series) ? s.series : [];
    const labels = series.map((p) => hhmm(p.t));
    if (charts.series) {
      charts.series.data.labels = labels;
      charts.series.data.datasets[0].data = series.map((p) => p.requests ? +(p.hit_rate * 100).toFixed(2) : null);
      charts.series.data.datasets[1].data =
          series.map((p) => p.requests ? +(p.served_from_cache_rate * 100).toFixed(2) : null);
      charts.series.data.datasets[2].data = series.map((p) => p.requests || 0);
      charts.series.update("none");
    }
    if (charts.saved) {
      charts.saved.data.labels = labels;
      charts.saved.data.datasets[0].data = series.map((p) => p.tokens_saved || 0);
      charts.saved.data.datasets[1].data = series.map((p) => p.device_s_saved || 0);
      charts.saved.update("none");
    }
    setGroups(charts.tenant, s.by_tenant);
    setGroups(charts.model, s.by_model);
    if (charts.age) {
      const age = s.hit_age || {};  // JSON objects come key-sorted: put the buckets in age order
      const order = ["<1m", "<10m", "<1h", "<1d", ">=1d"];
      const names = order.filter((k) => k in age).concat(Object.keys(age).filter((k) => !order.includes(k)));
      charts.age.data.labels = names;
      charts.age.data.datasets[0].data = names.map((k) => age[k] || 0);
      charts.age.update("none");
    }
    renderTop(s.top_prompts);
  }

  async function apiError(r) {
    let msg = "";
    try {
      const j = await r.json();
      msg = (j && j.error && j.error.message) || "";
    } catch (e) { /* not JSON */ }
    let hint = "";
    if (r.status === 401) hint = " — sign in again at /dashboard";
    if (r.status === 403) hint = " — the key you signed in with is not an admin key";
    return "Cache stats: HTTP " + r.status + (msg ? ": " + msg : "") + hint;
  }

  function statsUrl() {
    let u = "/v1/cache/stats?top=10";
    if (rangeS !== 3600) u += "&from=" + (Math.floor(Date.now() / 1000 + clockSkewS) - rangeS);
    return u;
  }

  // One refresh: both fetches, then render. Returns the error text to show ("" for none), or
  // null when a newer refresh has started meanwhile (its result wins).
  async function load(mine) {
    // The session cookie (HttpOnly, set by the sign-in form) authenticates both fetches.
    const asked = Date.now() / 1000;
    const [st, mt] = await Promise.allSettled([
      fetch(statsUrl(), {credentials: "same-origin", cache: "no-store"}),
      fetch("/metrics", {credentials: "same-origin", cache: "no-store"}).then((r) => r.ok ? r.text() : Promise.reject(new Error("HTTP " + r.status)))]);
    if (mine !== seq) return null;
    if (mt.status === "fulfilled") renderMetrics(mt.value);
    if (st.status === "rejected") return "Cannot reach the router: " + (st.reason && st.reason.message || st.reason);
    const r = st.value;
    let s = null;
    if (r.ok || r.status === 503) {
      try { s = await r.json(); } catch (e) { s = null; }
    }
    if (mine !== seq) return null;
    if (!s || !s.totals) {
      return s === null && (r.ok || r.status === 503) ? "Cache stats: unreadable response (HTTP " + r.status + ")"
                                                      : await apiError(r);
    }
    if (typeof s.to === "number") clockSkewS = s.to - asked;
    renderStats(s);
    const partial = s.complete === false;
    setText("updated", "updated " + new Date().toLocaleTimeString("en-GB") + (partial ? " (partial)" : ""));
    document.body.dataset.ready = "1";
    return partial ? "Partial data: Redis failed part-way (" + (s.error || "unknown error") + ")" : "";
  }

  let timer = null, seq = 0;
  async function refresh() {
    clearTimeout(timer);
    const mine = ++seq;  // a range click while a refresh is in flight: only the newest one renders
    let err;
    try {
      err = await load(mine);
    } catch (e) {
      err = "Dashboard error: " + (e && e.message || e);
    }
    if (mine !== seq) return;
    if (err && !err.startsWith("Partial"))
      setText("updated", document.body.dataset.ready === "1" ? "stale — showing the last good data" : "no data");
    showError(err);
    timer = setTimeout(refresh, REFRESH_MS);  // keeps going after errors too
  }

  function markRange() {
    for (const b of $("range").querySelectorAll("button")) b.classList.toggle("on", +b.dataset.s === rangeS);
  }
  $("range").addEventListener("click", (ev) => {
    const b = ev.target.closest("button");
    if (!b) return;
    rangeS = +b.dataset.s;
    markRange();
    refresh();
  });

  markRange();
  makeCharts();
  refresh();
})();
</script>
</body></html>
)HTML";
  return html;
}

namespace {

constexpr std::string_view k_cookie = "sy_dashboard_key";

bool unreserved(unsigned char c) { return std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decoding as forms and cookies need it ('+' is a space in a form body); "" when malformed.
std::string percent_decode(std::string_view v, bool plus_is_space) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == '%') {
      if (i + 2 >= v.size() || hex_value(v[i + 1]) < 0 || hex_value(v[i + 2]) < 0) return "";
      out += static_cast<char>(hex_value(v[i + 1]) * 16 + hex_value(v[i + 2]));
      i += 2;
    } else {
      out += plus_is_space && v[i] == '+' ? ' ' : v[i];
    }
  }
  return out;
}

}  // namespace

std::string dashboard_form_key(std::string_view body) {
  while (!body.empty()) {
    const size_t amp = body.find('&');
    const std::string_view pair = body.substr(0, amp);
    if (pair.starts_with("key=")) return percent_decode(pair.substr(4), true);
    if (amp == std::string_view::npos) break;
    body = body.substr(amp + 1);
  }
  return "";
}

std::string dashboard_cookie_key(std::string_view cookie_header) {
  while (!cookie_header.empty()) {
    const size_t semi = cookie_header.find(';');
    std::string_view c = cookie_header.substr(0, semi);
    while (!c.empty() && c.front() == ' ') c.remove_prefix(1);
    if (c.starts_with(k_cookie) && c.size() > k_cookie.size() && c[k_cookie.size()] == '=')
      return percent_decode(c.substr(k_cookie.size() + 1), false);
    if (semi == std::string_view::npos) break;
    cookie_header = cookie_header.substr(semi + 1);
  }
  return "";
}

std::string dashboard_set_cookie(std::string_view key) {
  std::string v;
  static const char* hex = "0123456789ABCDEF";
  for (unsigned char c : key) {
    if (unreserved(c)) {
      v += static_cast<char>(c);
    } else {
      v += '%';
      v += hex[c >> 4];
      v += hex[c & 15];
    }
  }
  // A session cookie (no Max-Age): gone when the browser closes. HttpOnly: no script reads it.
  // SameSite=Strict: no other site's page makes the browser send it.
  return std::string(k_cookie) + "=" + v + "; Path=/; HttpOnly; SameSite=Strict";
}

const std::string& dashboard_login_html() {
  static const std::string html = R"HTML(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Switchyard — sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { font-family: system-ui, sans-serif; margin: 4rem auto; max-width: 24rem; color: #222; }
  input, button { font: inherit; padding: .4rem; width: 100%; box-sizing: border-box; margin-top: .5rem; }
</style></head>
<body>
<h1>Switchyard dashboard</h1>
<p>Sign in with an admin API key. It is kept in a session cookie, never in the address.</p>
<form id="login" method="post" action="/dashboard/login">
  <input type="password" name="key" autocomplete="current-password" placeholder="admin API key" required>
  <button type="submit">Sign in</button>
</form>
<script>
"use strict";
// A key in the fragment (/dashboard#key=...) never reaches the server or its logs: it is posted
// like a typed one, then dropped from the address and the history.
(function () {
  if (!location.hash.startsWith("#key=")) return;
  const form = document.getElementById("login");
  form.elements.key.value = decodeURIComponent(location.hash.slice(5));
  history.replaceState(null, "", location.pathname);
  form.submit();
})();
</script>
</body></html>
)HTML";
  return html;
}

}  // namespace sy::router
