// Worker discovery without DNS: what a lookup outcome makes of the current set (NXDOMAIN retires
// everyone, a temporary failure keeps them, duplicates collapse), endpoints of IPv4 and IPv6
// addresses, getaddrinfo's codes, the workers file, and what is logged across lookups.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "router/fleet/worker_discovery.hpp"

using namespace sy::router;
using set = std::set<std::string>;
using list = std::vector<std::string>;

namespace {

lookup_result found(list endpoints) { return {lookup_status::found, std::move(endpoints), ""}; }
lookup_result not_found() { return {lookup_status::not_found, {}, "Name or service not known"}; }
lookup_result temporary() { return {lookup_status::temporary, {}, "Temporary failure in name resolution"}; }

}  // namespace

TEST_CASE("discovery: an answer replaces the set, duplicates collapse") {
  const set before{"tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"};
  const auto after =
      next_worker_set(before, found({"tcp://10.0.0.2:5555", "tcp://10.0.0.3:5555", "tcp://10.0.0.3:5555"}));
  CHECK(after == set{"tcp://10.0.0.2:5555", "tcp://10.0.0.3:5555"});
  const auto d = diff(before, after);
  CHECK(d.joined == list{"tcp://10.0.0.3:5555"});
  CHECK(d.left == list{"tcp://10.0.0.1:5555"});
}

TEST_CASE("discovery: a name that does not exist retires every worker, a temporary failure keeps them") {
  const set before{"tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"};
  CHECK(next_worker_set(before, not_found()).empty());
  CHECK(diff(before, next_worker_set(before, not_found())).left == list(before.begin(), before.end()));
  CHECK(next_worker_set(before, temporary()) == before);
  CHECK(diff(before, next_worker_set(before, temporary())).left.empty());
  CHECK(next_worker_set({}, temporary()).empty());
}

TEST_CASE("discovery: getaddrinfo codes: no such name or no address of the family is not_found, the rest temporary") {
  CHECK(classify_gai_error(EAI_NONAME) == lookup_status::not_found);
#ifdef EAI_NODATA
  CHECK(classify_gai_error(EAI_NODATA) == lookup_status::not_found);
#endif
#ifdef EAI_ADDRFAMILY
  CHECK(classify_gai_error(EAI_ADDRFAMILY) == lookup_status::not_found);
#endif
  CHECK(classify_gai_error(EAI_AGAIN) == lookup_status::temporary);
  CHECK(classify_gai_error(EAI_FAIL) == lookup_status::temporary);
  CHECK(classify_gai_error(EAI_MEMORY) == lookup_status::temporary);
  CHECK(classify_gai_error(EAI_SYSTEM) == lookup_status::temporary);
}

TEST_CASE("discovery: endpoints of IPv4 and IPv6 addresses - NAME:PORT parsing") {
  sockaddr_in v4{};
  v4.sin_family = AF_INET;
  REQUIRE(inet_pton(AF_INET, "10.1.2.3", &v4.sin_addr) == 1);
  CHECK(endpoint_of(reinterpret_cast<const sockaddr*>(&v4), "5555") == "tcp://10.1.2.3:5555");
  sockaddr_in6 v6{};
  v6.sin6_family = AF_INET6;
  REQUIRE(inet_pton(AF_INET6, "fd00::a:1", &v6.sin6_addr) == 1);
  CHECK(endpoint_of(reinterpret_cast<const sockaddr*>(&v6), "5555") == "tcp://[fd00::a:1]:5555");
  sockaddr other{};
  other.sa_family = AF_UNIX;
  CHECK(endpoint_of(&other, "5555").empty());

  std::string name, port;
  CHECK(split_name_port("workers.ns.svc.cluster.local:5555", name, port));
  CHECK(name == "workers.ns.svc.cluster.local");
  CHECK(port == "5555");
  CHECK(split_name_port("[fd00::1]:5555", name, port));
  CHECK(name == "fd00::1");
  CHECK_FALSE(split_name_port("workers", name, port));
  CHECK_FALSE(split_name_port("workers:", name, port));
  CHECK_FALSE(split_name_port("workers:http", name, port));
  CHECK_FALSE(split_name_port("workers:70000", name, port));
  CHECK_FALSE(split_name_port(":5555", name, port));
}

TEST_CASE("discovery: resolving a numeric address gives one endpoint of the family asked for") {
  // Numeric hosts need no DNS server (getaddrinfo parses them).
  auto r = resolve_workers("127.0.0.1:5555", AF_INET);
  CHECK(r.status == lookup_status::found);
  CHECK(r.endpoints == list{"tcp://127.0.0.1:5555"});  // one entry, not one per socket type
  r = resolve_workers("[::1]:5555", AF_INET6);
  CHECK(r.status == lookup_status::found);
  CHECK(r.endpoints == list{"tcp://[::1]:5555"});
  r = resolve_workers("127.0.0.1:5555", AF_INET6);  // an IPv4 literal has no IPv6 address
  CHECK(r.status == lookup_status::not_found);
  CHECK(r.endpoints.empty());
  CHECK(resolve_workers("no-port", AF_INET).status == lookup_status::temporary);
}

TEST_CASE("discovery: the workers file: one endpoint a line, comments - empty lists none, missing is temporary") {
  const std::string path = "/tmp/switchyard-test-workers-" + std::to_string(::getpid());
  struct remove_at_end {
    std::string path;
    ~remove_at_end() { std::remove(path.c_str()); }
  } cleanup{path};
  std::ofstream(path)
      << "# workers\ntcp://10.0.0.1:5555\n\n  tcp://10.0.0.2:5555  # the second\r\ntcp://10.0.0.1:5555\n";
  auto r = read_workers_file(path);
  CHECK(r.status == lookup_status::found);
  CHECK(r.endpoints == list{"tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555", "tcp://10.0.0.1:5555"});
  CHECK(next_worker_set({}, r) == set{"tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"});
  std::ofstream(path) << "# nobody\n\n";
  CHECK(read_workers_file(path).status == lookup_status::not_found);
  std::remove(path.c_str());
  CHECK(read_workers_file(path).status == lookup_status::temporary);
}

TEST_CASE("discovery: a source followed across lookups says what changed, and a failure once") {
  worker_discovery d("DNS name w:5555");
  auto u = d.apply(found({"tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"}));
  CHECK(u.change.joined == list{"tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"});
  CHECK(u.log == "DNS name w:5555: 2 workers (2 new, 0 gone)");
  u = d.apply(found({"tcp://10.0.0.2:5555", "tcp://10.0.0.1:5555"}));  // same set
  CHECK(u.change.joined.empty());
  CHECK(u.change.left.empty());
  CHECK(u.log.empty());

  u = d.apply(temporary());
  CHECK(u.change.left.empty());
  CHECK(u.log == "DNS name w:5555: lookup failed (Temporary failure in name resolution): keeping the 2 workers known");
  CHECK(d.apply(temporary()).log.empty());  // said once
  CHECK(d.current().size() == 2);

  u = d.apply(not_found());
  CHECK(u.change.left == list{"tcp://10.0.0.1:5555", "tcp://10.0.0.2:5555"});
  CHECK(u.log == "DNS name w:5555: no workers (Name or service not known): retiring all 2");
  CHECK(d.apply(not_found()).log.empty());
  CHECK(d.current().empty());

  u = d.apply(found({"tcp://10.0.0.3:5555"}));
  CHECK(u.change.joined == list{"tcp://10.0.0.3:5555"});
  CHECK(u.log == "DNS name w:5555: 1 workers (1 new, 0 gone)");
}
