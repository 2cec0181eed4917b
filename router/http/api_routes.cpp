#include "router/http/api_routes.hpp"

namespace sy::router {
namespace {

// The first segment of `s` (which starts after a '/'), and the rest after its '/'.
std::string_view next_segment(std::string_view& s) {
  const size_t slash = s.find('/');
  const std::string_view seg = s.substr(0, slash);
  s = slash == std::string_view::npos ? std::string_view() : s.substr(slash + 1);
  return seg;
}

}  // namespace

bool path_matches(std::string_view pattern, std::string_view path) {
  if (pattern.empty() || path.empty() || pattern[0] != '/' || path[0] != '/') return false;
  pattern.remove_prefix(1);
  path.remove_prefix(1);
  bool path_done = false;
  while (!pattern.empty()) {
    const std::string_view want = next_segment(pattern);
    if (path_done) return false;
    const bool path_last = path.find('/') == std::string_view::npos;
    if (want.size() > 3 && want.front() == '{' && want.ends_with("*}")) {  // the rest of the path
      return pattern.empty() && !path.empty() && path.front() != '/';
    }
    const std::string_view got = next_segment(path);
    if (want.size() > 2 && want.front() == '{' && want.back() == '}') {
      if (got.empty()) return false;
    } else if (want != got) {
      return false;
    }
    path_done = path_last;
  }
  return path_done;
}

route_match match_route(std::span<const route> table, std::string_view method, std::string_view path) {
  route_match m;
  for (const route& r : table) {
    if (!path_matches(r.pattern, path)) continue;
    if (m.allow.empty()) m.family = r.family;
    if (r.method == method && !m.found) {
      m.found = &r;
      m.family = r.family;
    }
    if (m.allow.find(r.method) == std::string::npos) m.allow += (m.allow.empty() ? "" : ", ") + std::string(r.method);
  }
  return m;
}

}  // namespace sy::router
