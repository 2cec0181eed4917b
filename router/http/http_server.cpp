// The router's HTTP/1.1 server over Boost.Beast's request parser and Boost.Asio sockets.
//
// Ownership: a `connection` is owned by shared_ptrs held in its own pending completion handlers
// (read, write, timer) and, transiently, by work posted to its strand; when its last operation
// completes after close() it is destroyed. The server keeps only weak_ptrs to live connections
// (to close them on stop()). An `exchange` is owned by the connection (current_) and by the
// handler's copies; it refers back to its connection only through a weak_ptr, so a handler that
// never answers leaks nothing once the client is gone and the handler drops its copy.
//
// Threads: every connection's state is touched only on its strand. Exchange methods may be
// called from any thread: they check a few atomics, then post the work to the connection's
// strand, which checks again that the exchange is still the one being answered.
//
// Bytes in: one read at a time into `in_`, also while a response is pending (to notice a client
// that closes or resets at once); bytes read then (a pipelined request) stay in `in_` and are
// parsed once the response has been written. Bytes out: `out_pending_` collects everything queued
// while a write is in flight; the next write sends all of it at once. A stream's catch-up
// (send_events) waits in `paced_` instead and moves into `out_pending_` a slice at a time, each
// when the write before it completed; whatever is queued while `paced_` is not empty goes behind
// it, so the order on the wire is the order of the calls.
//
// Clients that stop reading: while a response is being written a periodic check compares the
// bytes handed to the kernel with what is still in the socket's send queue (SIOCOUTQ); the
// difference is what the client's TCP stack acknowledged. No progress for write_stall_timeout
// while bytes are pending closes the connection as a disconnect, so a stuck client holds its
// worker slot and KV for at most that long, and its queued bytes are bounded
// (max_stream_buffer_bytes in the process, the kernel's send buffer outside it).
#include "router/http/http_server.hpp"

#include "router/base/api_error.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <unordered_map>

#include <sys/ioctl.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>

namespace sy::router {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using error_code = boost::system::error_code;
using steady = std::chrono::steady_clock;

using strand_t = asio::strand<asio::io_context::executor_type>;
using socket_t = tcp::socket::rebind_executor<strand_t>::other;
using steady_timer_t = asio::steady_timer::rebind_executor<strand_t>::other;
using acceptor_t = tcp::acceptor::rebind_executor<strand_t>::other;

// Bytes a connection reads ahead beyond a request header while a response is pending (a
// pipelining client); past this the connection stops reading until the response is written.
constexpr size_t read_ahead_bytes = 64u << 10;
constexpr size_t read_chunk_bytes = 16u << 10;
// After an error response that closes the connection: how long unread request bytes are drained
// so that closing does not reset the connection before the client has read the response.
constexpr std::chrono::milliseconds linger_time{1000};

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Extra headers from the handler must not break framing or inject lines.
bool header_allowed(std::string_view name, std::string_view value) {
  if (name.empty()) return false;
  for (char c : name)
    if (c <= ' ' || c == ':' || c == 0x7f) return false;
  for (char c : value)
    if (c == '\r' || c == '\n' || c == '\0') return false;
  static constexpr std::string_view reserved[] = {"content-length", "transfer-encoding", "connection", "server"};
  for (auto r : reserved)
    if (iequals(name, r)) return false;
  return true;
}

void append_status_line(std::string& out, int status) {
  out += "HTTP/1.1 ";
  out += std::to_string(status);
  out += ' ';
  const auto s = http::int_to_status(static_cast<unsigned>(status));
  if (s == http::status::unknown) {
    out += "Unknown";
  } else {
    const auto reason = http::obsolete_reason(s);
    out.append(reason.data(), reason.size());
  }
  out += "\r\n";
}

void append_header(std::string& out, std::string_view name, std::string_view value) {
  out += name;
  out += ": ";
  out += value;
  out += "\r\n";
}

void append_chunk(std::string& out, std::string_view prefix, std::string_view data, std::string_view suffix) {
  char size[24];
  std::snprintf(size, sizeof size, "%zx\r\n", prefix.size() + data.size() + suffix.size());
  out += size;
  out += prefix;
  out += data;
  out += suffix;
  out += "\r\n";
}

class connection;

// What connections share with the server. Outlives every connection (see http_server::impl).
struct server_core {
  http_server_config config;
  http_handler handler;
  http_counters counters;
  std::atomic<bool> stopping{false};
  std::atomic<bool> closing{false};  // close_keep_alive(): every connection ends after its response
  std::mutex registry_mu;
  std::unordered_map<const void*, std::weak_ptr<connection>> registry;  // guarded by registry_mu
  std::mutex address_mu;
  std::unordered_map<std::string, size_t> per_address;  // open connections by client IP; guarded by address_mu

  // Takes `n` bytes of the body budget; false (nothing taken) when they do not fit.
  bool reserve_body(size_t n) {
    const size_t cap = config.max_inflight_body_bytes;
    if (cap == 0) return true;
    uint64_t cur = counters.body_bytes_inflight.load();
    do {
      if (cur + n > cap && cur > 0) return false;  // one body alone always fits an empty budget
    } while (!counters.body_bytes_inflight.compare_exchange_weak(cur, cur + n));
    return true;
  }
  void release_body(size_t n) {
    if (config.max_inflight_body_bytes != 0 && n > 0) counters.body_bytes_inflight.fetch_sub(n);
  }
  // Counts a connection from `ip`; false when that address is at its cap.
  bool admit_address(const std::string& ip) {
    if (config.max_connections_per_address == 0) return true;
    std::lock_guard lock(address_mu);
    size_t& n = per_address[ip];
    if (n >= config.max_connections_per_address) return false;
    ++n;
    return true;
  }
  void leave_address(const std::string& ip) {
    if (config.max_connections_per_address == 0) return;
    std::lock_guard lock(address_mu);
    const auto f = per_address.find(ip);
    if (f != per_address.end() && --f->second == 0) per_address.erase(f);
  }
};

// The client's IP ("" when the socket has no peer any more).
std::string peer_ip(const socket_t& socket) {
  error_code ec;
  const auto ep = socket.remote_endpoint(ec);
  return ec ? std::string() : ep.address().to_string();
}

class exchange;

class connection : public std::enable_shared_from_this<connection> {
 public:
  // `ip`: the address admit_address() counted it under (released when it is destroyed).
  connection(server_core& core, socket_t socket, std::string ip)
      : core_(core), socket_(std::move(socket)), timer_(socket_.get_executor()), ip_(std::move(ip)) {
    core_.counters.connections_open.fetch_add(1, std::memory_order_relaxed);
    error_code ec;
    const auto ep = socket_.remote_endpoint(ec);
    if (!ec) {
      const auto addr = ep.address();
      remote_ = addr.is_v6() ? "[" + addr.to_string() + "]" : addr.to_string();
      remote_ += ":" + std::to_string(ep.port());
    }
    socket_.set_option(tcp::no_delay(true), ec);
  }

  ~connection() {
    {
      std::lock_guard lock(core_.registry_mu);
      core_.registry.erase(this);
    }
    core_.release_body(std::exchange(body_reserved_, 0));
    core_.leave_address(ip_);
    core_.counters.connections_open.fetch_sub(1, std::memory_order_relaxed);
  }

  connection(const connection&) = delete;
  connection& operator=(const connection&) = delete;

  strand_t executor() { return socket_.get_executor(); }

  // Registers with the server and starts reading the first request; closes at once when the
  // server is stopping. Runs on the strand (or before any operation started).
  void start() {
    {
      std::lock_guard lock(core_.registry_mu);
      if (core_.stopping.load()) {
        close();
        return;
      }
      core_.registry.emplace(this, weak_from_this());
    }
    // The first request's header deadline runs from the accept.
    new_parser();
    phase_ = phase::header;
    arm(core_.config.header_timeout, deadline::header);
    do_read();
  }

  // close_keep_alive(): on the strand. A connection between requests closes now; one reading
  // or answering a request closes after its response.
  void close_if_idle() {
    if (phase_ == phase::idle) begin_linger_close();
  }

  // Server stop: on the strand.
  void close_by_server() {
    abandon_exchange(false);
    close();
  }

  // Exchange work, on the strand. Each first checks that `e` is still being answered.
  void write_response(const exchange* e, http_response r);
  void write_stream_head(const exchange* e, int status, std::vector<std::pair<std::string, std::string>> headers);
  void write_event(const exchange* e, std::string data, steady::time_point t_received);
  void write_events(const exchange* e, std::vector<std::string> data);
  void append_event(std::string& out, std::string_view data) const;  // one SSE event, framed
  void write_stream_end(const exchange* e);

 private:
  // idle: between keep-alive requests, nothing of the next one read yet (idle_timeout).
  // header, body: reading a request (header_timeout, body_timeout).
  // waiting: the request went to the handler; its response is pending or being written.
  // lingering: an error response was queued; the connection closes after it, draining input.
  enum class phase { idle, header, body, waiting, lingering, closed };
  enum class deadline { idle, header, body, linger, write_check };
  enum class response_state { none, streaming, ended };

  void new_parser() {
    header_checked_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(std::min<size_t>(core_.config.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(core_.config.max_body_bytes);
  }

  void arm(std::chrono::milliseconds d, deadline kind) {
    const auto gen = ++timer_gen_;
    timer_.expires_after(d);
    timer_.async_wait([self = shared_from_this(), gen, kind](error_code ec) {
      if (ec || gen != self->timer_gen_ || self->phase_ == phase::closed) return;
      self->on_deadline(kind);
    });
  }

  void disarm() {
    ++timer_gen_;
    timer_.cancel();
  }

  void on_deadline(deadline kind) {
    switch (kind) {
      case deadline::idle:
      case deadline::header:
        core_.counters.timeouts.fetch_add(1, std::memory_order_relaxed);
        close();
        break;
      case deadline::body:
        core_.counters.timeouts.fetch_add(1, std::memory_order_relaxed);
        send_error_and_close(
            408, "request body not received within " + std::to_string(core_.config.body_timeout.count()) + " ms",
            "request_timeout");
        break;
      case deadline::linger:
        close();
        break;
      case deadline::write_check:
        check_write_progress();
        break;
    }
  }

  // The stall check's period: a few looks per timeout, never busier than 20/s.
  std::chrono::milliseconds write_check_period() const {
    return std::clamp(core_.config.write_stall_timeout / 4, std::chrono::milliseconds(50),
                      std::chrono::milliseconds(1000));
  }

  // A response started (phase waiting): watch that its bytes reach the client.
  void start_write_checks() {
    if (core_.config.write_stall_timeout.count() <= 0) return;
    last_delivered_ = delivered_bytes();
    last_progress_ = steady::now();
    arm(write_check_period(), deadline::write_check);
  }

  // Bytes the client's TCP stack acknowledged so far (handed to the kernel minus what is still
  // in the send queue); without the ioctl, what was handed to the kernel.
  uint64_t delivered_bytes() {
    int queued = 0;
    if (::ioctl(socket_.native_handle(), TIOCOUTQ, &queued) != 0 || queued < 0) queued = 0;
    return to_kernel_ - std::min<uint64_t>(to_kernel_, static_cast<uint64_t>(queued));
  }

  void check_write_progress() {
    if (phase_ != phase::waiting) return;
    const auto now = steady::now();
    const uint64_t delivered = delivered_bytes();
    const bool pending = writing_ || delivered < to_kernel_;
    if (delivered != last_delivered_ || !pending) {  // moving, or nothing to move: not stalled
      last_delivered_ = delivered;
      last_progress_ = now;
    } else if (now - last_progress_ >= core_.config.write_stall_timeout) {
      core_.counters.write_stalls.fetch_add(1, std::memory_order_relaxed);
      abandon_exchange(true);
      close();
      return;
    }
    arm(write_check_period(), deadline::write_check);
  }

  void do_read() {
    if (reading_ || phase_ == phase::closed) return;
    size_t room = read_chunk_bytes;
    if (phase_ != phase::lingering) {
      const size_t cap = core_.config.max_header_bytes + read_ahead_bytes;
      if (in_.size() >= cap) return;  // paused; resumed by start_next_request()
      room = std::min(room, cap - in_.size());
    }
    reading_ = true;
    // Into a buffer of its own: the read stays pending while in_ is consumed (the next request
    // parsed) or shrunk, which moves or frees the region in_.prepare() would have handed out.
    socket_.async_read_some(asio::buffer(read_buf_.data(), room), [self = shared_from_this()](error_code ec, size_t n) {
      self->reading_ = false;
      self->on_read(ec, n);
    });
  }

  void on_read(error_code ec, size_t n) {
    if (phase_ == phase::closed) return;
    if (ec) {
      on_read_error();
      return;
    }
    if (phase_ != phase::lingering) {
      std::memcpy(in_.prepare(n).data(), read_buf_.data(), n);
      in_.commit(n);
    }
    switch (phase_) {
      case phase::idle:
        phase_ = phase::header;
        arm(core_.config.header_timeout, deadline::header);
        parse_input();
        break;
      case phase::header:
      case phase::body:
        parse_input();
        break;
      case phase::waiting:  // keep the bytes for the next request
        break;
      case phase::lingering:
        in_.consume(in_.size());
        break;
      case phase::closed:
        return;
    }
    do_read();
  }

  // EOF or reset.
  void on_read_error() {
    if (phase_ == phase::waiting) abandon_exchange(true);
    close();
  }

  // Feeds buffered bytes to the parser until it needs more, fails, or has a whole request.
  void parse_input() {
    while (phase_ == phase::header || phase_ == phase::body) {
      error_code ec;
      size_t used = 0;
      if (in_.size() > 0) {
        used = parser_->put(in_.data(), ec);
        in_.consume(used);
      } else if (!parser_->is_done()) {
        return;
      }
      if (ec == http::error::need_more) return;
      if (ec) {
        fail_request(ec);
        return;
      }
      if (phase_ == phase::header && parser_->is_header_done()) {
        if (!on_header_done()) return;
      }
      if (parser_->is_done()) {
        dispatch();
        return;
      }
      if (used == 0) return;
    }
  }

  // Checks a complete header; false when the request was refused.
  bool on_header_done() {
    const auto& msg = parser_->get();
    int te_count = 0;
    bool te_ok = true;
    for (const auto& f : msg) {
      if (f.name() != http::field::transfer_encoding) continue;
      ++te_count;
      const auto v = f.value();
      te_ok = te_ok && iequals(trim(std::string_view(v.data(), v.size())), "chunked");
    }
    if (te_count > 1 || !te_ok) {
      core_.counters.bad_requests.fetch_add(1, std::memory_order_relaxed);
      send_error_and_close(400, "unsupported Transfer-Encoding", "bad_request");
      return false;
    }
    if (core_.config.on_header) {
      std::optional<http_response> refusal;
      try {
        refusal = core_.config.on_header(request_head(msg));
      } catch (...) {  // a hook that throws lets the request go on to the handler
      }
      if (refusal) {
        core_.counters.refused_at_header.fetch_add(1, std::memory_order_relaxed);
        refuse(std::move(*refusal));
        return false;
      }
      header_checked_ = true;
    }
    if (!parser_->is_done()) {
      // The body's room in the budget, before a byte of it is read.
      const auto declared = parser_->content_length();
      const size_t want = declared ? static_cast<size_t>(*declared) : core_.config.max_body_bytes;
      if (!core_.reserve_body(want)) {
        core_.counters.body_budget_refusals.fetch_add(1, std::memory_order_relaxed);
        refuse(error_response(make_error(503, "overloaded_error", "router_busy",
                                         "the router is reading as many request bodies as it can hold; retry shortly"),
                              {}));
        return false;
      }
      body_reserved_ = want;
    }
    phase_ = phase::body;
    if (parser_->is_done()) return true;
    arm(core_.config.body_timeout, deadline::body);
    const auto expect = msg[http::field::expect];
    if (msg.version() >= 11 && in_.size() == 0 &&
        iequals(trim(std::string_view(expect.data(), expect.size())), "100-continue"))
      queue_write("HTTP/1.1 100 Continue\r\n\r\n", false, {});
    return true;
  }

  void fail_request(error_code ec) {
    core_.counters.bad_requests.fetch_add(1, std::memory_order_relaxed);
    if (ec == http::error::header_limit) {
      send_error_and_close(431, "request header exceeds " + std::to_string(core_.config.max_header_bytes) + " bytes",
                           "header_too_large");
    } else if (ec == http::error::body_limit) {
      send_error_and_close(413, "request body exceeds " + std::to_string(core_.config.max_body_bytes) + " bytes",
                           "body_too_large");
    } else {
      send_error_and_close(400, "malformed HTTP request: " + ec.message(), "bad_request");
    }
  }

  // An error while reading a request: no exchange exists; the connection ends after it.
  void send_error_and_close(int status, const std::string& message, std::string_view code) {
    const char* type = status == 408 ? "timeout_error" : "invalid_request_error";
    refuse(error_response(make_error(status, type, std::string(code), message), {}));
  }

  // Answers a request that will not be read to its end; the connection ends after it.
  void refuse(http_response r) {
    core_.release_body(std::exchange(body_reserved_, 0));
    close_after_response_ = true;
    head_only_ = false;
    parser_.reset();
    disarm();
    phase_ = phase::lingering;
    in_.consume(in_.size());
    queue_write(serialize(std::move(r)), true, {});
  }

  // A whole request was read: hand it to the handler.
  void dispatch();
  http_request request_head(const http::request_parser<http::string_body>::value_type& msg) const;
  void call_handler(const std::shared_ptr<exchange>& ex, http_request&& req);

  std::string serialize(http_response r) const {
    if (r.status < 100 || r.status > 999) r.status = 500;
    const bool no_body = r.status < 200 || r.status == 204 || r.status == 304;
    std::string out;
    out.reserve(160 + r.body.size());
    append_status_line(out, r.status);
    append_header(out, "Server", "switchyard");
    if (!no_body) {
      append_header(out, "Content-Type", r.content_type);
      append_header(out, "Content-Length", std::to_string(r.body.size()));
    }
    for (const auto& [k, v] : r.headers)
      if (header_allowed(k, v)) append_header(out, k, v);
    append_header(out, "Connection", close_after_response_ ? "close" : "keep-alive");
    out += "\r\n";
    if (!no_body && !head_only_) out += r.body;
    return out;
  }

  void queue_write(std::string_view bytes, bool ends_response, steady::time_point t_received) {
    if (!paced_.empty()) {  // behind a catch-up still being written
      paced_.push_back({std::string(bytes), ends_response, true, t_received});
      paced_live_bytes_ += bytes.size();
      return;
    }
    out_pending_ += bytes;
    if (t_received != steady::time_point{}) stamps_pending_.push_back(t_received);
    if (ends_response) pending_ends_response_ = true;
    if (!writing_) flush();
  }

  void flush() {
    if (phase_ == phase::closed) return;
    // The next slice of a catch-up, now that the write before it completed.
    while (!paced_.empty() && out_pending_.size() < paced_slice_bytes && !pending_ends_response_) {
      paced_part& p = paced_.front();
      out_pending_ += p.bytes;
      if (p.live) paced_live_bytes_ -= p.bytes.size();
      if (p.t_received != steady::time_point{}) stamps_pending_.push_back(p.t_received);
      if (p.ends_response) pending_ends_response_ = true;
      paced_.pop_front();
    }
    if (out_pending_.empty()) {
      if (std::exchange(pending_ends_response_, false)) response_done();  // nothing left to send
      return;
    }
    writing_ = true;
    std::swap(out_inflight_, out_pending_);
    out_pending_.clear();
    std::swap(stamps_inflight_, stamps_pending_);
    stamps_pending_.clear();
    inflight_ends_response_ = std::exchange(pending_ends_response_, false);
    inflight_sent_ = 0;
    write_some();
  }

  // One write at a time until out_inflight_ is in the kernel; counting each part (to_kernel_)
  // is what lets the stall check see a client's progress inside a long write.
  void write_some() {
    socket_.async_write_some(
        asio::buffer(out_inflight_.data() + inflight_sent_, out_inflight_.size() - inflight_sent_),
        [self = shared_from_this()](error_code ec, size_t n) {
          self->to_kernel_ += n;
          self->inflight_sent_ += n;
          if (!ec && self->phase_ != phase::closed && self->inflight_sent_ < self->out_inflight_.size()) {
            self->write_some();
            return;
          }
          self->writing_ = false;
          self->on_write(ec);
        });
  }

  void on_write(error_code ec) {
    if (phase_ == phase::closed) return;
    if (ec) {
      if (phase_ == phase::waiting) abandon_exchange(true);
      close();
      return;
    }
    if (!stamps_inflight_.empty()) {
      const auto now = steady::now();
      if (core_.config.on_written) {
        for (const auto t : stamps_inflight_) {
          try {
            core_.config.on_written(std::max(0.0, std::chrono::duration<double>(now - t).count()));
          } catch (...) {  // an observer must not take the connection down
          }
        }
      }
      stamps_inflight_.clear();
    }
    // Keep idle connections small: a long response's buffer is not kept around.
    if (out_inflight_.capacity() > (64u << 10)) {
      std::string().swap(out_inflight_);
    } else {
      out_inflight_.clear();
    }
    if (inflight_ends_response_) {
      inflight_ends_response_ = false;
      response_done();
      return;
    }
    flush();
  }

  // The last byte of a response was written.
  void response_done() {
    current_.reset();
    response_ = response_state::none;
    if (close_after_response_ || core_.closing.load()) {
      begin_linger_close();
      return;
    }
    start_next_request();
  }

  void start_next_request() {
    new_parser();
    if (in_.size() > 0) {
      phase_ = phase::header;
      arm(core_.config.header_timeout, deadline::header);
      parse_input();
    } else {
      if (in_.capacity() > 2 * read_chunk_bytes) in_.shrink_to_fit();
      phase_ = phase::idle;
      arm(core_.config.idle_timeout, deadline::idle);
    }
    do_read();
  }

  void begin_linger_close() {
    phase_ = phase::lingering;
    in_.consume(in_.size());
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) {
      close();
      return;
    }
    arm(linger_time, deadline::linger);
    do_read();
  }

  // The connection ends before the response did: tell the handler (once).
  void abandon_exchange(bool by_client);

  void close() {
    if (phase_ == phase::closed) return;
    core_.release_body(std::exchange(body_reserved_, 0));
    phase_ = phase::closed;
    disarm();
    error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    current_.reset();
    parser_.reset();
    out_pending_.clear();
    stamps_pending_.clear();
    paced_.clear();
    paced_live_bytes_ = 0;
  }

  server_core& core_;
  socket_t socket_;
  steady_timer_t timer_;
  std::string remote_;
  std::string ip_;            // as counted by server_core::admit_address
  size_t body_reserved_ = 0;  // of the body budget, while this request's body is read
  uint64_t timer_gen_ = 0;    // a deadline fires only if no later arm()/disarm() happened
  phase phase_ = phase::idle;
  beast::flat_buffer in_;
  std::optional<http::request_parser<http::string_body>> parser_;
  bool reading_ = false;  // an async_read_some is in flight (into read_buf_)
  std::array<char, read_chunk_bytes> read_buf_;
  bool writing_ = false;                // out_inflight_ is being written (write_some)
  size_t inflight_sent_ = 0;            // bytes of out_inflight_ in the kernel
  uint64_t to_kernel_ = 0;              // every byte the socket accepted, for the stall check
  uint64_t last_delivered_ = 0;         // delivered_bytes() when progress was last seen
  steady::time_point last_progress_{};  // when it was seen
  std::string out_pending_, out_inflight_;
  std::vector<steady::time_point> stamps_pending_, stamps_inflight_;  // send_event t_received
  bool pending_ends_response_ = false, inflight_ends_response_ = false;
  // A catch-up being written a slice at a time, and what was queued behind it.
  struct paced_part {
    std::string bytes;
    bool ends_response = false;
    bool live = false;  // queued by send_event/end_stream behind the catch-up: counts toward the cap
    steady::time_point t_received{};
  };
  static constexpr size_t paced_slice_bytes = 64u << 10;
  std::deque<paced_part> paced_;
  size_t paced_live_bytes_ = 0;
  // About the request being answered:
  bool close_after_response_ = false;
  bool http10_ = false;  // no chunked encoding: a stream ends by closing
  bool head_only_ = false;
  bool header_checked_ = false;  // on_header let the request being read through
  response_state response_ = response_state::none;
  std::shared_ptr<exchange> current_;
};

class exchange final : public http_exchange, public std::enable_shared_from_this<exchange> {
 public:
  explicit exchange(std::weak_ptr<connection> conn) : conn_(std::move(conn)) {}

  void respond(http_response r) override {
    if (!advance(state::fresh, state::ended)) return;
    post([r = std::move(r)](connection& c, const exchange* e) mutable { c.write_response(e, std::move(r)); });
  }

  void start_stream(int status, std::vector<std::pair<std::string, std::string>> headers) override {
    if (!advance(state::fresh, state::streaming)) return;
    post([status, h = std::move(headers)](connection& c, const exchange* e) mutable {
      c.write_stream_head(e, status, std::move(h));
    });
  }

  void send_event(std::string data, steady::time_point t_received) override {
    if (state_.load() != state::streaming || disconnected_.load()) return;
    post([d = std::move(data), t_received](connection& c, const exchange* e) mutable {
      c.write_event(e, std::move(d), t_received);
    });
  }

  void send_events(std::vector<std::string> data) override {
    if (state_.load() != state::streaming || disconnected_.load() || data.empty()) return;
    post([d = std::move(data)](connection& c, const exchange* e) mutable { c.write_events(e, std::move(d)); });
  }

  void end_stream() override {
    if (!advance(state::streaming, state::ended)) return;
    post([](connection& c, const exchange* e) { c.write_stream_end(e); });
  }

  void on_disconnect(std::function<void()> f) override {
    std::unique_lock lock(mu_);
    if (!disconnected_.load()) {
      if (state_.load() != state::ended) on_disconnect_ = std::move(f);
      return;
    }
    // Set after the client had gone: the only chance left to tell the caller is now.
    if (fired_) return;
    fired_ = true;
    lock.unlock();
    if (f) f();
  }

  bool disconnected() const override { return disconnected_.load(); }

  bool streaming() const { return state_.load() == state::streaming; }

  // On the strand, when the connection ends before the response did. Returns the callback to
  // run (empty when the handler had ended the response or set none).
  std::function<void()> mark_disconnected() {
    std::lock_guard lock(mu_);
    disconnected_.store(true);
    auto f = std::exchange(on_disconnect_, nullptr);
    fired_ = static_cast<bool>(f);  // none yet: one set later runs at once (on_disconnect)
    return f;
  }

 private:
  enum class state { fresh, streaming, ended };

  // The response's state moves fresh -> (streaming ->) ended once; the handler's callback is
  // dropped when it ends, which also breaks a cycle through a callback capturing the exchange.
  bool advance(state from, state to) {
    if (disconnected_.load()) return false;
    if (!state_.compare_exchange_strong(from, to)) return false;
    if (to == state::ended) {
      std::function<void()> drop;
      std::lock_guard lock(mu_);
      drop = std::exchange(on_disconnect_, nullptr);
    }
    return true;
  }

  template <class F>
  void post(F f) {
    auto c = conn_.lock();
    if (!c) return;
    auto ex = c->executor();
    asio::post(ex, [c = std::move(c), self = shared_from_this(), f = std::move(f)]() mutable { f(*c, self.get()); });
  }

  std::weak_ptr<connection> conn_;
  std::atomic<state> state_{state::fresh};
  std::atomic<bool> disconnected_{false};
  std::mutex mu_;
  std::function<void()> on_disconnect_;  // guarded by mu_
  bool fired_ = false;                   // guarded by mu_
};

void connection::dispatch() {
  core_.release_body(std::exchange(body_reserved_, 0));  // the body is the handler's now
  auto& msg = parser_->get();
  http_request req = request_head(msg);
  req.body = std::move(msg.body());
  req.header_checked = header_checked_;
  req.received = steady::now();
  http10_ = msg.version() < 11;
  head_only_ = msg.method() == http::verb::head;
  close_after_response_ = !msg.keep_alive() || core_.stopping.load() || core_.closing.load();
  parser_.reset();
  disarm();
  phase_ = phase::waiting;
  response_ = response_state::none;
  core_.counters.requests.fetch_add(1, std::memory_order_relaxed);

  auto ex = std::make_shared<exchange>(weak_from_this());
  current_ = ex;
  call_handler(ex, std::move(req));
}

http_request connection::request_head(const http::request_parser<http::string_body>::value_type& msg) const {
  http_request req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  req.path = req.target.substr(0, req.target.find('?'));
  req.headers.reserve(std::distance(msg.begin(), msg.end()));
  for (const auto& f : msg) {
    std::string name(f.name_string());
    for (auto& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    req.headers.emplace_back(std::move(name), std::string(f.value()));
  }
  req.remote = remote_;
  return req;
}

void connection::call_handler(const std::shared_ptr<exchange>& ex, http_request&& req) {
  try {
    if (!core_.handler) throw std::logic_error("no handler");
    core_.handler(ex, std::move(req));
    return;
  } catch (...) {
  }
  // The handler threw: answer for it if it had not answered, or end its stream.
  if (ex->streaming()) {
    ex->end_stream();
    close_after_response_ = true;
  } else {
    ex->respond(error_response(make_error(500, "server_error", "internal_error", "internal server error"), {}));
  }
}

void connection::abandon_exchange(bool by_client) {
  auto ex = std::move(current_);
  if (!ex) return;
  // A response the handler had ended (only its last writes pending) was not abandoned: a client
  // that closes on reading its last byte can beat on_write's completion to the strand.
  if (by_client && response_ != response_state::ended)
    core_.counters.client_disconnects.fetch_add(1, std::memory_order_relaxed);
  auto f = ex->mark_disconnected();
  if (!f) return;
  try {
    f();
  } catch (...) {  // a callback must not take the I/O thread down
  }
}

void connection::write_response(const exchange* e, http_response r) {
  if (phase_ != phase::waiting || current_.get() != e || response_ != response_state::none) return;
  response_ = response_state::ended;
  if (core_.closing.load()) close_after_response_ = true;
  queue_write(serialize(std::move(r)), true, {});
  if (phase_ == phase::waiting) start_write_checks();
}

void connection::write_stream_head(const exchange* e, int status,
                                   std::vector<std::pair<std::string, std::string>> headers) {
  if (phase_ != phase::waiting || current_.get() != e || response_ != response_state::none) return;
  response_ = response_state::streaming;
  if (status < 100 || status > 999) status = 500;
  if (http10_ || core_.closing.load()) close_after_response_ = true;
  std::string out;
  append_status_line(out, status);
  append_header(out, "Server", "switchyard");
  append_header(out, "Content-Type", "text/event-stream");
  append_header(out, "Cache-Control", "no-cache");
  append_header(out, "X-Accel-Buffering", "no");
  if (!http10_) append_header(out, "Transfer-Encoding", "chunked");
  for (const auto& [k, v] : headers)
    if (header_allowed(k, v) && !iequals(k, "content-type") && !iequals(k, "cache-control")) append_header(out, k, v);
  append_header(out, "Connection", close_after_response_ ? "close" : "keep-alive");
  out += "\r\n";
  queue_write(out, false, {});
  start_write_checks();
}

void connection::append_event(std::string& out, std::string_view data) const {
  // An event that brings its own field lines ("event: NAME\ndata: ...", the Anthropic API's) is
  // written as it is; others get "data: ".
  const std::string_view prefix = data.starts_with("event: ") ? "" : "data: ";
  if (http10_) {
    out += prefix;
    out += data;
    out += "\n\n";
  } else {
    append_chunk(out, prefix, data, "\n\n");
  }
}

void connection::write_event(const exchange* e, std::string data, steady::time_point t_received) {
  if (phase_ != phase::waiting || current_.get() != e || response_ != response_state::streaming) return;
  if (head_only_) return;
  std::string out;
  out.reserve(data.size() + 32);
  append_event(out, data);
  if (writing_ && out_pending_.size() + paced_live_bytes_ + out.size() > core_.config.max_stream_buffer_bytes) {
    // The client does not keep up with its own stream: end it as a disconnect.
    core_.counters.stream_overflows.fetch_add(1, std::memory_order_relaxed);
    abandon_exchange(true);
    close();
    return;
  }
  queue_write(out, false, t_received);
}

void connection::write_events(const exchange* e, std::vector<std::string> data) {
  if (phase_ != phase::waiting || current_.get() != e || response_ != response_state::streaming) return;
  if (head_only_) return;
  // Slices of about paced_slice_bytes, behind whatever is queued already.
  std::string slice;
  for (const auto& d : data) {
    append_event(slice, d);
    if (slice.size() >= paced_slice_bytes) paced_.push_back({std::exchange(slice, {}), false, false, {}});
  }
  if (!slice.empty()) paced_.push_back({std::move(slice), false, false, {}});
  if (!writing_) flush();
}

void connection::write_stream_end(const exchange* e) {
  if (phase_ != phase::waiting || current_.get() != e || response_ != response_state::streaming) return;
  response_ = response_state::ended;
  queue_write(http10_ || head_only_ ? std::string_view() : std::string_view("0\r\n\r\n"), true, {});
}

}  // namespace

struct http_server::impl {
  // Declared first so it outlives the io_context, whose destruction may destroy connections.
  server_core core;
  asio::io_context ioc;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  acceptor_t acceptor;
  steady_timer_t accept_backoff;
  std::vector<std::thread> threads;
  int port = 0;
  std::mutex stop_mu;
  bool stopped = false;  // guarded by stop_mu

  impl(http_server_config config, http_handler handler)
      : ioc(std::max(1, config.threads)), acceptor(asio::make_strand(ioc)), accept_backoff(acceptor.get_executor()) {
    core.config = std::move(config);
    core.handler = std::move(handler);
    bind();
  }

  void bind() {
    const auto& c = core.config;
    const std::string where = c.host + ":" + std::to_string(c.port);
    error_code ec;
    tcp::resolver resolver(ioc);
    const auto results =
        resolver.resolve(c.host, std::to_string(c.port), tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || results.empty())
      throw std::runtime_error("http_server: cannot resolve " + where + ": " + (ec ? ec.message() : "no address"));
    std::string last_error = "no address";
    for (const auto& entry : results) {
      const auto ep = entry.endpoint();
      acceptor.close(ec);
      acceptor.open(ep.protocol(), ec);
      if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
      if (!ec) acceptor.bind(ep, ec);
      if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
      if (ec) {
        last_error = ec.message();
        continue;
      }
      port = acceptor.local_endpoint().port();
      return;
    }
    acceptor.close(ec);
    throw std::runtime_error("http_server: cannot bind " + where + ": " + last_error);
  }

  void start() {
    work.emplace(ioc.get_executor());
    asio::post(acceptor.get_executor(), [this] { do_accept(); });
    const int n = std::max(1, core.config.threads);
    threads.reserve(n);
    for (int i = 0; i < n; ++i) threads.emplace_back([this] { run(); });
  }

  void run() {
    for (;;) {
      try {
        ioc.run();
        return;
      } catch (...) {  // nothing a request does may end an I/O thread; keep serving
      }
    }
  }

  // On the acceptor's strand.
  void do_accept() {
    if (core.stopping.load()) return;
    acceptor.async_accept(asio::make_strand(ioc), [this](error_code ec, socket_t socket) {
      if (ec == asio::error::operation_aborted || core.stopping.load()) return;
      if (ec) {  // e.g. out of file descriptors: back off instead of spinning
        accept_backoff.expires_after(std::chrono::milliseconds(50));
        accept_backoff.async_wait([this](error_code ec2) {
          if (!ec2) do_accept();
        });
        return;
      }
      std::string ip = peer_ip(socket);
      if (core.counters.connections_open.load() >= core.config.max_connections) {
        core.counters.connections_refused.fetch_add(1, std::memory_order_relaxed);
        error_code ignored;
        socket.close(ignored);
      } else if (!core.admit_address(ip)) {
        core.counters.connections_refused_per_address.fetch_add(1, std::memory_order_relaxed);
        error_code ignored;
        socket.close(ignored);
      } else {
        core.counters.connections_accepted.fetch_add(1, std::memory_order_relaxed);
        auto c = std::make_shared<connection>(core, std::move(socket), std::move(ip));
        asio::post(c->executor(), [c] { c->start(); });
      }
      do_accept();
    });
  }

  void close_keep_alive() {
    std::vector<std::weak_ptr<connection>> live;
    {
      std::lock_guard lock(core.registry_mu);
      core.closing.store(true);
      live.reserve(core.registry.size());
      for (const auto& [key, weak] : core.registry) live.push_back(weak);
    }
    for (const auto& weak : live) {
      if (auto c = weak.lock()) {
        auto ex = c->executor();
        asio::post(ex, [c = std::move(c)] { c->close_if_idle(); });
      }
    }
  }

  void stop() {
    std::lock_guard stop_lock(stop_mu);
    if (stopped) return;
    stopped = true;
    std::vector<std::weak_ptr<connection>> live;
    {
      std::lock_guard lock(core.registry_mu);
      core.stopping.store(true);
      live.reserve(core.registry.size());
      for (const auto& [key, weak] : core.registry) live.push_back(weak);
    }
    asio::post(acceptor.get_executor(), [this] {
      error_code ec;
      acceptor.close(ec);
      accept_backoff.cancel();
    });
    for (const auto& weak : live) {
      if (auto c = weak.lock()) {
        auto ex = c->executor();
        asio::post(ex, [c = std::move(c)] { c->close_by_server(); });
      }
    }
    work.reset();
    // Let the closes run (handlers see their connections go); then stop whatever is left.
    const auto give_up = steady::now() + std::chrono::seconds(2);
    while (core.counters.connections_open.load() > 0 && steady::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ioc.stop();
    for (auto& t : threads)
      if (t.joinable()) t.join();
  }
};

http_server::http_server(http_server_config config, http_handler handler)
    : impl_(std::make_unique<impl>(std::move(config), std::move(handler))) {
  impl_->start();
}

http_server::~http_server() { stop(); }

int http_server::port() const { return impl_->port; }

const http_counters& http_server::counters() const { return impl_->core.counters; }

void http_server::stop() { impl_->stop(); }

void http_server::close_keep_alive() { impl_->close_keep_alive(); }

}  // namespace sy::router
