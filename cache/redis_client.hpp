// One synchronous Redis connection (hiredis 0.14) with per-command timeouts, lazy (re)connect
// and a circuit breaker, for the response cache (docs/cache.md; docs/engineering.md, "Blocking
// I/O on its own thread").
//
// Ownership and threads: a redis_client is NOT thread-safe. It belongs to exactly one thread —
// a dedicated cache thread or a detached actor, never a scheduled CAF actor, because every call
// blocks for up to command_timeout. Several threads need several clients.
//
// The process must ignore SIGPIPE (router/main.cpp does): hiredis writes with write(2), and a
// write to a connection Redis has just closed would otherwise kill the process.
//
// TLS: Debian's hiredis 0.14 has no TLS support, so neither does this client; parse_url rejects
// rediss:// URLs. Reach a remote Redis over a trusted network, a unix socket or a local tunnel.
//
// Failure model: a transport error (connect refused, I/O error, EOF, protocol error) or a timeout
// drops the connection — a late reply can then never be mistaken for the next command's — and
// counts one failure; the next call reconnects and re-applies AUTH and SELECT. An error *reply*
// from Redis (WRONGTYPE, NOAUTH on a command...) is a successful round trip: it is returned as a
// reply of kind error and does not feed the breaker.
//
// Circuit breaker: after breaker_failures consecutive failed calls it opens; for breaker_open
// every call fails at once with code short_circuited (no syscall). Then it is half-open: the next
// call is a probe that really talks to Redis; success closes the breaker, failure re-opens it for
// another breaker_open.
//
// Timeouts are hiredis socket timeouts (SO_RCVTIMEO/SO_SNDTIMEO): each read or write may wait
// command_timeout, so a peer trickling bytes could stretch a call; a stopped or dead peer cannot.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

struct redisContext;

namespace sy::cache {

struct redis_config {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string unix_socket;     // non-empty: connect to this path instead of host:port
  std::string user, password;  // AUTH [user] password after each connect when password is set
  int db = 0;                  // SELECT db after each connect when non-zero
  std::chrono::milliseconds connect_timeout{50}, command_timeout{5};
  int breaker_failures = 5;  // consecutive failed calls that open the breaker
  std::chrono::milliseconds breaker_open{2000};

  // redis://[user:password@]host[:port][/db]   (user and password percent-decoded; user may be
  //   empty: redis://:password@host; host may be a bracketed IPv6 literal)
  // unix:///path/to/redis.sock[?db=N][&user=U][&password=P]
  // Anything else (including rediss://, as hiredis 0.14 has no TLS) is an error: nullopt, with a
  // message in *error when error is non-null. Fields not in the URL keep their defaults.
  static std::optional<redis_config> parse_url(std::string_view url, std::string* error);
  // Where the server is, for logs: redis://host:port/db or unix://path?db=N, with "user:***@"
  // when credentials are set — never the password.
  std::string redacted_url() const;
};

// A reply copied out of hiredis' reply tree (hiredis' own objects never leave redis_client.cpp).
struct redis_reply {
  enum class kind : uint8_t { nil, string, status, integer, array, error };
  kind type = kind::nil;
  std::string str;  // string, status and error replies
  long long integer = 0;
  std::vector<redis_reply> elements;  // array replies

  bool is_nil() const { return type == kind::nil; }
  bool is_error() const { return type == kind::error; }
};

enum class redis_errc : uint8_t {
  ok,
  connect,          // could not connect, or AUTH/SELECT failed after connecting
  io,               // I/O error, EOF or protocol error on an established connection
  timeout,          // connect or command exceeded its timeout
  short_circuited,  // the breaker is open; nothing was sent
};
std::string_view name(redis_errc e);

struct redis_error {
  redis_errc code = redis_errc::ok;
  std::string message;
};

// A value or an error; never throws.
template <class T>
class result {
 public:
  result(T value) : value_(std::move(value)) {}
  result(redis_error error) : error_(std::move(error)) {}

  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  const redis_error& error() const { return error_; }

 private:
  std::optional<T> value_;
  redis_error error_;
};

enum class breaker_state : uint8_t { closed, open, half_open };
std::string_view name(breaker_state s);

// Counts since construction. A "call" is one command() or pipeline().
struct redis_counters {
  uint64_t commands = 0;         // calls that reached Redis (single commands + pipelines)
  uint64_t errors = 0;           // failed calls (connect, io, timeout), not short-circuited ones
  uint64_t timeouts = 0;         // of errors, those that were timeouts
  uint64_t reply_errors = 0;     // error replies from Redis (successful round trips)
  uint64_t connects = 0;         // successful connects (including AUTH/SELECT)
  uint64_t reconnects = 0;       // of connects, those after the first
  uint64_t short_circuited = 0;  // calls refused by the open breaker
  uint64_t breaker_opens = 0;    // closed/half-open -> open transitions
};

class redis_client {
 public:
  using clock_fn = std::function<std::chrono::steady_clock::time_point()>;

  // Does not connect; the first call does. `clock` drives only the breaker (tests inject a fake);
  // latencies are always measured with steady_clock.
  explicit redis_client(redis_config config, clock_fn clock = {});
  ~redis_client();
  redis_client(const redis_client&) = delete;
  redis_client& operator=(const redis_client&) = delete;

  // One command, binary-safe (arguments sent with explicit lengths).
  result<redis_reply> command(std::initializer_list<std::string_view> args);
  result<redis_reply> command(std::span<const std::string_view> args);
  result<redis_reply> command(const std::vector<std::string>& args);

  // Several commands in one round trip; replies in order. Fails as a whole on a transport error
  // or timeout (some commands may then have run). An empty list succeeds without I/O.
  result<std::vector<redis_reply>> pipeline(const std::vector<std::vector<std::string>>& cmds);

  bool connected() const { return ctx_ != nullptr; }
  breaker_state state() const;  // as of now (an expired open period reads half_open)
  const redis_counters& counters() const { return counters_; }
  std::chrono::nanoseconds last_latency() const { return last_latency_; }  // of the last real call
  const redis_config& config() const { return config_; }

 private:
  struct ctx_deleter {
    void operator()(redisContext* c) const;
  };
  using ctx_ptr = std::unique_ptr<redisContext, ctx_deleter>;

  // Breaker gate: nullopt to proceed, else the short-circuit error.
  std::optional<redis_error> admit();
  void on_success();
  redis_error on_failure(redis_errc code, std::string message);
  // Connects, sets the command timeout, AUTH and SELECT. Returns ok or the error (not counted).
  redis_error ensure_connected();
  // Classifies the context's current error, drops the connection and counts the failure.
  redis_error fail_from_context(int saved_errno);

  redis_config config_;
  clock_fn clock_;
  ctx_ptr ctx_;
  redis_counters counters_;
  std::chrono::nanoseconds last_latency_{0};
  int consecutive_failures_ = 0;
  bool open_ = false;  // open or half-open; which one depends on the clock
  std::chrono::steady_clock::time_point opened_at_{};
};

}  // namespace sy::cache
