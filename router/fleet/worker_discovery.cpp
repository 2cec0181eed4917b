#include "router/fleet/worker_discovery.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>

#include <algorithm>
#include <charconv>
#include <fstream>

namespace sy::router {

std::set<std::string> next_worker_set(const std::set<std::string>& current, const lookup_result& r) {
  switch (r.status) {
    case lookup_status::found:
      return {r.endpoints.begin(), r.endpoints.end()};
    case lookup_status::not_found:
      return {};
    case lookup_status::temporary:
      break;
  }
  return current;
}

worker_set_change diff(const std::set<std::string>& before, const std::set<std::string>& after) {
  worker_set_change c;
  std::set_difference(after.begin(), after.end(), before.begin(), before.end(), std::back_inserter(c.joined));
  std::set_difference(before.begin(), before.end(), after.begin(), after.end(), std::back_inserter(c.left));
  return c;
}

lookup_status classify_gai_error(int code) {
  if (code == EAI_NONAME) return lookup_status::not_found;
#ifdef EAI_NODATA
  if (code == EAI_NODATA) return lookup_status::not_found;  // the name exists, without addresses
#endif
#ifdef EAI_ADDRFAMILY
  if (code == EAI_ADDRFAMILY) return lookup_status::not_found;  // none of the family asked for
#endif
  return lookup_status::temporary;
}

std::string endpoint_of(const sockaddr* addr, const std::string& port) {
  char ip[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(addr)->sin_addr, ip, sizeof ip);
    return "tcp://" + std::string(ip) + ":" + port;
  }
  if (addr->sa_family == AF_INET6) {
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr, ip, sizeof ip);
    return "tcp://[" + std::string(ip) + "]:" + port;
  }
  return {};
}

bool split_name_port(const std::string& name_port, std::string& name, std::string& port) {
  const auto colon = name_port.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  name = name_port.substr(0, colon);
  port = name_port.substr(colon + 1);
  if (name.size() > 2 && name.front() == '[' && name.back() == ']') name = name.substr(1, name.size() - 2);
  int n = 0;
  const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), n);
  return ec == std::errc{} && end == port.data() + port.size() && n >= 1 && n <= 65535;
}

lookup_result resolve_workers(const std::string& name_port, int family) {
  lookup_result r;
  std::string name, port;
  if (!split_name_port(name_port, name, port)) {
    r.error = "not NAME:PORT: " + name_port;
    return r;
  }
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_STREAM;  // one entry per address, not one per socket type
  addrinfo* res = nullptr;
  if (const int rc = getaddrinfo(name.c_str(), port.c_str(), &hints, &res); rc != 0) {
    r.status = classify_gai_error(rc);
    r.error = gai_strerror(rc);
    return r;
  }
  for (const addrinfo* a = res; a; a = a->ai_next)
    if (a->ai_family == family)
      if (std::string e = endpoint_of(a->ai_addr, port); !e.empty()) r.endpoints.push_back(std::move(e));
  freeaddrinfo(res);
  r.status = r.endpoints.empty() ? lookup_status::not_found : lookup_status::found;
  if (r.endpoints.empty()) r.error = "no address of the family asked for";
  return r;
}

lookup_result read_workers_file(const std::string& path) {
  lookup_result r;
  std::ifstream in(path);
  if (!in) {
    r.error = "cannot read " + path;
    return r;
  }
  std::string line;
  while (std::getline(in, line)) {
    line = line.substr(0, line.find('#'));
    const auto b = line.find_first_not_of(" \t\r");
    if (b == std::string::npos) continue;
    const auto e = line.find_last_not_of(" \t\r");
    r.endpoints.push_back(line.substr(b, e - b + 1));
  }
  if (in.bad()) {
    r.endpoints.clear();
    r.error = "error reading " + path;
    return r;
  }
  r.status = r.endpoints.empty() ? lookup_status::not_found : lookup_status::found;
  if (r.endpoints.empty()) r.error = "it lists no worker";
  return r;
}

worker_discovery::update worker_discovery::apply(const lookup_result& r) {
  update u;
  std::set<std::string> next = next_worker_set(current_, r);
  u.change = diff(current_, next);
  const bool news = first_ || r.status != last_;
  if (news || !u.change.joined.empty() || !u.change.left.empty()) {
    switch (r.status) {
      case lookup_status::found:
        u.log = what_ + ": " + std::to_string(next.size()) + " workers (" + std::to_string(u.change.joined.size()) +
                " new, " + std::to_string(u.change.left.size()) + " gone)";
        break;
      case lookup_status::not_found:
        u.log = what_ + ": no workers (" + r.error + ")" +
                (u.change.left.empty() ? "" : ": retiring all " + std::to_string(u.change.left.size()));
        break;
      case lookup_status::temporary:
        u.log = what_ + ": lookup failed (" + r.error + "): keeping the " + std::to_string(current_.size()) +
                " workers known";
        break;
    }
  }
  first_ = false;
  last_ = r.status;
  current_ = std::move(next);
  return u;
}

}  // namespace sy::router
