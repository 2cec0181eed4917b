// GET /dashboard: the cache-hit analysis page (one HTML document; its script fetches
// /v1/cache/stats and /metrics and draws with Chart.js, served locally from Debian's
// libjs-chart.js at /dashboard/chart.js — no CDN).
//
// Signing in: without a key, /dashboard answers 401 with a form that posts the admin key to
// /dashboard/login, which sets it in an HttpOnly, SameSite=Strict session cookie and redirects
// back. The key never travels in a URL (addresses end up in logs, history and Referer headers).
#pragma once

#include <string>
#include <string_view>

namespace sy::router {

const std::string& dashboard_html();
// Chart.js from libjs-chart.js, read once; empty when the package is not installed.
const std::string& chart_js();

// The sign-in page (served with 401): a form posting `key` to /dashboard/login.
const std::string& dashboard_login_html();
// The `key` field of a form body (application/x-www-form-urlencoded); "" when absent.
std::string dashboard_form_key(std::string_view body);
// The key in a Cookie header's dashboard cookie; "" when absent.
std::string dashboard_cookie_key(std::string_view cookie_header);
// The Set-Cookie value that keeps `key` for the browser session.
std::string dashboard_set_cookie(std::string_view key);

}  // namespace sy::router
