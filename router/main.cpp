// switchyard-router: the OpenAI-compatible front of a Switchyard cluster (docs/router.md).
//
//   switchyard-router --workers tcp://127.0.0.1:5555,tcp://127.0.0.1:5556 [--port 8000] ...
//   switchyard-router --workers-dns workers.switchyard.svc:5555     (re-resolved periodically)
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <caf/all.hpp>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <thread>
#include <zmq.hpp>

#include "cache/entry_mac.hpp"
#include "common/cli_args.hpp"
#include "common/stop_signals.hpp"
#include "common/wire/curve_keys.hpp"
#include "common/wire/protocol.hpp"
#include "common/wire/published_secrets.hpp"
#include "router/dispatch/actor_protocol.hpp"
#include "router/dispatch/dispatcher_actor.hpp"
#include "router/fleet/link_actor.hpp"
#include "router/fleet/worker_discovery.hpp"
#include "router/http/api_handler.hpp"
#include "router/http/http_server.hpp"
#include "router/openai/openai_request.hpp"

using namespace sy;
using namespace sy::router;

namespace {

const char* k_usage =
    "usage: switchyard-router [--workers tcp://HOST:PORT[,...]] [--workers-dns NAME:PORT | --workers-file F]\n"
    "                         [options]                  (at least one source of workers)\n"
    "  --host H / --port P        HTTP listen address (127.0.0.1:8000)\n"
    "  --tenants FILE             API keys and limits (JSON); without it the router runs open\n"
    "  --allow-example-keys       start although an API, CURVE or cache MAC key is one published with\n"
    "                             Switchyard (a demo nobody else can reach; refused otherwise)\n"
    "  --router-replicas N        this router is one of N behind one Service: tenant limits divided by N (1)\n"
    "  --http-threads N           I/O threads (2)\n"
    "  --prep-threads N           threads that parse, template and tokenize request bodies (2)\n"
    "  --prep-queue N             bodies waiting for them; beyond, 503 router_busy (4096)\n"
    "  --prep-queue-bytes N       bytes of the bodies waiting or being prepared; beyond, 503 (67108864)\n"
    "  --metrics-port P           also serve GET /metrics on this port, without a key (for the scraper;\n"
    "                             on the API port /metrics needs an admin key when --tenants is given)\n"
    "  --metrics-host H           its address (127.0.0.1)\n"
    "  --workers-dns NAME:PORT    workers are the addresses NAME resolves to (a headless Service)\n"
    "  --dns-family 4|6           resolve IPv4 (A) or IPv6 (AAAA) addresses only (4)\n"
    "  --workers-file FILE        workers are the endpoints FILE lists, one per line\n"
    "  --dns-interval-s S         look --workers-dns / --workers-file up again every S seconds (10)\n"
    "  --shutdown-delay-s S       after SIGTERM, /ready says 503 but requests are admitted S more seconds (0)\n"
    "  --drain-timeout-s S        then what runs may finish for at most S seconds (30)\n"
    "  --max-queued-requests N    cluster queue cap (4096)      --max-queued-tokens N (4194304)\n"
    "  --local-queue N            requests per worker beyond its max running (2)\n"
    "  --heartbeat-timeout-ms MS  silence after which a worker is dead (2000)\n"
    "  --max-attempts N           dispatches per request when workers fail it (2; 1: no retries)\n"
    "  --no-worker-timeout-s S    a model without a ready worker this long: its queued requests end and new\n"
    "                             ones are refused at once with 503 no_workers (10)\n"
    "  --try-idle-timeout-s S     a started stream silent this long while its worker heartbeats resumes from\n"
    "                             what the router has (60; 0: off)\n"
    "  --queue-timeout-s S        a request still in the router's queue after S s ends with 408 queue_timeout\n"
    "                             (0: off; a tenant's \"queue_timeout_s\" overrides it, a request's\n"
    "                             \"queue_timeout\" may shorten it)\n"
    "  --query-of-death-ttl-s S   a prompt that took down --max-attempts workers is refused (400) this long (600)\n"
    "  --retry-budget-percent P   retries allowed per 100 requests, over 10 s (20)   --retry-budget-min N (10)\n"
    "  --eject-after-failures K   eject a worker after K worker errors in a row (5; 0: never)\n"
    "  --eject-base-s S           first ejection S seconds, then 2S, 3S, ... (30)   --eject-max-s S (300)\n"
    "  --max-ejected-percent P    at most P % of a model's workers ejected at once (50)\n"
    "  --aging-s S                queue wait that promotes a request one class (10)\n"
    "  --request-timeout-s S      default deadline per request (600)\n"
    "  --max-request-timeout-s S  a client's \"timeout\" is clamped to S (3600)\n"
    "  --max-n N                  choices per request (8)   --max-body-bytes N (4194304)\n"
    "  --max-connections-per-address N  open connections from one client IP; beyond, closed at\n"
    "                             once (2048; 0: no cap; behind an ingress all clients share its IP)\n"
    "  --max-inflight-body-bytes N  request bodies being read at once; beyond, 503 router_busy\n"
    "                             from the header (268435456; 0: no budget)\n"
    "  --write-stall-timeout-s S  close a response none of whose pending bytes reached the client for S\n"
    "                             seconds (the request is cancelled, its KV freed; 30; 0: never)\n"
    "  --max-stream-buffer-bytes N  a stream's bytes queued in the router beyond the socket (1048576)\n"
    "  --link-backlog N           frames per worker waiting for its connection; beyond, the oldest drop (100000)\n"
    "  --router-id ID             name sent to workers in hello\n"
    "  --no-kv-events             do not ask workers for their KV block events: route on this router's own\n"
    "                             dispatch history (what routers did before; for comparisons)\n"
    "  --served-model-name NAME=MODEL   NAME answers for the model MODEL serves (repeatable; workers'\n"
    "                             own --served-model-name reach every router by themselves)\n"
    "  --reasoning-parser auto|deepseek_r1|qwen3|none  split <think>...</think> off chat answers into\n"
    "                             reasoning_content (auto: models whose chat template mentions <think>\n"
    "                             or </think>)\n"
    "  --redis URL                response cache: redis://[user:pass@]host:port/db or unix:///path?db=N\n"
    "                             (without it the cache is off)\n"
    "  --cache-ttl-s S (3600)     --cache-max-entry-bytes N (1048576)   --cache-lookup-timeout-ms MS (5)\n"
    "  --cache-threads N (2)      --no-cache-seeded (cache only temperature-0 requests)\n"
    "  --cache-store-timeout-ms MS (100)  stores and analytics events, on a connection of their own\n"
    "  --responses-ttl-s S        how long /v1/responses keeps a stored response in Redis (86400)\n"
    "  --cache-mac-key-file FILE  seal cache entries with HMAC-SHA256 under FILE's bytes (>= 16): an entry\n"
    "                             written or moved by anyone without the key reads as a miss\n"
    "  --curve-server-key FILE    authenticate and encrypt the worker link (CURVE): the workers' public key\n"
    "  --curve-secret-key FILE    this router's secret key (else a new pair each start; needed when workers\n"
    "                             admit listed routers only). Keys: switchyard-worker keygen --out PREFIX\n"
    "  --otlp-endpoint URL        export request spans over OTLP/HTTP JSON to URL (plain http only, e.g.\n"
    "                             http://127.0.0.1:4318/v1/traces); takes traceparent in, starts traces\n"
    "  --otlp-service-name NAME   the spans' service.name (switchyard-router)\n"
    "  --otlp-sample-ratio R      share of the traces the router starts that are exported (1.0)\n";

// The cache MAC key: the bytes of a secret file (a trailing newline dropped).
std::string read_cache_mac_key(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::invalid_argument("--cache-mac-key-file: cannot read " + path);
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  if (s.size() < cache::k_min_mac_key_bytes)
    throw std::invalid_argument("--cache-mac-key-file: " + path + " holds fewer than " +
                                std::to_string(cache::k_min_mac_key_bytes) + " bytes");
  return s;
}

// Unknown flags are refused (a typo must not pass for a default).
void check_flags(const cli_args& a) {
  a.check_known({"host",
                 "port",
                 "workers",
                 "workers-dns",
                 "workers-file",
                 "dns-family",
                 "dns-interval-s",
                 "shutdown-delay-s",
                 "drain-timeout-s",
                 "tenants",
                 "router-replicas",
                 "http-threads",
                 "prep-threads",
                 "prep-queue",
                 "prep-queue-bytes",
                 "max-queued-requests",
                 "max-queued-tokens",
                 "local-queue",
                 "max-attempts",
                 "no-worker-timeout-s",
                 "try-idle-timeout-s",
                 "queue-timeout-s",
                 "query-of-death-ttl-s",
                 "retry-budget-percent",
                 "retry-budget-min",
                 "eject-after-failures",
                 "eject-base-s",
                 "eject-max-s",
                 "max-ejected-percent",
                 "heartbeat-timeout-ms",
                 "aging-s",
                 "request-timeout-s",
                 "max-request-timeout-s",
                 "max-n",
                 "max-body-bytes",
                 "max-connections-per-address",
                 "max-inflight-body-bytes",
                 "link-backlog",
                 "write-stall-timeout-s",
                 "max-stream-buffer-bytes",
                 "router-id",
                 "served-model-name",
                 "reasoning-parser",
                 "help",
                 "redis",
                 "cache-ttl-s",
                 "responses-ttl-s",
                 "cache-max-entry-bytes",
                 "cache-lookup-timeout-ms",
                 "cache-threads",
                 "cache-store-timeout-ms",
                 "no-cache-seeded",
                 "no-kv-events",
                 "allow-example-keys",
                 "curve-server-key",
                 "curve-secret-key",
                 "cache-mac-key-file",
                 "metrics-host",
                 "metrics-port",
                 "otlp-endpoint",
                 "otlp-service-name",
                 "otlp-sample-ratio"});
}

// Thousands of client connections: raise the descriptor limit to what the system allows.
void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

tenant_registry load_tenants(const cli_args& a) {
  tenant_registry tenants =
      a.has("tenants") ? tenant_registry::load_file(a.get("tenants")) : tenant_registry::open_access();
  if (tenants.is_open())
    std::fprintf(stderr, "switchyard-router: no --tenants file: running OPEN (any API key or none is accepted)\n");
  else
    std::fprintf(stderr, "switchyard-router: %zu tenants from %s\n", tenants.tenants().size(),
                 a.get("tenants").c_str());
  tenants.for_each_key([&](std::string_view key, const tenant& t) {
    refuse_published(key, "--tenants " + a.get("tenants") + ": the key of tenant '" + t.name + "'",
                     a.has("allow-example-keys"));
  });
  const long long replicas = a.get_int("router-replicas", 1);
  if (replicas < 1) throw std::invalid_argument("--router-replicas must be >= 1");
  if (replicas > 1) {
    tenants.share_limits_among(static_cast<int>(replicas));
    std::fprintf(stderr, "switchyard-router: one of %lld routers: each tenant's limits divided by %lld here\n",
                 replicas, replicas);
  }
  return tenants;
}

// The cluster queue, dispatch, retries and worker health (docs/reliability.md).
dispatcher_config dispatcher_flags(const cli_args& a) {
  dispatcher_config dc;
  char host[256] = "router";
  gethostname(host, sizeof host - 1);
  dc.router_id = a.get("router-id", std::string(host) + "-" + std::to_string(::getpid()));
  dc.admission.max_queued_requests = static_cast<size_t>(a.get_int("max-queued-requests", 4096));
  dc.admission.max_queued_tokens = a.get_int("max-queued-tokens", 4 << 20);
  dc.pool.local_queue = static_cast<int32_t>(a.get_int("local-queue", 2));
  dc.pool.heartbeat_timeout_s = static_cast<double>(a.get_int("heartbeat-timeout-ms", 2000)) / 1000.0;
  dc.pool.dead_grace_s = 2 * dc.pool.heartbeat_timeout_s;
  // Its own loop's stalls are told from its workers' silence (dispatcher.hpp): a tick every
  // 100 ms, so a gap of a quarter of the heartbeat timeout is this router's, not theirs.
  dc.stall_threshold_s = dc.pool.heartbeat_timeout_s / 4;
  dc.no_worker_timeout_s = a.get_float("no-worker-timeout-s", 10.0);
  dc.try_idle_timeout_s = a.get_float("try-idle-timeout-s", 60.0);
  dc.query_of_death_ttl_s = a.get_float("query-of-death-ttl-s", 600.0);
  dc.queue_timeout_s = a.get_float("queue-timeout-s", 0.0);
  dc.kv_events = !a.has("no-kv-events");
  // Bad workers (docs/reliability.md): bounded retries, the retry budget, outlier ejection.
  dc.max_attempts = static_cast<uint32_t>(std::max<int64_t>(1, a.get_int("max-attempts", 2)));
  dc.retry.ratio = a.get_float("retry-budget-percent", 20.0) / 100.0;
  dc.retry.min_retries = static_cast<uint32_t>(std::max<int64_t>(0, a.get_int("retry-budget-min", 10)));
  dc.pool.eject_after_failures = static_cast<int32_t>(a.get_int("eject-after-failures", 5));
  dc.pool.eject_base_s = a.get_float("eject-base-s", 30.0);
  dc.pool.eject_max_s = a.get_float("eject-max-s", 300.0);
  dc.pool.max_ejected_percent = static_cast<int32_t>(a.get_int("max-ejected-percent", 50));
  if (a.get_int("max-attempts", 2) < 1 || dc.retry.ratio < 0 || dc.pool.eject_after_failures < 0 ||
      dc.pool.eject_base_s <= 0 || dc.pool.eject_max_s < dc.pool.eject_base_s || dc.pool.max_ejected_percent < 0 ||
      dc.pool.max_ejected_percent > 100)
    throw std::invalid_argument(
        "--max-attempts must be >= 1; --retry-budget-percent, --eject-after-failures >= 0; "
        "0 < --eject-base-s <= --eject-max-s; --max-ejected-percent in [0, 100]");
  dc.queue.aging_s = a.get_float("aging-s", 10.0);
  if (dc.pool.local_queue < 0 || dc.pool.heartbeat_timeout_s <= 0 || dc.no_worker_timeout_s < 0 ||
      dc.try_idle_timeout_s < 0 || dc.query_of_death_ttl_s < 0 || !(dc.queue_timeout_s >= 0))
    throw std::invalid_argument(
        "--local-queue, --no-worker-timeout-s, --try-idle-timeout-s, --query-of-death-ttl-s, --queue-timeout-s must "
        "be >= 0; "
        "--heartbeat-timeout-ms > 0");
  return dc;
}

// --otlp-endpoint: the span exporter (docs/router.md, "Tracing"); null without the flag.
std::unique_ptr<otlp_exporter> make_tracer(const cli_args& a) {
  const double ratio = a.get_float("otlp-sample-ratio", 1.0);
  if (!(ratio >= 0.0 && ratio <= 1.0)) throw std::invalid_argument("--otlp-sample-ratio must be in [0, 1]");
  if (!a.has("otlp-endpoint")) return nullptr;
  otlp_exporter_config c;
  c.endpoint = a.get("otlp-endpoint");
  c.service_name = a.get("otlp-service-name", "switchyard-router");
  check_otlp_endpoint(c.endpoint);
  std::fprintf(stderr, "switchyard-router: exporting spans to %s as %s\n", c.endpoint.c_str(), c.service_name.c_str());
  return std::make_unique<otlp_exporter>(c);
}

api_config api_flags(const cli_args& a) {
  api_config ac;
  ac.default_timeout_s = a.get_float("request-timeout-s", 600.0);
  ac.limits.max_n = static_cast<int32_t>(a.get_int("max-n", 8));
  if (!parse_reasoning_parser(a.get("reasoning-parser", "auto"), ac.reasoning))
    throw std::invalid_argument("--reasoning-parser must be auto, deepseek_r1, qwen3 or none");
  ac.max_timeout_s = a.get_float("max-request-timeout-s", std::max(3600.0, ac.default_timeout_s));
  if (!(ac.max_timeout_s >= ac.default_timeout_s))
    throw std::invalid_argument("--max-request-timeout-s must be >= --request-timeout-s");
  if (ac.default_timeout_s <= 0 || ac.limits.max_n < 1)
    throw std::invalid_argument("--request-timeout-s, --max-n must be > 0");
  ac.responses_ttl = std::chrono::seconds(a.get_int("responses-ttl-s", 86400));
  if (ac.responses_ttl.count() <= 0) throw std::invalid_argument("--responses-ttl-s must be > 0");
  return ac;
}

// The response cache (docs/cache.md); null without --redis.
std::unique_ptr<cache_service> make_cache(const cli_args& a, const tenant_registry& tenants) {
  if (!a.has("redis")) {
    std::fprintf(stderr, "switchyard-router: no --redis: response cache disabled\n");
    return nullptr;
  }
  cache_service_config cc;
  std::string err;
  auto rc = cache::redis_config::parse_url(a.get("redis"), &err);
  if (!rc) throw std::invalid_argument("--redis: " + err);
  cc.redis = *rc;
  cc.redis.command_timeout = std::chrono::milliseconds(a.get_int("cache-lookup-timeout-ms", 5));
  cc.policy.ttl = std::chrono::seconds(a.get_int("cache-ttl-s", 3600));
  cc.policy.max_entry_bytes = static_cast<size_t>(a.get_int("cache-max-entry-bytes", 1 << 20));
  cc.policy.cache_seeded_sampling = !a.has("no-cache-seeded");
  if (a.has("cache-mac-key-file")) {
    cc.policy.mac_key = read_cache_mac_key(a.get("cache-mac-key-file"));
    refuse_published(cc.policy.mac_key, "--cache-mac-key-file " + a.get("cache-mac-key-file"),
                     a.has("allow-example-keys"));
  }
  cc.threads = static_cast<int>(a.get_int("cache-threads", 2));
  cc.store_timeout = std::chrono::milliseconds(a.get_int("cache-store-timeout-ms", 100));
  for (const auto& t : tenants.tenants())
    if (t.cache_previews) cc.analytics.preview_tenants.insert(t.name);
  if (cc.policy.ttl.count() <= 0 || cc.threads < 1 || cc.redis.command_timeout.count() <= 0 ||
      cc.store_timeout.count() <= 0)
    throw std::invalid_argument(
        "--cache-ttl-s, --cache-threads, --cache-lookup-timeout-ms and --cache-store-timeout-ms must be positive");
  auto cache = std::make_unique<cache_service>(cc);
  std::fprintf(
      stderr, "switchyard-router: response cache on %s (TTL %llds, lookup timeout %lldms, store timeout %lldms, %s)\n",
      cc.redis.redacted_url().c_str(), static_cast<long long>(cc.policy.ttl.count()),
      static_cast<long long>(cc.redis.command_timeout.count()), static_cast<long long>(cc.store_timeout.count()),
      cc.policy.mac_key.empty() ? "entries unauthenticated: no --cache-mac-key-file"
                                : "entries sealed with HMAC-SHA256");
  return cache;
}

// The worker link (router/fleet/link_actor.hpp): frame size cap, backlog bound, and CURVE when a key is given.
link_config link_flags(const cli_args& a) {
  link_config lc;
  lc.max_frame_bytes = static_cast<int64_t>(proto::k_max_frame_to_router);
  if (a.has("curve-secret-key") && !a.has("curve-server-key"))
    throw std::invalid_argument("--curve-secret-key needs --curve-server-key (the workers' public key)");
  if (a.has("curve-server-key")) {
    if (!curve::available()) throw std::invalid_argument("--curve-server-key: this libzmq has no CURVE support");
    lc.curve_server_public_z85 = curve::read_key_file(a.get("curve-server-key"), "--curve-server-key");
    if (a.has("curve-secret-key")) {
      const std::string secret = curve::read_key_file(a.get("curve-secret-key"), "--curve-secret-key");
      refuse_published(secret, "--curve-secret-key " + a.get("curve-secret-key"), a.has("allow-example-keys"));
      lc.curve_own = curve::from_secret(secret);
    } else {
      lc.curve_own = curve::generate();
    }
    std::fprintf(stderr, "switchyard-router: worker link: CURVE, router public key %s\n",
                 lc.curve_own.public_z85.c_str());
  } else {
    std::fprintf(stderr, "switchyard-router: worker link: unauthenticated (no --curve-server-key)\n");
  }
  lc.max_backlog = static_cast<size_t>(std::max<int64_t>(1, a.get_int("link-backlog", 100000)));
  return lc;
}

// --served-model-name NAME=MODEL: aliases for models workers will bring.
void add_model_aliases(const cli_args& a, model_registry& models) {
  for (const std::string& m : a.all("served-model-name")) {
    const size_t eq = m.find('=');
    if (eq == 0 || eq == std::string::npos || eq + 1 == m.size() || eq > proto::k_max_model_id_bytes)
      throw std::invalid_argument("--served-model-name must be NAME=MODEL (NAME up to " +
                                  std::to_string(proto::k_max_model_id_bytes) + " bytes), got '" + m + "'");
    if (!models.alias(m.substr(0, eq), m.substr(eq + 1)))
      throw std::invalid_argument("--served-model-name: '" + m.substr(0, eq) + "' is given for two models");
  }
}

// --workers-dns / --workers-file: where discovery looks (router/fleet/worker_discovery.hpp).
struct discovery_source {
  bool dns = false;
  std::string source;  // NAME:PORT or a file path; empty: no discovery
  long long family = 4;
  double every_s = 10;
};

discovery_source discovery_flags(const cli_args& a) {
  if (a.has("workers-dns") && a.has("workers-file"))
    throw std::invalid_argument("--workers-dns and --workers-file: one discovery source at most");
  discovery_source d;
  d.dns = a.has("workers-dns");
  d.source = d.dns ? a.get("workers-dns") : a.get("workers-file", "");
  d.family = a.get_int("dns-family", 4);
  if (d.family != 4 && d.family != 6) throw std::invalid_argument("--dns-family must be 4 or 6");
  if (std::string n, p; d.dns && !split_name_port(d.source, n, p))
    throw std::invalid_argument("--workers-dns must be NAME:PORT");
  d.every_s = a.get_float("dns-interval-s", 10.0);
  if (d.every_s <= 0) throw std::invalid_argument("--dns-interval-s must be > 0");
  return d;
}

// --workers A,B,...: the static list.
std::vector<std::string> static_worker_list(const cli_args& a) {
  std::vector<std::string> out;
  const std::string list = a.get("workers", "");
  for (size_t pos = 0; pos <= list.size();) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    if (comma > pos) out.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

// Where workers come from, for the start-up line.
std::string worker_sources(const cli_args& a) {
  std::string sources = a.get("workers", "");
  if (a.has("workers-dns")) sources += (sources.empty() ? "dns " : ", dns ") + a.get("workers-dns");
  if (a.has("workers-file")) sources += (sources.empty() ? "file " : ", file ") + a.get("workers-file");
  return sources;
}

// Discovery (a Kubernetes headless Service, or a file), on its own thread until *stop: new
// endpoints join, vanished ones retire. Endpoints of the static list (`pinned`) stay whatever
// it says. No discovery source: no thread (not joinable).
std::thread start_discovery(const discovery_source& src, caf::actor disp, std::set<std::string> pinned,
                            std::shared_ptr<std::atomic<bool>> stop) {
  if (src.source.empty()) return {};
  return std::thread([src, disp, pinned = std::move(pinned), stop] {
    const int family = src.family == 6 ? AF_INET6 : AF_INET;
    worker_discovery d(src.dns ? "DNS name " + src.source + " (IPv" + std::to_string(src.family) + ")"
                               : "workers file " + src.source);
    while (!stop->load()) {
      lookup_result r = src.dns ? resolve_workers(src.source, family) : read_workers_file(src.source);
      std::erase_if(r.endpoints, [&](const std::string& e) { return pinned.count(e) != 0; });
      const auto u = d.apply(r);
      if (!u.log.empty()) std::fprintf(stderr, "switchyard-router: %s\n", u.log.c_str());
      for (const auto& e : u.change.joined) caf::anon_send(disp, add_atom::value, e);
      for (const auto& e : u.change.left) caf::anon_send(disp, retire_atom::value, e);
      const int steps = std::max(1, static_cast<int>(src.every_s * 10 + 0.5));  // of 100 ms
      for (int i = 0; i < steps && !stop->load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
}

// What a request gets before the API handler exists (the server accepts at once).
http_response starting_response() {
  return error_response(make_error(503, "overloaded_error", "starting", "the router is starting"), api_family::openai,
                        "");
}

// --metrics-port: /metrics alone, without a key, for the scraper; null without the flag.
std::unique_ptr<http_server> start_metrics_server(const cli_args& a, const http_server_config& api_hc, api_handler* h) {
  const long long mport = a.get_int("metrics-port", -1);
  if (mport < 0) return nullptr;
  http_server_config mc = api_hc;
  mc.host = a.get("metrics-host", "127.0.0.1");
  mc.port = static_cast<int>(mport);
  mc.threads = 1;
  mc.on_written = nullptr;
  mc.on_header = nullptr;  // no key on this port: nothing to check before the body
  auto server = std::make_unique<http_server>(mc, [h](std::shared_ptr<http_exchange> ex, http_request&& req) {
    h->metrics_listener(std::move(ex), std::move(req));
  });
  std::fprintf(stderr, "switchyard-router: metrics on http://%s:%d/metrics (no key)\n", mc.host.c_str(),
               server->port());
  return server;
}

// After the first SIGINT/SIGTERM (docs/router.md, "Pods"): /ready turns 503 at once and every
// response from then on closes its connection (idle keep-alive connections close at once);
// requests are still admitted for --shutdown-delay-s (load balancers stop sending meanwhile),
// then refused (503) while what runs finishes, for --drain-timeout-s at most. A second signal
// skips what is left.
void shut_down_gracefully(const sigset_t& sigs, router_status& status, const caf::actor& disp, http_server& server,
                          double shutdown_delay_s, double drain_timeout_s) {
  {
    std::lock_guard<std::mutex> lk(status.mu);
    status.shutting_down = true;
  }
  // Pooled keep-alive clients move to other routers now rather than at the drain's 503s.
  server.close_keep_alive();
  bool patient = true;
  if (shutdown_delay_s > 0) {
    std::fprintf(stderr, "switchyard-router: signal received: not ready, still admitting for %g s\n", shutdown_delay_s);
    patient = wait_unless_signalled(sigs, shutdown_delay_s, [] { return false; });
  }
  std::fprintf(stderr, "switchyard-router: draining (at most %g s)\n", drain_timeout_s);
  caf::anon_send(disp, drain_atom::value);
  size_t left = 0;
  const auto drained = [&] {
    std::lock_guard<std::mutex> lk(status.mu);
    left = status.active;
    return status.draining && status.active == 0;
  };
  if (patient) patient = wait_unless_signalled(sigs, drain_timeout_s, drained);
  if (!drained())
    std::fprintf(stderr, "switchyard-router: %s with %zu requests unfinished\n",
                 patient ? "drain timeout" : "second signal", left);
}

// Flags are read (and refused) before any thread starts.
http_server_config http_flags(const cli_args& a) {
  http_server_config hc;
  hc.host = a.get("host", "127.0.0.1");
  hc.port = static_cast<int>(a.get_int("port", 8000));
  hc.threads = static_cast<int>(a.get_int("http-threads", 2));
  hc.max_body_bytes = static_cast<size_t>(a.get_int("max-body-bytes", 4 << 20));
  hc.max_connections_per_address = static_cast<size_t>(a.get_int("max-connections-per-address", 2048));
  hc.max_inflight_body_bytes = static_cast<size_t>(a.get_int("max-inflight-body-bytes", 256 << 20));
  hc.write_stall_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(a.get_float("write-stall-timeout-s", 30) * 1000));
  hc.max_stream_buffer_bytes = static_cast<size_t>(a.get_int("max-stream-buffer-bytes", 1 << 20));
  if (hc.write_stall_timeout.count() < 0 || hc.max_stream_buffer_bytes < 4096)
    throw std::invalid_argument("--write-stall-timeout-s must be >= 0 and --max-stream-buffer-bytes >= 4096");
  return hc;
}

work_pool_config prep_flags(const cli_args& a) {
  work_pool_config pc;
  pc.threads = static_cast<int>(a.get_int("prep-threads", 2));
  pc.max_waiting = static_cast<size_t>(a.get_int("prep-queue", 4096));
  pc.max_bytes = static_cast<size_t>(a.get_int("prep-queue-bytes", 64 << 20));
  if (pc.threads < 1 || pc.max_waiting < 1)
    throw std::invalid_argument("--prep-threads and --prep-queue must be at least 1");
  return pc;
}

int run(const cli_args& a) {
  check_flags(a);
  if (a.has("help") || (!a.has("workers") && !a.has("workers-dns") && !a.has("workers-file"))) {
    std::fputs(k_usage, a.has("help") ? stdout : stderr);
    return a.has("help") ? 0 : 2;
  }
  const discovery_source discovery_src = discovery_flags(a);
  const double shutdown_delay_s = a.get_float("shutdown-delay-s", 0.0);
  const double drain_timeout_s = a.get_float("drain-timeout-s", 30.0);
  if (shutdown_delay_s < 0 || drain_timeout_s < 0)
    throw std::invalid_argument("--shutdown-delay-s, --drain-timeout-s must be >= 0");
  const sigset_t sigs = block_stop_signals();  // before any thread starts: sigwait below takes them
  std::signal(SIGPIPE, SIG_IGN);
  raise_fd_limit();

  const tenant_registry tenants = load_tenants(a);
  std::unique_ptr<otlp_exporter> tracer = make_tracer(a);  // outlives the dispatcher
  dispatcher_config dc = dispatcher_flags(a);
  dc.tracer = tracer.get();
  api_config ac = api_flags(a);
  ac.tracing.on = tracer != nullptr;
  ac.tracer = tracer.get();
  ac.tracing.sample_ratio = a.get_float("otlp-sample-ratio", 1.0);
  std::unique_ptr<cache_service> cache = make_cache(a, tenants);
  const link_config lc = link_flags(a);
  http_server_config hc = http_flags(a);
  const work_pool_config pc = prep_flags(a);
  model_registry models;
  add_model_aliases(a, models);
  auto status = std::make_shared<router_status>();
  auto d = std::make_shared<dispatcher>(dc, tenants, models, cache.get());

  zmq::context_t ctx(1);
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  auto disp = sys.spawn<caf::detached>(dispatcher_actor, &ctx, d, status);
  // A weak handle: status is the dispatcher's own, and a strong one would keep it alive forever
  // (the actor system would wait for it at exit).
  status->request_publish = [addr = disp.address()] {
    if (auto a = caf::actor_cast<caf::actor>(addr)) caf::anon_send(a, publish_atom::value);
  };
  auto stop = std::make_shared<std::atomic<bool>>(false);
  auto link_counts = std::make_shared<link_counters>();
  status->link_metrics = [link_counts] { return render_link_metrics(*link_counts); };
  auto link = sys.spawn<caf::detached>(link_actor, &ctx, lc, disp, stop, link_counts);

  const std::vector<std::string> static_workers = static_worker_list(a);
  for (const auto& w : static_workers) caf::anon_send(disp, add_atom::value, w);

  auto stop_discovery = std::make_shared<std::atomic<bool>>(false);
  std::thread discovery =
      start_discovery(discovery_src, disp, {static_workers.begin(), static_workers.end()}, stop_discovery);

  hc.on_written = [status](double s) {
    std::lock_guard<std::mutex> lk(status->mu);
    status->write_overhead_s.observe(s);
  };
  std::unique_ptr<http_server> server;
  std::unique_ptr<http_server> metrics_server;  // --metrics-port: /metrics alone, without a key
  std::unique_ptr<api_handler> handler;
  auto prep = std::make_unique<work_pool>(pc);
  // From here on, however run() ends (a port that cannot be bound included), the server, the
  // actors and the threads stop, in an order where nothing calls into what is already gone:
  // the server's I/O threads first, then the prep pool, then the discovery thread, then the
  // dispatcher — before the link,
  // whose inbox it writes to: a send to an inproc socket whose reader has gone blocks forever —
  // then the link, then the cache threads (whose callbacks reach the handler).
  struct at_exit {
    std::function<void()> f;
    ~at_exit() { f(); }
  } shutdown{[&] {
    if (server) server->stop();
    if (metrics_server) metrics_server->stop();
    prep->stop();  // what it accepted runs (its submits reach the dispatcher, still up)
    stop_discovery->store(true);
    if (discovery.joinable()) discovery.join();
    {
      caf::scoped_actor self{sys};
      self->send_exit(disp, caf::exit_reason::user_shutdown);
      self->wait_for(disp);
    }
    stop->store(true);
    sys.await_all_actors_done();
    cache.reset();
    if (tracer) tracer->stop(std::chrono::seconds(2));  // what is queued, within 2 s
  }};
  auto submit = [disp](std::shared_ptr<routed_request> r) { caf::anon_send(disp, submit_atom::value, std::move(r)); };
  auto gone = [disp](uint64_t id) { caf::anon_send(disp, gone_atom::value, id); };
  // The server accepts at once; until the handler exists, requests get a 503.
  auto current = std::make_shared<std::atomic<api_handler*>>(nullptr);
  hc.on_header = [current](const http_request& head) -> std::optional<http_response> {
    api_handler* h = current->load();
    if (!h) return starting_response();
    return h->precheck(head);
  };
  server = std::make_unique<http_server>(hc, [current](std::shared_ptr<http_exchange> ex, http_request&& req) {
    api_handler* h = current->load();
    if (!h) {
      ex->respond(starting_response());
      return;
    }
    (*h)(std::move(ex), std::move(req));
  });
  handler = std::make_unique<api_handler>(ac, tenants, models, submit, gone, status, &server->counters(), cache.get());
  handler->set_rate_charger(&d->admission());
  handler->set_prep_pool(prep.get());
  current->store(handler.get());
  metrics_server = start_metrics_server(a, hc, handler.get());
  std::fprintf(stderr, "switchyard-router: listening on http://%s:%d (%d I/O threads); workers: %s\n", hc.host.c_str(),
               server->port(), hc.threads, worker_sources(a).c_str());

  int sig = 0;
  sigwait(&sigs, &sig);
  shut_down_gracefully(sigs, *status, disp, *server, shutdown_delay_s, drain_timeout_s);
  return 0;  // `shutdown` stops everything
}

}  // namespace

int main(int argc, char** argv) {
  try {
    cli_args a(argc, argv, 1, {"help", "no-kv-events", "no-cache-seeded", "allow-example-keys"});
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "switchyard-router: %s\n", e.what());
    return 1;
  }
}
