// Worker discovery (docs/router.md, "Pods (Kubernetes)"): which workers a router should use, from a
// DNS name (a Kubernetes headless Service: one address per ready pod) or a file of endpoints,
// looked up again every few seconds. The lookups block (getaddrinfo, file reads) and run on
// main.cpp's discovery thread; what to make of an answer is a pure function, tested without DNS.
//
// Outcomes:
//   found      the answer's endpoints, de-duplicated, are the new set: new ones join, missing
//              ones retire (they finish what they run, then the router drops them);
//   not_found  the name does not exist, or has no address of the family asked for (NXDOMAIN,
//              NODATA: every pod unready, or the Service deleted) — or the workers file lists
//              none: every worker retires;
//   temporary  the lookup failed (EAI_AGAIN: timeout or server failure; an unreadable file):
//              the current set is kept, nothing changes until an answer comes.
#pragma once

#include <sys/socket.h>
#include <set>
#include <string>
#include <vector>

namespace sy::router {

enum class lookup_status { found, not_found, temporary };

struct lookup_result {
  lookup_status status = lookup_status::temporary;
  std::vector<std::string> endpoints;  // found: tcp://HOST:PORT, possibly repeated
  std::string error;                   // not_found / temporary: what the resolver said
};

// The worker set after a lookup, given the set before it.
std::set<std::string> next_worker_set(const std::set<std::string>& current, const lookup_result& r);

struct worker_set_change {
  std::vector<std::string> joined, left;  // sorted
};
worker_set_change diff(const std::set<std::string>& before, const std::set<std::string>& after);

// getaddrinfo's answer code as an outcome: EAI_NONAME, EAI_NODATA and EAI_ADDRFAMILY are
// not_found, everything else (EAI_AGAIN, EAI_FAIL, EAI_MEMORY, EAI_SYSTEM ...) temporary.
lookup_status classify_gai_error(int code);

// "tcp://1.2.3.4:PORT" or "tcp://[fd00::1]:PORT" for an AF_INET / AF_INET6 address; empty for
// another family.
std::string endpoint_of(const sockaddr* addr, const std::string& port);

// Splits "NAME:PORT" (the port after the last colon; NAME may be a bracketed IPv6 literal);
// false when there is no port or it is not a number in 1..65535.
bool split_name_port(const std::string& name_port, std::string& name, std::string& port);

// Resolves NAME:PORT to endpoints of one address family (AF_INET or AF_INET6). Blocks.
lookup_result resolve_workers(const std::string& name_port, int family);

// Reads endpoints from a file, one per line ('#' starts a comment, blank lines skipped): an
// unreadable file is temporary, one that lists nothing is not_found. Blocks.
lookup_result read_workers_file(const std::string& path);

// One discovery source followed across lookups: the current set, and a line to log when the
// kind of outcome changes (a failure is reported once, not every interval, and so is its end).
class worker_discovery {
 public:
  explicit worker_discovery(std::string what) : what_(std::move(what)) {}

  struct update {
    worker_set_change change;
    std::string log;  // empty: nothing new to say
  };
  update apply(const lookup_result& r);
  const std::set<std::string>& current() const { return current_; }

 private:
  std::string what_;  // "DNS name workers.ns.svc:5555", "workers file /etc/..."
  std::set<std::string> current_;
  lookup_status last_ = lookup_status::found;
  bool first_ = true;
};

}  // namespace sy::router
