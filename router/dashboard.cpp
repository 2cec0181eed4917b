#include "router/dashboard.hpp"

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

const std::string& dashboard_html() {
  static const std::string html = R"HTML(<!doctype html>
<html><head><meta charset="utf-8"><title>Switchyard cache</title>
<script src="/dashboard/chart.js"></script></head>
<body>
<h1>Response cache</h1>
<p>Hit rate: <span id="hit-rate">…</span></p>
<canvas id="rate"></canvas>
<script>
const key = new URLSearchParams(location.search).get("key") || "";
async function refresh() {
  const r = await fetch("/v1/cache/stats", {headers: {"Authorization": "Bearer " + key}});
  const s = await r.json();
  const t = s.totals || {};
  document.getElementById("hit-rate").textContent = ((t.hit_rate || 0) * 100).toFixed(1) + " %";
}
refresh();
setInterval(refresh, 5000);
</script></body></html>
)HTML";
  return html;
}

}  // namespace sy::router
