#include "cache/redis_client.hpp"

#include <hiredis/hiredis.h>

#include <sys/time.h>
#include <cassert>
#include <cerrno>
#include <charconv>

namespace sy::cache {
namespace {

using steady = std::chrono::steady_clock;

struct reply_deleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using reply_ptr = std::unique_ptr<redisReply, reply_deleter>;

redis_reply convert(const redisReply& r) {
  redis_reply out;
  switch (r.type) {
    case REDIS_REPLY_STRING:
      out.type = redis_reply::kind::string;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = redis_reply::kind::status;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = redis_reply::kind::error;
      out.str.assign(r.str, r.len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = redis_reply::kind::integer;
      out.integer = r.integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = redis_reply::kind::array;
      out.elements.reserve(r.elements);
      for (size_t i = 0; i < r.elements; ++i) out.elements.push_back(convert(*r.element[i]));
      break;
    default:  // REDIS_REPLY_NIL
      out.type = redis_reply::kind::nil;
      break;
  }
  return out;
}

timeval to_timeval(std::chrono::milliseconds ms) {
  assert(ms.count() > 0 && "a zero timeout would mean 'wait forever' to hiredis");
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(ms.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms.count() % 1000) * 1000);
  return tv;
}

bool is_timeout_errno(int e) { return e == EAGAIN || e == EWOULDBLOCK || e == ETIMEDOUT || e == EINPROGRESS; }

// Argument vectors for redisCommandArgv / redisAppendCommandArgv.
struct argv_buffer {
  std::vector<const char*> ptrs;
  std::vector<size_t> lens;

  template <class Range>
  explicit argv_buffer(const Range& args) {
    ptrs.reserve(std::size(args));
    lens.reserve(std::size(args));
    for (const auto& a : args) {
      ptrs.push_back(a.data());
      lens.push_back(a.size());
    }
  }
  int argc() const { return static_cast<int>(ptrs.size()); }
};

// Percent-decoding for URL userinfo and query values; false on a malformed escape.
bool percent_decode(std::string_view in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out->push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    unsigned v = 0;
    auto [p, ec] = std::from_chars(in.data() + i + 1, in.data() + i + 3, v, 16);
    if (ec != std::errc() || p != in.data() + i + 3) return false;
    out->push_back(static_cast<char>(v));
    i += 2;
  }
  return true;
}

bool parse_int(std::string_view s, int lo, int hi, int* out) {
  if (s.empty()) return false;
  int v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < lo || v > hi) return false;
  *out = v;
  return true;
}

std::optional<redis_config> url_error(std::string* error, std::string message) {
  if (error) *error = std::move(message);
  return std::nullopt;
}

}  // namespace

std::string_view name(redis_errc e) {
  switch (e) {
    case redis_errc::ok:
      return "ok";
    case redis_errc::connect:
      return "connect";
    case redis_errc::io:
      return "io";
    case redis_errc::timeout:
      return "timeout";
    case redis_errc::short_circuited:
      return "short_circuited";
  }
  return "unknown";
}

std::string_view name(breaker_state s) {
  switch (s) {
    case breaker_state::closed:
      return "closed";
    case breaker_state::open:
      return "open";
    case breaker_state::half_open:
      return "half_open";
  }
  return "unknown";
}

// --- URL parsing ---

std::string redis_config::redacted_url() const {
  const std::string who = password.empty() ? "" : user + ":***@";
  if (!unix_socket.empty()) return "unix://" + who + unix_socket + "?db=" + std::to_string(db);
  const bool v6 = host.find(':') != std::string::npos;
  return "redis://" + who + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port) + "/" + std::to_string(db);
}

std::optional<redis_config> redis_config::parse_url(std::string_view url, std::string* error) {
  redis_config cfg;
  constexpr std::string_view k_redis = "redis://", k_unix = "unix://", k_rediss = "rediss://";
  if (url.starts_with(k_rediss)) return url_error(error, "rediss:// (TLS) is not supported: hiredis 0.14 has no TLS");
  if (url.starts_with(k_unix)) {
    std::string_view rest = url.substr(k_unix.size());
    std::string_view query;
    if (size_t q = rest.find('?'); q != std::string_view::npos) {
      query = rest.substr(q + 1);
      rest = rest.substr(0, q);
    }
    if (rest.empty() || rest.front() != '/') return url_error(error, "unix:// URL needs an absolute socket path");
    if (!percent_decode(rest, &cfg.unix_socket)) return url_error(error, "bad percent-escape in socket path");
    while (!query.empty()) {
      size_t amp = query.find('&');
      std::string_view kv = query.substr(0, amp);
      query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
      size_t eq = kv.find('=');
      if (eq == std::string_view::npos) return url_error(error, "query parameter without '=': " + std::string(kv));
      std::string_view k = kv.substr(0, eq), v = kv.substr(eq + 1);
      if (k == "db") {
        if (!parse_int(v, 0, 1 << 20, &cfg.db)) return url_error(error, "bad db: " + std::string(v));
      } else if (k == "user") {
        if (!percent_decode(v, &cfg.user)) return url_error(error, "bad percent-escape in user");
      } else if (k == "password") {
        if (!percent_decode(v, &cfg.password)) return url_error(error, "bad percent-escape in password");
      } else {
        return url_error(error, "unknown query parameter: " + std::string(k));
      }
    }
    return cfg;
  }
  if (!url.starts_with(k_redis)) return url_error(error, "URL must start with redis:// or unix://");

  std::string_view rest = url.substr(k_redis.size());
  std::string_view path;
  if (size_t slash = rest.find('/'); slash != std::string_view::npos) {
    path = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
  }
  if (size_t at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    size_t colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
      // redis://password@host is ambiguous; Redis clients read a lone userinfo as the password.
      if (!percent_decode(userinfo, &cfg.password)) return url_error(error, "bad percent-escape in password");
    } else {
      if (!percent_decode(userinfo.substr(0, colon), &cfg.user) ||
          !percent_decode(userinfo.substr(colon + 1), &cfg.password))
        return url_error(error, "bad percent-escape in user or password");
    }
  }
  std::string_view host = rest, port;
  if (!rest.empty() && rest.front() == '[') {
    size_t close = rest.find(']');
    if (close == std::string_view::npos) return url_error(error, "unterminated IPv6 literal");
    host = rest.substr(1, close - 1);
    std::string_view after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return url_error(error, "junk after IPv6 literal");
      port = after.substr(1);
    }
  } else if (size_t colon = rest.find(':'); colon != std::string_view::npos) {
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty()) return url_error(error, "missing host");
  cfg.host = std::string(host);
  if (!port.empty() && !parse_int(port, 1, 65535, &cfg.port)) return url_error(error, "bad port: " + std::string(port));
  if (!path.empty() && !parse_int(path, 0, 1 << 20, &cfg.db)) return url_error(error, "bad db: " + std::string(path));
  return cfg;
}

// --- redis_client ---

void redis_client::ctx_deleter::operator()(redisContext* c) const { redisFree(c); }

redis_client::redis_client(redis_config config, clock_fn clock)
    : config_(std::move(config)), clock_(clock ? std::move(clock) : clock_fn([] { return steady::now(); })) {
  assert(config_.breaker_failures >= 1);
}

redis_client::~redis_client() = default;

breaker_state redis_client::state() const {
  if (!open_) return breaker_state::closed;
  return clock_() - opened_at_ >= config_.breaker_open ? breaker_state::half_open : breaker_state::open;
}

std::optional<redis_error> redis_client::admit() {
  if (open_ && clock_() - opened_at_ < config_.breaker_open) {
    ++counters_.short_circuited;
    return redis_error{redis_errc::short_circuited, "circuit breaker open"};
  }
  return std::nullopt;  // closed, or half-open: this call is the probe
}

void redis_client::on_success() {
  consecutive_failures_ = 0;
  open_ = false;
}

redis_error redis_client::on_failure(redis_errc code, std::string message) {
  ++counters_.errors;
  if (code == redis_errc::timeout) ++counters_.timeouts;
  ++consecutive_failures_;
  // A failed half-open probe re-opens at once; a closed breaker opens at the threshold.
  if (open_ || consecutive_failures_ >= config_.breaker_failures) {
    open_ = true;
    opened_at_ = clock_();
    ++counters_.breaker_opens;
  }
  return redis_error{code, std::move(message)};
}

redis_error redis_client::fail_from_context(int saved_errno) {
  redis_errc code = ctx_->err == REDIS_ERR_IO && is_timeout_errno(saved_errno) ? redis_errc::timeout : redis_errc::io;
  std::string message = ctx_->errstr;
  ctx_.reset();
  return on_failure(code, std::move(message));
}

redis_error redis_client::ensure_connected() {
  if (ctx_) return {};
  timeval connect_tv = to_timeval(config_.connect_timeout);
  errno = 0;
  ctx_ptr ctx(config_.unix_socket.empty() ? redisConnectWithTimeout(config_.host.c_str(), config_.port, connect_tv)
                                          : redisConnectUnixWithTimeout(config_.unix_socket.c_str(), connect_tv));
  int saved_errno = errno;
  if (!ctx) return {redis_errc::connect, "out of memory allocating a redis context"};
  if (ctx->err) {
    bool timed_out = ctx->err == REDIS_ERR_IO && saved_errno == ETIMEDOUT;
    return {timed_out ? redis_errc::timeout : redis_errc::connect, std::string("connect: ") + ctx->errstr};
  }
  if (redisSetTimeout(ctx.get(), to_timeval(config_.command_timeout)) != REDIS_OK)
    return {redis_errc::connect, "setting the command timeout failed"};

  // AUTH and SELECT run on every (re)connect: a new connection starts unauthenticated in db 0.
  auto setup = [&](std::initializer_list<std::string_view> args, std::string_view what) -> redis_error {
    argv_buffer argv(args);
    errno = 0;
    reply_ptr r(static_cast<redisReply*>(redisCommandArgv(ctx.get(), argv.argc(), argv.ptrs.data(), argv.lens.data())));
    int e = errno;
    if (!r) {
      bool timed_out = ctx->err == REDIS_ERR_IO && is_timeout_errno(e);
      return {timed_out ? redis_errc::timeout : redis_errc::connect, std::string(what) + ": " + ctx->errstr};
    }
    if (r->type == REDIS_REPLY_ERROR)
      return {redis_errc::connect, std::string(what) + ": " + std::string(r->str, r->len)};
    return {};
  };
  if (!config_.password.empty()) {
    redis_error e = config_.user.empty() ? setup({"AUTH", config_.password}, "AUTH")
                                         : setup({"AUTH", config_.user, config_.password}, "AUTH");
    if (e.code != redis_errc::ok) return e;
  }
  if (config_.db != 0) {
    std::string db = std::to_string(config_.db);
    if (redis_error e = setup({"SELECT", db}, "SELECT"); e.code != redis_errc::ok) return e;
  }
  ctx_ = std::move(ctx);
  if (++counters_.connects > 1) ++counters_.reconnects;
  return {};
}

result<redis_reply> redis_client::command(std::initializer_list<std::string_view> args) {
  return command(std::span<const std::string_view>(args.begin(), args.size()));
}

result<redis_reply> redis_client::command(const std::vector<std::string>& args) {
  std::vector<std::string_view> views(args.begin(), args.end());
  return command(std::span<const std::string_view>(views));
}

result<redis_reply> redis_client::command(std::span<const std::string_view> args) {
  assert(!args.empty());
  if (auto e = admit()) return *e;
  auto t0 = steady::now();
  if (redis_error e = ensure_connected(); e.code != redis_errc::ok) {
    last_latency_ = steady::now() - t0;
    return on_failure(e.code, std::move(e.message));
  }
  argv_buffer argv(args);
  errno = 0;
  void* raw = redisCommandArgv(ctx_.get(), argv.argc(), argv.ptrs.data(), argv.lens.data());
  int saved_errno = errno;
  last_latency_ = steady::now() - t0;
  ++counters_.commands;
  if (!raw) return fail_from_context(saved_errno);
  reply_ptr reply(static_cast<redisReply*>(raw));
  redis_reply out = convert(*reply);
  if (out.is_error()) ++counters_.reply_errors;
  on_success();
  return out;
}

result<std::vector<redis_reply>> redis_client::pipeline(const std::vector<std::vector<std::string>>& cmds) {
  if (cmds.empty()) return std::vector<redis_reply>{};
  if (auto e = admit()) return *e;
  auto t0 = steady::now();
  if (redis_error e = ensure_connected(); e.code != redis_errc::ok) {
    last_latency_ = steady::now() - t0;
    return on_failure(e.code, std::move(e.message));
  }
  for (const auto& cmd : cmds) {
    assert(!cmd.empty());
    argv_buffer argv(cmd);
    if (redisAppendCommandArgv(ctx_.get(), argv.argc(), argv.ptrs.data(), argv.lens.data()) != REDIS_OK) {
      last_latency_ = steady::now() - t0;
      return fail_from_context(errno);
    }
  }
  ++counters_.commands;
  std::vector<redis_reply> out;
  out.reserve(cmds.size());
  for (size_t i = 0; i < cmds.size(); ++i) {
    void* raw = nullptr;
    errno = 0;
    int rc = redisGetReply(ctx_.get(), &raw);
    int saved_errno = errno;
    if (rc != REDIS_OK || !raw) {
      last_latency_ = steady::now() - t0;
      return fail_from_context(saved_errno);
    }
    reply_ptr reply(static_cast<redisReply*>(raw));
    out.push_back(convert(*reply));
    if (out.back().is_error()) ++counters_.reply_errors;
  }
  last_latency_ = steady::now() - t0;
  on_success();
  return out;
}

}  // namespace sy::cache
