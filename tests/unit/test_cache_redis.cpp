// The response cache against a real redis-server (docs/testing.md, "Processes the tests start"):
// each test starts its own `redis-server --port <free> --save "" --appendonly no` as a child
// process and kills it at the end. Skipped with a warning where /usr/bin/redis-server is absent.
#include "cache/cache_key.hpp"
#include "cache/redis_client.hpp"
#include "cache/response_cache.hpp"
#include "router/dispatch/cache_service.hpp"
#include "tests/unit/prerequisite.hpp"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

using namespace sy::cache;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

namespace {

constexpr const char* k_redis_server = "/usr/bin/redis-server";

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
  socklen_t len = sizeof addr;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0);
  ::close(fd);
  return ntohs(addr.sin_port);
}

// A redis-server child process on a loopback port (and optionally a unix socket), no persistence.
class redis_server {
 public:
  explicit redis_server(std::vector<std::string> extra_args = {}) : extra_(std::move(extra_args)) {
    std::signal(SIGPIPE, SIG_IGN);  // as router/main.cpp does; see redis_client.hpp
    char tmpl[] = "/tmp/sy-cache-test-XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    dir_ = tmpl;
    port_ = free_port();
    start();
  }
  ~redis_server() {
    kill();
    std::system(("rm -rf '" + dir_ + "'").c_str());
  }
  redis_server(const redis_server&) = delete;
  redis_server& operator=(const redis_server&) = delete;

  static bool available() { return ::access(k_redis_server, X_OK) == 0; }

  // Starts (or restarts, on the same port) and waits until it answers.
  void start() {
    REQUIRE(pid_ < 0);
    std::vector<std::string> args = {
        k_redis_server, "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--dir",        dir_,     "--daemonize",         "no"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(k_redis_server, argv.data());
      ::_exit(127);
    }
    // Ready when a PING gets any reply (NOAUTH counts: the server is up).
    redis_config probe_cfg;
    probe_cfg.port = port_;
    probe_cfg.connect_timeout = 200ms;
    probe_cfg.command_timeout = 200ms;
    probe_cfg.breaker_failures = 1 << 30;
    redis_client probe(probe_cfg);
    auto deadline = steady::now() + 10s;
    while (!probe.command({"PING"})) {
      int status = 0;
      REQUIRE(::waitpid(pid_, &status, WNOHANG) == 0);  // it must not have exited
      REQUIRE(steady::now() < deadline);
      std::this_thread::sleep_for(5ms);  // real time: waiting for redis-server to listen
    }
  }
  void kill() {
    if (pid_ < 0) return;
    ::kill(pid_, SIGCONT);
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void pause() { REQUIRE(::kill(pid_, SIGSTOP) == 0); }
  void resume() { REQUIRE(::kill(pid_, SIGCONT) == 0); }

  int port() const { return port_; }
  const std::string& dir() const { return dir_; }

  // Settings for a client of this server with roomy timeouts (tests not about timing must not
  // flake on a loaded machine).
  redis_config config() const {
    redis_config c;
    c.port = port_;
    c.connect_timeout = 1000ms;
    c.command_timeout = 1000ms;
    return c;
  }

 private:
  std::vector<std::string> extra_;
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

#define SKIP_WITHOUT_REDIS() \
  if (!redis_server::available()) SY_SKIP_TEST(k_redis_server << " not found (apt install redis-server)")

stored_response make_response(std::string text, std::string model = "smollm2-135m") {
  stored_response r;
  r.endpoint = 1;
  r.model = std::move(model);
  stored_response::choice c;
  for (size_t i = 0; i < text.size(); i += 4) c.deltas.push_back(text.substr(i, 4));
  c.finish_reason = sy::finish_reason::stop;
  r.choices.push_back(std::move(c));
  r.prompt_tokens = 12;
  r.completion_tokens = 5;
  r.generation_s = 0.2;
  return r;
}

std::string key_for(std::string ns, int32_t token) {
  key_input in;
  in.tenant_namespace = std::move(ns);
  in.model = "smollm2-135m";
  in.prompt_tokens = {1, 2, token};
  in.sampling.temperature = 0;
  return make_key(in);
}

// A steady clock the test moves by hand (drives the breaker only).
struct fake_clock {
  steady::time_point now = steady::time_point{} + 1h;
  redis_client::clock_fn fn() {
    return [this] { return now; };
  }
};

template <class F>
double elapsed_ms(F&& f) {
  auto t0 = steady::now();
  f();
  return std::chrono::duration<double, std::milli>(steady::now() - t0).count();
}

}  // namespace

TEST_CASE("the client speaks binary-safe commands and pipelines", "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  redis_server server;
  redis_client c(server.config());
  CHECK_FALSE(c.connected());
  std::string key("k\0\r\n", 4), value("v\0al\r\nue", 8);
  auto set = c.command({"SET", key, value});
  REQUIRE(set);
  CHECK(set->type == redis_reply::kind::status);
  CHECK(set->str == "OK");
  CHECK(c.connected());
  auto get = c.command({"GET", key});
  REQUIRE(get);
  CHECK(get->type == redis_reply::kind::string);
  CHECK(get->str == value);

  auto p = c.pipeline({{"INCRBY", "n", "5"},
                       {"RPUSH", "l", "a", "b"},
                       {"LRANGE", "l", "0", "-1"},
                       {"GET", "nope"},
                       {"HGET", "l", "x"}});
  REQUIRE(p);
  REQUIRE(p->size() == 5);
  CHECK((*p)[0].integer == 5);
  CHECK((*p)[1].integer == 2);
  REQUIRE((*p)[2].elements.size() == 2);
  CHECK((*p)[2].elements[1].str == "b");
  CHECK((*p)[3].is_nil());
  CHECK((*p)[4].is_error());  // WRONGTYPE is a reply, not a transport failure
  CHECK(c.counters().reply_errors == 1);
  CHECK(c.counters().errors == 0);
  CHECK(c.counters().connects == 1);
  CHECK(c.counters().commands == 3);
  CHECK(c.last_latency() > 0ns);
  CHECK(c.state() == breaker_state::closed);
}

TEST_CASE("a stored response is found again and an unknown key misses", "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  redis_server server;
  int64_t now = 1'750'000'000;
  response_cache cache(server.config(), cache_policy{}, analytics_config{}, [&] { return now; });

  lookup_status st = lookup_status::hit;
  CHECK_FALSE(cache.lookup(key_for("acme", 7), &st));
  CHECK(st == lookup_status::miss);

  stored_response r = make_response("To register, open Settings and choose Sign up.");
  REQUIRE(cache.store(key_for("acme", 7), r));
  now += 90;
  auto hit = cache.lookup(key_for("acme", 7), &st);
  REQUIRE(hit);
  CHECK(st == lookup_status::hit);
  CHECK(hit->text(0) == r.text(0));
  CHECK(hit->choices[0].deltas == r.choices[0].deltas);  // stream pieces preserved for replay
  CHECK(hit->completion_tokens == 5);
  CHECK(hit->created_unix_s == now - 90);  // stamped by store
  CHECK(cache.now_unix_s() - hit->created_unix_s == 90);

  // Another namespace, or another prompt, misses.
  CHECK_FALSE(cache.lookup(key_for("globex", 7), &st));
  CHECK(st == lookup_status::miss);
  CHECK_FALSE(cache.lookup(key_for("acme", 8), &st));
  CHECK(st == lookup_status::miss);

  // The entry carries the policy TTL.
  auto ttl = cache.client().command({"TTL", key_for("acme", 7)});
  REQUIRE(ttl);
  CHECK(ttl->integer > 3500);
  CHECK(ttl->integer <= 3600);

  CHECK(cache.counters().hits == 1);
  CHECK(cache.counters().misses == 3);
  CHECK(cache.counters().stores == 1);
  CHECK(cache.counters().lookups == 4);
}

TEST_CASE("entries expire after the TTL", "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  redis_server server;
  cache_policy policy;
  policy.ttl = 1s;
  response_cache cache(server.config(), policy);
  REQUIRE(cache.store(key_for("acme", 1), make_response("short-lived")));
  lookup_status st;
  REQUIRE(cache.lookup(key_for("acme", 1), &st));
  CHECK(st == lookup_status::hit);
  std::this_thread::sleep_for(1500ms);  // real Redis time: the 1 s TTL must pass
  CHECK_FALSE(cache.lookup(key_for("acme", 1), &st));
  CHECK(st == lookup_status::miss);
}

TEST_CASE("entries over max_entry_bytes and unfinished responses are not stored", "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  redis_server server;
  cache_policy policy;
  policy.max_entry_bytes = 1024;
  response_cache cache(server.config(), policy);

  CHECK_FALSE(cache.store(key_for("acme", 1), make_response(std::string(2000, 'x'))));
  CHECK(cache.counters().store_refused_too_large == 1);
  lookup_status st;
  CHECK_FALSE(cache.lookup(key_for("acme", 1), &st));
  CHECK(st == lookup_status::miss);

  stored_response unfinished = make_response("cut off");
  unfinished.choices[0].finish_reason = sy::finish_reason::none;
  CHECK_FALSE(cache.store(key_for("acme", 2), unfinished));
  stored_response no_choices = make_response("x");
  no_choices.choices.clear();
  CHECK_FALSE(cache.store(key_for("acme", 3), no_choices));
  CHECK(cache.counters().store_refused_incomplete == 2);
  auto exists = cache.client().command({"EXISTS", key_for("acme", 2), key_for("acme", 3)});
  REQUIRE(exists);
  CHECK(exists->integer == 0);

  CHECK(cache.store(key_for("acme", 4), make_response(std::string(300, 'y'))));
  CHECK(cache.lookup(key_for("acme", 4), &st));
  CHECK(st == lookup_status::hit);
  CHECK(cache.counters().stores == 1);
}

TEST_CASE("a corrupt entry reads as corrupt, not a hit, and a store replaces it", "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  redis_server server;
  response_cache cache(server.config(), cache_policy{});
  std::string good = encode(make_response("fine"));
  std::string k1 = key_for("acme", 1), k2 = key_for("acme", 2), k3 = key_for("acme", 3);
  REQUIRE(cache.client().command({"SET", k1, "\x93\x01\x02garbage"}));
  REQUIRE(cache.client().command({"SET", k2, std::string_view(good).substr(0, good.size() / 2)}));
  REQUIRE(cache.client().command({"RPUSH", k3, "not a string"}));

  for (const auto& k : {k1, k2, k3}) {
    lookup_status st = lookup_status::hit;
    CHECK_FALSE(cache.lookup(k, &st));
    CHECK(st == lookup_status::corrupt);
  }
  CHECK(cache.counters().corrupt == 3);
  CHECK(cache.client().counters().errors == 0);

  REQUIRE(cache.store(k1, make_response("replaced")));
  lookup_status st;
  auto hit = cache.lookup(k1, &st);
  REQUIRE(hit);
  CHECK(hit->text(0) == "replaced");
}

TEST_CASE("AUTH and SELECT are applied on connect and on every reconnect", "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  redis_server server({"--requirepass", "s3cret", "--user", "alice", "on", ">alicepw", "~*", "&*", "+@all"});
  std::string port = std::to_string(server.port());
  std::string err;
  auto db1 = redis_config::parse_url("redis://:s3cret@127.0.0.1:" + port + "/1", &err);
  auto db2 = redis_config::parse_url("redis://:s3cret@127.0.0.1:" + port + "/2", &err);
  auto alice_db1 = redis_config::parse_url("redis://alice:alicepw@127.0.0.1:" + port + "/1", &err);
  auto wrong = redis_config::parse_url("redis://:nope@127.0.0.1:" + port + "/1", &err);
  auto none = redis_config::parse_url("redis://127.0.0.1:" + port + "/1", &err);
  REQUIRE((db1 && db2 && alice_db1 && wrong && none));
  for (auto* c : {&*db1, &*db2, &*alice_db1, &*wrong, &*none}) c->command_timeout = c->connect_timeout = 1000ms;

  response_cache in_db1(*db1, cache_policy{});
  REQUIRE(in_db1.store(key_for("acme", 1), make_response("db one")));

  lookup_status st;
  response_cache in_db2(*db2, cache_policy{});
  CHECK_FALSE(in_db2.lookup(key_for("acme", 1), &st));
  CHECK(st == lookup_status::miss);  // same server, other db: isolated

  response_cache as_alice(*alice_db1, cache_policy{});
  auto hit = as_alice.lookup(key_for("acme", 1), &st);
  REQUIRE(hit);
  CHECK(hit->text(0) == "db one");

  response_cache bad_password(*wrong, cache_policy{});
  CHECK_FALSE(bad_password.lookup(key_for("acme", 1), &st));
  CHECK(st == lookup_status::error);
  CHECK_FALSE(bad_password.store(key_for("acme", 2), make_response("x")));
  CHECK(bad_password.client().counters().connects == 0);
  CHECK(bad_password.client().counters().errors == 2);

  response_cache no_password(*none, cache_policy{});
  CHECK_FALSE(no_password.lookup(key_for("acme", 1), &st));
  CHECK(st == lookup_status::error);  // NOAUTH is Redis refusing service, not a corrupt entry

  // Kill every other connection; the next call fails once, the one after reconnects with AUTH
  // and SELECT 1 re-applied (the key lives only in db 1).
  redis_client admin(*db2);
  auto killed = admin.command({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
  REQUIRE(killed);
  CHECK(killed->integer >= 2);
  CHECK_FALSE(in_db1.lookup(key_for("acme", 1), &st));
  CHECK(st == lookup_status::error);
  REQUIRE(in_db1.lookup(key_for("acme", 1), &st));
  CHECK(st == lookup_status::hit);
  CHECK(in_db1.client().counters().reconnects == 1);
  CHECK(in_db1.client().counters().errors == 1);
}

TEST_CASE("a unix socket URL with a db reaches the same server", "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  char tmpl[] = "/tmp/sy-cache-sock-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string sock_dir = tmpl;
  std::string sock = sock_dir + "/redis.sock";
  {
    redis_server server({"--unixsocket", sock, "--unixsocketperm", "700"});
    std::string err;
    auto cfg = redis_config::parse_url("unix://" + sock + "?db=3", &err);
    REQUIRE(cfg);
    cfg->command_timeout = cfg->connect_timeout = 1000ms;
    response_cache cache(*cfg, cache_policy{});
    REQUIRE(cache.store(key_for("acme", 5), make_response("over a socket")));

    redis_client tcp(server.config());
    REQUIRE(tcp.command({"SELECT", "3"}));
    auto exists = tcp.command({"EXISTS", key_for("acme", 5)});
    REQUIRE(exists);
    CHECK(exists->integer == 1);
  }
  ::unlink(sock.c_str());  // a SIGKILLed redis-server leaves its socket behind
  ::rmdir(sock_dir.c_str());
}

TEST_CASE("Redis killed mid-run: errors counted, breaker opens and short-circuits, then recovers", "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  redis_server server;
  fake_clock clock;
  redis_config cfg = server.config();
  cfg.connect_timeout = 200ms;
  cfg.command_timeout = 200ms;
  cfg.breaker_failures = 3;
  cfg.breaker_open = 2000ms;
  response_cache cache(cfg, cache_policy{}, analytics_config{}, {}, clock.fn());
  REQUIRE(cache.store(key_for("acme", 1), make_response("before the crash")));
  lookup_status st;
  REQUIRE(cache.lookup(key_for("acme", 1), &st));

  server.kill();
  for (int i = 0; i < 3; ++i) {
    CHECK_FALSE(cache.lookup(key_for("acme", 1), &st));
    CHECK(st == lookup_status::error);
  }
  CHECK(cache.client().counters().errors == 3);
  CHECK(cache.client().state() == breaker_state::open);
  CHECK(cache.client().counters().breaker_opens == 1);

  double slowest_ms = 0;
  for (int i = 0; i < 100; ++i) {
    slowest_ms = std::max(slowest_ms, elapsed_ms([&] {
                            CHECK_FALSE(cache.lookup(key_for("acme", 1), &st));
                            CHECK(st == lookup_status::short_circuited);
                          }));
  }
  CHECK(slowest_ms < 5.0);
  CHECK_FALSE(cache.store(key_for("acme", 2), make_response("lost")));
  cache.record(event_kind::bypass, "acme", "smollm2-135m", 0, 0, 0, "", nullptr);
  CHECK(cache.counters().short_circuited == 100);
  CHECK(cache.counters().records_dropped == 1);
  CHECK(cache.client().counters().short_circuited == 102);
  CHECK(cache.client().counters().errors == 3);  // short-circuited calls are not errors

  // Open period over, Redis still down: the probe fails and the breaker re-opens.
  clock.now += 2001ms;
  CHECK(cache.client().state() == breaker_state::half_open);
  CHECK_FALSE(cache.lookup(key_for("acme", 1), &st));
  CHECK(st == lookup_status::error);
  CHECK(cache.client().state() == breaker_state::open);
  CHECK(cache.client().counters().breaker_opens == 2);

  // Redis back on the same port (empty: no persistence). The next probe closes the breaker.
  server.start();
  clock.now += 2001ms;
  CHECK_FALSE(cache.lookup(key_for("acme", 1), &st));
  CHECK(st == lookup_status::miss);
  CHECK(cache.client().state() == breaker_state::closed);
  REQUIRE(cache.store(key_for("acme", 1), make_response("after the crash")));
  auto hit = cache.lookup(key_for("acme", 1), &st);
  REQUIRE(hit);
  CHECK(hit->text(0) == "after the crash");
  CHECK(cache.client().counters().reconnects >= 1);
}

TEST_CASE("Redis paused with SIGSTOP: lookups fail within the command timeout", "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  redis_server server;
  redis_config cfg = server.config();
  cfg.connect_timeout = 50ms;
  cfg.command_timeout = 20ms;
  response_cache cache(cfg, cache_policy{});
  REQUIRE(cache.store(key_for("acme", 1), make_response("paused")));

  server.pause();
  lookup_status st = lookup_status::hit;
  // On the established connection, then on a fresh one (the kernel still accepts the connect).
  for (int i = 0; i < 2; ++i) {
    double ms = elapsed_ms([&] { CHECK_FALSE(cache.lookup(key_for("acme", 1), &st)); });
    CHECK(st == lookup_status::error);
    CHECK(ms < 100.0);
  }
  CHECK(cache.client().counters().timeouts == 2);
  CHECK(elapsed_ms([&] { CHECK_FALSE(cache.store(key_for("acme", 2), make_response("x"))); }) < 100.0);
  server.resume();

  // Resumed: within a second (real time for redis-server to drain), lookups hit again.
  bool recovered = false;
  auto deadline = steady::now() + 1s;
  while (!recovered && steady::now() < deadline) {
    recovered = cache.lookup(key_for("acme", 1), &st).has_value();
    if (!recovered) std::this_thread::sleep_for(10ms);
  }
  CHECK(recovered);
  CHECK(st == lookup_status::hit);
}

TEST_CASE("without a reachable Redis every call returns at once", "[cache_redis]") {
  // No redis-server needed: nothing listens on this port, so connects are refused.
  redis_config cfg;
  cfg.port = free_port();
  cfg.breaker_failures = 2;
  response_cache cache(cfg, cache_policy{});
  lookup_status st;
  CHECK(elapsed_ms([&] {
          CHECK_FALSE(cache.lookup("sy:v1:r:acme:00", &st));
          CHECK(st == lookup_status::error);
          CHECK_FALSE(cache.store("sy:v1:r:acme:00", make_response("x")));
          cache.record(event_kind::miss, "acme", "m", 0, 0, 0, "h", nullptr);
          CHECK_FALSE(cache.lookup("sy:v1:r:acme:00", &st));
          CHECK(st == lookup_status::short_circuited);
        }) < 100.0);
  CHECK(cache.counters().lookup_errors == 1);
  CHECK(cache.counters().store_errors == 1);
  CHECK(cache.counters().records_dropped == 1);
  cache_stats s = cache.query(0, 600, 5);
  CHECK_FALSE(s.complete);
  CHECK_FALSE(s.error.empty());
  CHECK(cache.counters().queries_failed == 1);

  cache_policy off;
  off.enabled = false;
  response_cache disabled(cfg, off);
  CHECK_FALSE(disabled.lookup("k", &st));
  CHECK(st == lookup_status::bypassed);
  CHECK(disabled.client().counters().errors == 0);  // Redis never asked
}

TEST_CASE("analytics: a known mix of events reads back exactly", "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  redis_server server;
  const int64_t t0 = 1'750'003'200 + 30;  // 30 s into an hour (1'750'003'200 is a multiple of 3600)
  REQUIRE(1'750'003'200 % 3600 == 0);
  int64_t now = t0;
  response_cache cache(server.config(), cache_policy{}, analytics_config{}, [&] { return now; });
  const std::string p1(64, '1'), p2(64, '2'), p3(64, '3');

  // Minute 0: acme/m1 — 3 hits (ages 10 s, 300 s, 2 days), 2 misses; globex/m2 — 1 hit (5 s),
  // 1 coalesced, 2 bypasses. Tenant and model names with '|' and '%' survive the field format.
  cache.record(event_kind::hit, "acme", "m1", 10, 0.25, 10, p1, nullptr);
  cache.record(event_kind::hit, "acme", "m1", 10, 0.25, 300, p1, nullptr);
  cache.record(event_kind::hit, "acme", "m1", 10, 0.25, 2 * 86400, p2, nullptr);
  cache.record(event_kind::miss, "acme", "m1", 0, 0, 0, p1, nullptr);
  cache.record(event_kind::miss, "acme", "m1", 0, 0, 0, p2, nullptr);
  cache.record(event_kind::hit, "glo|bex%", "m2", 20, 1.5, 5, p2, nullptr);
  cache.record(event_kind::coalesced, "glo|bex%", "m2", 20, 1.5, 0, p1, nullptr);
  cache.record(event_kind::bypass, "glo|bex%", "m2", 0, 0, 0, "", nullptr);
  cache.record(event_kind::bypass, "glo|bex%", "m2", 0, 0, 0, p3, nullptr);  // bypasses never rank
  // Minute 1: acme/m2 — 1 miss.
  now = t0 + 60;
  cache.record(event_kind::miss, "acme", "m2", 0, 0, 0, p3, nullptr);
  CHECK(cache.counters().records == 10);
  CHECK(cache.counters().records_dropped == 0);

  // The hash fields spell escaped names as they always have (cache/percent_escape.hpp).
  auto field = cache.client().command({"HGET", "sy:v1:stats:" + std::to_string(t0 / 60), "hit|glo%7Cbex%25|m2"});
  REQUIRE(field);
  CHECK(field->str == "1");

  // Stats keys expire.
  auto ttl = cache.client().command({"TTL", "sy:v1:stats:" + std::to_string(t0 / 60)});
  REQUIRE(ttl);
  CHECK(ttl->integer > 7 * 86400);

  cache_stats s = cache.query(t0 - 60, t0 + 119, 2);
  REQUIRE(s.complete);
  REQUIRE(s.series.size() == 4);  // minutes t0/60 - 1 .. t0/60 + 2 (119 s past a :30 start)
  CHECK(s.series[0].unix_minute == t0 / 60 - 1);
  CHECK(s.series[0].counts.requests() == 0);
  CHECK(s.series[1].counts.hit == 4);
  CHECK(s.series[1].counts.miss == 2);
  CHECK(s.series[1].counts.coalesced == 1);
  CHECK(s.series[1].counts.bypass == 2);
  CHECK(s.series[2].counts.miss == 1);
  CHECK(s.series[2].counts.requests() == 1);
  CHECK(s.series[3].counts.requests() == 0);

  CHECK(s.total.hit == 4);
  CHECK(s.total.miss == 3);
  CHECK(s.total.coalesced == 1);
  CHECK(s.total.bypass == 2);
  CHECK(s.total.tokens_saved == 70);
  CHECK(s.total.device_ms_saved == 3750);
  CHECK(s.total.hit_rate() == Approx(0.4));

  REQUIRE(s.by_tenant.size() == 2);
  CHECK(s.by_tenant["acme"].hit == 3);
  CHECK(s.by_tenant["acme"].miss == 3);
  CHECK(s.by_tenant["acme"].tokens_saved == 30);
  CHECK(s.by_tenant["glo|bex%"].hit == 1);
  CHECK(s.by_tenant["glo|bex%"].coalesced == 1);
  CHECK(s.by_tenant["glo|bex%"].bypass == 2);
  CHECK(s.by_tenant["glo|bex%"].device_ms_saved == 3000);
  REQUIRE(s.by_model.size() == 2);
  CHECK(s.by_model["m1"].hit == 3);
  CHECK(s.by_model["m1"].miss == 2);
  CHECK(s.by_model["m2"].miss == 1);
  CHECK(s.by_model["m2"].bypass == 2);

  CHECK(s.hit_age[0] == 2);  // 10 s, 5 s
  CHECK(s.hit_age[1] == 1);  // 300 s
  CHECK(s.hit_age[2] == 0);
  CHECK(s.hit_age[3] == 0);
  CHECK(s.hit_age[4] == 1);  // 2 days

  // p1: 2 hits + 1 miss + 1 coalesced = 4; p2: 2 hits + 1 miss = 3; p3: 1 miss (bypass not counted).
  REQUIRE(s.top.size() == 2);
  CHECK(s.top[0].prompt_hash == p1);
  CHECK(s.top[0].count == 4);
  CHECK(s.top[1].prompt_hash == p2);
  CHECK(s.top[1].count == 3);
  CHECK_FALSE(s.top[0].preview);

  cache_stats all = cache.query(t0 - 60, t0 + 119, 10);
  REQUIRE(all.top.size() == 3);
  CHECK(all.top[2].prompt_hash == p3);
  CHECK(all.top[2].count == 1);

  // A range covering only the second minute sees only its event.
  cache_stats later = cache.query(t0 + 30, t0 + 89, 0);
  REQUIRE(later.series.size() == 1);
  CHECK(later.total.miss == 1);
  CHECK(later.total.requests() == 1);
  CHECK(later.by_tenant.size() == 1);
  CHECK(later.top.empty());

  // The temporary union key is gone.
  auto tmp = cache.client().command({"KEYS", "sy:v1:tmp:*"});
  REQUIRE(tmp);
  CHECK(tmp->elements.empty());

  // The JSON the router serves agrees.
  auto j = nlohmann::json::parse(to_json(s));
  CHECK(j["totals"]["hit"] == 4);
  CHECK(j["totals"]["hit_rate"].get<double>() == Approx(0.4));
  CHECK(j["by_tenant"]["glo|bex%"]["coalesced"] == 1);
  CHECK(j["top_prompts"][0]["count"] == 4);
}

TEST_CASE("analytics keep prompt previews only for tenants that allow them", "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  redis_server server;
  const std::string p_open(64, 'a'), p_closed(64, 'b'), p_default(64, 'c');
  // 150 two-byte characters (300 bytes): the preview is cut to <= 200 bytes on a boundary.
  std::string long_text;
  for (int i = 0; i < 150; ++i) long_text += "\xc3\xa9";  // U+00E9
  const std::string secret = "my account number is 1234";

  analytics_config with_previews;
  with_previews.preview_tenants = {"open"};
  response_cache cache(server.config(), cache_policy{}, with_previews);
  cache.record(event_kind::miss, "open", "m", 0, 0, 0, p_open, &long_text);
  cache.record(event_kind::hit, "open", "m", 5, 0.1, 1, p_open, &long_text);
  cache.record(event_kind::miss, "closed", "m", 0, 0, 0, p_closed, &secret);

  response_cache defaults(server.config(), cache_policy{});  // previews off by default
  defaults.record(event_kind::miss, "open", "m", 0, 0, 0, p_default, &secret);

  int64_t now = cache.now_unix_s();
  cache_stats s = cache.query(now - 60, now, 10);
  REQUIRE(s.complete);
  REQUIRE(s.top.size() == 3);
  CHECK(s.top[0].prompt_hash == p_open);
  REQUIRE(s.top[0].preview);
  CHECK(s.top[0].preview->size() == 200);
  CHECK(*s.top[0].preview == long_text.substr(0, 200));
  for (size_t i = 1; i < 3; ++i) {
    INFO(s.top[i].prompt_hash);
    CHECK_FALSE(s.top[i].preview);
  }
  auto n = cache.client().command({"HLEN", "sy:v1:preview"});
  REQUIRE(n);
  CHECK(n->integer == 1);

  // An odd cut: 201 bytes of one ASCII byte + two-byte characters ends before the split character.
  std::string odd = "x" + long_text;
  const std::string p_odd(64, 'd');
  cache.record(event_kind::miss, "open", "m", 0, 0, 0, p_odd, &odd);
  auto stored = cache.client().command({"HGET", "sy:v1:preview", p_odd});
  REQUIRE(stored);
  CHECK(stored->str.size() == 199);
  CHECK(stored->str == odd.substr(0, 199));
}

TEST_CASE("a lookup hit on loopback takes well under a millisecond", "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  redis_server server;
  response_cache cache(server.config(), cache_policy{});
  stored_response r = make_response(std::string(600, 'a'));  // ~150 deltas, a typical short answer
  REQUIRE(cache.store(key_for("acme", 1), r));
  std::vector<double> us;
  us.reserve(1000);
  size_t hits = 0;
  for (int i = 0; i < 1000; ++i) {
    lookup_status st;
    auto t0 = steady::now();
    auto got = cache.lookup(key_for("acme", 1), &st);
    us.push_back(std::chrono::duration<double, std::micro>(steady::now() - t0).count());
    hits += got && st == lookup_status::hit ? 1 : 0;
  }
  std::sort(us.begin(), us.end());
  double median = us[us.size() / 2], p99 = us[us.size() * 99 / 100];
  WARN("lookup hit latency over loopback: median " << median << " us, p99 " << p99 << " us");
  CHECK(hits == 1000);
  CHECK(median < 1000.0);
}

TEST_CASE("cache service: lookups stuck behind a slow Redis are answered expired without asking it", "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  redis_server server;
  sy::router::cache_service_config cfg;
  cfg.redis = server.config();
  cfg.redis.command_timeout = 300ms;  // a Redis this slow holds the one cache thread 300 ms per lookup
  cfg.redis.breaker_failures = 1 << 30;
  cfg.lookup_max_wait = 50ms;
  cfg.threads = 1;
  cfg.analytics.enabled = false;
  sy::router::cache_service svc(cfg);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<lookup_status> got;
  const auto on_done = [&](std::optional<stored_response>, lookup_status st) {
    std::lock_guard<std::mutex> lk(mu);
    got.push_back(st);
    cv.notify_all();
  };
  server.pause();  // SIGSTOP: connected, but answers nothing
  for (int i = 0; i < 6; ++i) REQUIRE(svc.lookup(key_for("acme", i), on_done));
  {
    std::unique_lock<std::mutex> lk(mu);
    REQUIRE(cv.wait_for(lk, 10s, [&] { return got.size() == 6; }));
  }
  server.resume();
  // The first asked Redis and timed out; the five queued behind it waited past their budget and
  // went to the workers at once instead of waiting their 300 ms turn each.
  CHECK(got[0] == lookup_status::error);
  CHECK(std::count(got.begin(), got.end(), lookup_status::expired) == 5);
  CHECK(svc.render_metrics().find("switchyard_router_cache_lookups_total{status=\"expired\"} 5\n") !=
        std::string::npos);
}

TEST_CASE("cache service: a store slower than the lookup budget is still stored and never holds a lookup up",
          "[cache_redis]") {
  SKIP_WITHOUT_REDIS();
  redis_server server;
  sy::router::cache_service_config cfg;
  cfg.redis = server.config();
  cfg.redis.command_timeout = 5ms;  // the lookup budget
  cfg.store_timeout = 5000ms;
  cfg.threads = 1;
  cfg.analytics.enabled = false;
  sy::router::cache_service svc(cfg);
  redis_client admin(server.config());
  // Write commands wait 2 s (Redis 6.2+: reads go on): a store far slower than 5 ms, and long
  // enough that a lookup held up behind it cannot pass for one answered at once on a loaded
  // machine.
  auto paused = admin.command({"CLIENT", "PAUSE", "2000", "WRITE"});
  REQUIRE(paused);
  REQUIRE(paused->str == "OK");
  const auto t0 = steady::now();
  svc.store(key_for("acme", 1), make_response("Paris"));
  // A lookup queued right behind the store is answered at once (a miss), not after it.
  std::mutex mu;
  std::condition_variable cv;
  std::optional<lookup_status> got;
  REQUIRE(svc.lookup(key_for("acme", 2), [&](std::optional<stored_response>, lookup_status st) {
    std::lock_guard<std::mutex> lk(mu);
    got = st;
    cv.notify_all();
  }));
  {
    std::unique_lock<std::mutex> lk(mu);
    REQUIRE(cv.wait_for(lk, 5s, [&] { return got.has_value(); }));
  }
  CHECK(*got == lookup_status::miss);
  CHECK(steady::now() - t0 < 1500ms);
  // The store went through once the pause ended, and counted as stored.
  const auto stored = [&] {
    return svc.render_metrics().find("switchyard_router_cache_stores_total 1\n") != std::string::npos;
  };
  for (const auto deadline = steady::now() + 5s; !stored() && steady::now() < deadline;)
    std::this_thread::sleep_for(10ms);
  CHECK(stored());
  CHECK(svc.render_metrics().find("switchyard_router_cache_store_failures_total 0\n") != std::string::npos);
  response_cache reader(server.config(), cache_policy{}, analytics_config{});
  lookup_status st = lookup_status::miss;
  const auto hit = reader.lookup(key_for("acme", 1), &st);
  REQUIRE(hit.has_value());
  CHECK(st == lookup_status::hit);
}
