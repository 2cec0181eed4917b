// switchyard-router: the OpenAI-compatible front of a Switchyard cluster (DESIGN.md §1, §4).
//
//   switchyard-router --workers tcp://127.0.0.1:5555,tcp://127.0.0.1:5556 [--port 8000] ...
//   switchyard-router --workers-dns workers.switchyard.svc:5555     (re-resolved periodically)
#include <netdb.h>
#include <sys/resource.h>
#include <unistd.h>

#include <caf/all.hpp>
#include <csignal>
#include <cstdio>
#include <functional>
#include <set>
#include <thread>
#include <zmq.hpp>

#include "common/cli_args.hpp"
#include "router/actor_protocol.hpp"
#include "router/api_handler.hpp"
#include "router/dispatcher_actor.hpp"
#include "router/http_server.hpp"
#include "router/link_actor.hpp"

using namespace sy;
using namespace sy::router;

namespace {

const char* k_usage =
    "usage: switchyard-router (--workers tcp://HOST:PORT[,...] | --workers-dns NAME:PORT) [options]\n"
    "  --host H / --port P        HTTP listen address (127.0.0.1:8000)\n"
    "  --tenants FILE             API keys and limits (JSON); without it the router runs open\n"
    "  --http-threads N           I/O threads (2)\n"
    "  --dns-interval-s S         re-resolve --workers-dns every S seconds (10)\n"
    "  --max-queued-requests N    cluster queue cap (4096)      --max-queued-tokens N (4194304)\n"
    "  --local-queue N            requests per worker beyond its max running (2)\n"
    "  --heartbeat-timeout-ms MS  silence after which a worker is dead (2000)\n"
    "  --aging-s S                queue wait that promotes a request one class (10)\n"
    "  --request-timeout-s S      default deadline per request (600)\n"
    "  --max-n N                  choices per request (8)   --max-body-bytes N (4194304)\n"
    "  --router-id ID             name sent to workers in hello\n"
    "  --redis URL                response cache: redis://[user:pass@]host:port/db or unix:///path?db=N\n"
    "                             (without it the cache is off)\n"
    "  --cache-ttl-s S (3600)     --cache-max-entry-bytes N (1048576)   --cache-lookup-timeout-ms MS (5)\n"
    "  --cache-threads N (2)      --no-cache-seeded (cache only temperature-0 requests)\n";

// tcp://A:PORT for every IPv4/IPv6 address NAME resolves to (empty on failure).
std::set<std::string> resolve(const std::string& name_port) {
  std::set<std::string> out;
  const auto colon = name_port.rfind(':');
  if (colon == std::string::npos) return out;
  const std::string host = name_port.substr(0, colon), port = name_port.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return out;
  for (addrinfo* a = res; a; a = a->ai_next) {
    char ip[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, ip, sizeof ip, nullptr, 0, NI_NUMERICHOST) != 0) continue;
    const std::string addr = a->ai_family == AF_INET6 ? "[" + std::string(ip) + "]" : std::string(ip);
    out.insert("tcp://" + addr + ":" + port);
  }
  freeaddrinfo(res);
  return out;
}

int run(const cli_args& a) {
  a.check_known({"host",
                 "port",
                 "workers",
                 "workers-dns",
                 "dns-interval-s",
                 "tenants",
                 "http-threads",
                 "max-queued-requests",
                 "max-queued-tokens",
                 "local-queue",
                 "heartbeat-timeout-ms",
                 "aging-s",
                 "request-timeout-s",
                 "max-n",
                 "max-body-bytes",
                 "router-id",
                 "help",
                 "redis",
                 "cache-ttl-s",
                 "cache-max-entry-bytes",
                 "cache-lookup-timeout-ms",
                 "cache-threads",
                 "no-cache-seeded"});
  if (a.has("help") || (!a.has("workers") && !a.has("workers-dns"))) {
    std::fputs(k_usage, a.has("help") ? stdout : stderr);
    return a.has("help") ? 0 : 2;
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  // Thousands of client connections: raise the descriptor limit to what the system allows.
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }

  const tenant_registry tenants =
      a.has("tenants") ? tenant_registry::load_file(a.get("tenants")) : tenant_registry::open_access();
  if (tenants.is_open())
    std::fprintf(stderr, "switchyard-router: no --tenants file: running OPEN (any API key or none is accepted)\n");
  else
    std::fprintf(stderr, "switchyard-router: %zu tenants from %s\n", tenants.tenants().size(),
                 a.get("tenants").c_str());

  dispatcher_config dc;
  char host[256] = "router";
  gethostname(host, sizeof host - 1);
  dc.router_id = a.get("router-id", std::string(host) + "-" + std::to_string(::getpid()));
  dc.admission.max_queued_requests = static_cast<size_t>(a.get_int("max-queued-requests", 4096));
  dc.admission.max_queued_tokens = a.get_int("max-queued-tokens", 4 << 20);
  dc.pool.local_queue = static_cast<int32_t>(a.get_int("local-queue", 2));
  dc.pool.heartbeat_timeout_s = static_cast<double>(a.get_int("heartbeat-timeout-ms", 2000)) / 1000.0;
  dc.queue.aging_s = a.get_float("aging-s", 10.0);
  api_config ac;
  ac.default_timeout_s = a.get_float("request-timeout-s", 600.0);
  ac.limits.max_n = static_cast<int32_t>(a.get_int("max-n", 8));
  if (dc.pool.local_queue < 0 || dc.pool.heartbeat_timeout_s <= 0 || ac.default_timeout_s <= 0 || ac.limits.max_n < 1)
    throw std::invalid_argument("--local-queue must be >= 0; --heartbeat-timeout-ms, --request-timeout-s, --max-n > 0");

  std::unique_ptr<cache_service> cache;
  if (a.has("redis")) {
    cache_service_config cc;
    std::string err;
    auto rc = cache::redis_config::parse_url(a.get("redis"), &err);
    if (!rc) throw std::invalid_argument("--redis: " + err);
    cc.redis = *rc;
    cc.redis.command_timeout = std::chrono::milliseconds(a.get_int("cache-lookup-timeout-ms", 5));
    cc.policy.ttl = std::chrono::seconds(a.get_int("cache-ttl-s", 3600));
    cc.policy.max_entry_bytes = static_cast<size_t>(a.get_int("cache-max-entry-bytes", 1 << 20));
    cc.policy.cache_seeded_sampling = !a.has("no-cache-seeded");
    cc.threads = static_cast<int>(a.get_int("cache-threads", 2));
    for (const auto& t : tenants.tenants())
      if (t.cache_previews) cc.analytics.preview_tenants.insert(t.name);
    if (cc.policy.ttl.count() <= 0 || cc.threads < 1 || cc.redis.command_timeout.count() <= 0)
      throw std::invalid_argument("--cache-ttl-s, --cache-threads and --cache-lookup-timeout-ms must be positive");
    cache = std::make_unique<cache_service>(cc);
    std::fprintf(stderr, "switchyard-router: response cache on %s (TTL %llds, lookup timeout %lldms)\n",
                 a.get("redis").c_str(), static_cast<long long>(cc.policy.ttl.count()),
                 static_cast<long long>(cc.redis.command_timeout.count()));
  } else {
    std::fprintf(stderr, "switchyard-router: no --redis: response cache disabled\n");
  }

  model_registry models;
  auto status = std::make_shared<router_status>();
  auto d = std::make_shared<dispatcher>(dc, tenants, models, cache.get());

  zmq::context_t ctx(1);
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto disp = sys.spawn<caf::detached>(dispatcher_actor, &ctx, d, status);
  auto stop = std::make_shared<std::atomic<bool>>(false);
  auto link_counts = std::make_shared<link_counters>();
  auto link = sys.spawn<caf::detached>(link_actor, &ctx, link_config{}, disp, stop, link_counts);

  std::vector<std::string> static_workers;
  if (a.has("workers")) {
    std::string list = a.get("workers");
    for (size_t pos = 0; pos <= list.size();) {
      const size_t comma = std::min(list.find(',', pos), list.size());
      if (comma > pos) static_workers.push_back(list.substr(pos, comma - pos));
      pos = comma + 1;
    }
  }
  for (const auto& w : static_workers) caf::anon_send(disp, add_atom::value, w);

  // DNS discovery (a Kubernetes headless Service): new addresses join, vanished ones retire.
  auto stop_dns = std::make_shared<std::atomic<bool>>(false);
  std::thread dns;
  if (a.has("workers-dns")) {
    const std::string name = a.get("workers-dns");
    const double every_s = a.get_float("dns-interval-s", 10.0);
    dns = std::thread([name, every_s, disp, stop = stop_dns] {
      std::set<std::string> known;
      while (!stop->load()) {
        const auto now = resolve(name);
        if (!now.empty()) {
          for (const auto& e : now)
            if (!known.count(e)) caf::anon_send(disp, add_atom::value, e);
          for (const auto& e : known)
            if (!now.count(e)) caf::anon_send(disp, retire_atom::value, e);
          known = now;
        }
        for (int i = 0; i < static_cast<int>(every_s * 10) && !stop->load(); ++i)
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }

  http_server_config hc;
  hc.host = a.get("host", "127.0.0.1");
  hc.port = static_cast<int>(a.get_int("port", 8000));
  hc.threads = static_cast<int>(a.get_int("http-threads", 2));
  hc.max_body_bytes = static_cast<size_t>(a.get_int("max-body-bytes", 4 << 20));
  hc.on_written = [status](double s) {
    std::lock_guard<std::mutex> lk(status->mu);
    status->write_overhead_s.observe(s);
  };
  std::unique_ptr<http_server> server;
  std::unique_ptr<api_handler> handler;
  // From here on, however run() ends (a port that cannot be bound included), the server, the
  // actors and the threads stop, in an order where nothing calls into what is already gone:
  // the server's I/O threads first, then the DNS thread, then the dispatcher — before the link,
  // whose inbox it writes to: a send to an inproc socket whose reader has gone blocks forever —
  // then the link, then the cache threads (whose callbacks reach the handler).
  struct at_exit {
    std::function<void()> f;
    ~at_exit() { f(); }
  } shutdown{[&] {
    if (server) server->stop();
    stop_dns->store(true);
    if (dns.joinable()) dns.join();
    {
      caf::scoped_actor self{sys};
      self->send_exit(disp, caf::exit_reason::user_shutdown);
      self->wait_for(disp);
    }
    stop->store(true);
    sys.await_all_actors_done();
    cache.reset();
  }};
  auto submit = [disp](std::shared_ptr<routed_request> r) { caf::anon_send(disp, submit_atom::value, std::move(r)); };
  auto gone = [disp](uint64_t id) { caf::anon_send(disp, gone_atom::value, id); };
  // The server accepts at once; until the handler exists, requests get a 503.
  auto current = std::make_shared<std::atomic<api_handler*>>(nullptr);
  server = std::make_unique<http_server>(hc, [current](std::shared_ptr<http_exchange> ex, http_request&& req) {
    api_handler* h = current->load();
    if (!h) {
      ex->respond(
          {503,
           "application/json",
           {{"Retry-After", "1"}},
           R"({"error":{"message":"the router is starting","type":"overloaded_error","param":null,"code":"starting"}})"});
      return;
    }
    (*h)(std::move(ex), std::move(req));
  });
  handler = std::make_unique<api_handler>(ac, tenants, models, submit, gone, status, &server->counters(), cache.get());
  current->store(handler.get());
  std::fprintf(stderr, "switchyard-router: listening on http://%s:%d (%d I/O threads); workers: %s\n", hc.host.c_str(),
               server->port(), hc.threads,
               a.has("workers-dns") ? ("dns " + a.get("workers-dns")).c_str() : a.get("workers").c_str());

  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "switchyard-router: signal received, draining\n");
  caf::anon_send(disp, drain_atom::value);
  for (int i = 0; i < 300; ++i) {  // what runs may finish (30 s at most)
    {
      std::lock_guard<std::mutex> lk(status->mu);
      if (status->draining && status->active == 0) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return 0;  // `shutdown` stops everything
}

}  // namespace

int main(int argc, char** argv) {
  try {
    cli_args a(argc, argv, 1, {"help"});
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "switchyard-router: %s\n", e.what());
    return 1;
  }
}
