#include "router/http/dashboard.hpp"

#include <cctype>
#include <fstream>
#include <sstream>

#include "router/http/dashboard_assets.hpp"

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
  static const std::string html(assets::dashboard_html);
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
  static const std::string html(assets::dashboard_login_html);
  return html;
}

}  // namespace sy::router
