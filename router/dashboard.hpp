// GET /dashboard: the cache-hit analysis page (one HTML document; its script fetches
// /v1/cache/stats with the admin key from the page's address and draws with Chart.js, served
// locally from Debian's libjs-chart.js at /dashboard/chart.js — no CDN).
#pragma once

#include <string>

namespace sy::router {

const std::string& dashboard_html();
// Chart.js from libjs-chart.js, read once; empty when the package is not installed.
const std::string& chart_js();

}  // namespace sy::router
