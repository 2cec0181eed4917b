#include "router/tracing/otlp_exporter.hpp"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <fcntl.h>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace sy::router {
namespace {

struct endpoint_parts {
  std::string host, port, path;
};

endpoint_parts split_endpoint(const std::string& url) {
  constexpr std::string_view scheme = "http://";
  if (url.rfind("https://", 0) == 0)
    throw std::invalid_argument("--otlp-endpoint " + url + ": https is not supported (plain http:// only)");
  if (url.rfind(scheme, 0) != 0)
    throw std::invalid_argument("--otlp-endpoint " + url + ": expected http://HOST[:PORT]/PATH");
  const std::string rest = url.substr(scheme.size());
  const auto slash = rest.find('/');
  const std::string authority = rest.substr(0, slash);
  endpoint_parts p;
  p.path = slash == std::string::npos ? "/v1/traces" : rest.substr(slash);
  const auto colon = authority.rfind(':');
  if (authority.empty()) throw std::invalid_argument("--otlp-endpoint " + url + ": no host");
  if (colon == std::string::npos || (authority.front() == '[' && authority.find(']') > colon)) {
    p.host = authority;
    p.port = "80";
  } else {
    p.host = authority.substr(0, colon);
    p.port = authority.substr(colon + 1);
  }
  if (!p.host.empty() && p.host.front() == '[' && p.host.back() == ']') p.host = p.host.substr(1, p.host.size() - 2);
  if (p.host.empty() || p.port.empty() || p.port.find_first_not_of("0123456789") != std::string::npos)
    throw std::invalid_argument("--otlp-endpoint " + url + ": expected http://HOST[:PORT]/PATH");
  return p;
}

// A connected socket within `timeout`, or -1.
int connect_with_timeout(const endpoint_parts& p, std::chrono::milliseconds timeout) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(p.host.c_str(), p.port.c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* ai = res; ai && fd < 0; ai = ai->ai_next) {
    fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    const int flags = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd pfd{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof err;
      rc = (::poll(&pfd, 1, static_cast<int>(timeout.count())) == 1 &&
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0)
               ? 0
               : -1;
    }
    if (rc != 0) {
      ::close(fd);
      fd = -1;
      continue;
    }
    fcntl(fd, F_SETFL, flags);  // blocking again, bounded by SO_SNDTIMEO / SO_RCVTIMEO
    timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  }
  freeaddrinfo(res);
  return fd;
}

}  // namespace

void check_otlp_endpoint(const std::string& endpoint) { (void)split_endpoint(endpoint); }

bool http_post_json(const std::string& endpoint, const std::string& body, std::chrono::milliseconds timeout) {
  const endpoint_parts p = split_endpoint(endpoint);
  const int fd = connect_with_timeout(p, timeout);
  if (fd < 0) return false;
  std::string req = "POST " + p.path + " HTTP/1.1\r\nHost: " + p.host + ":" + p.port +
                    "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\nConnection: close\r\n\r\n";
  req += body;
  std::size_t sent = 0;
  while (sent < req.size()) {
    const ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      ::close(fd);
      return false;
    }
    sent += static_cast<std::size_t>(n);
  }
  // The status line is enough: "HTTP/1.1 200 ...".
  std::string head;
  char buf[512];
  while (head.find("\r\n") == std::string::npos && head.size() < 4096) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    head.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return head.size() >= 12 && head.rfind("HTTP/1.", 0) == 0 && head[9] == '2';
}

otlp_exporter::otlp_exporter(otlp_exporter_config config, otlp_post_fn post)
    : config_(std::move(config)), post_(std::move(post)) {
  if (!post_) {
    check_otlp_endpoint(config_.endpoint);
    post_ = [endpoint = config_.endpoint, timeout = config_.timeout](const std::string& body) {
      return http_post_json(endpoint, body, timeout);
    };
  }
  thread_ = std::thread([this] { run(); });
}

otlp_exporter::~otlp_exporter() { stop(); }

bool otlp_exporter::submit(span_record span) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || queue_.size() >= config_.queue_capacity) {
      dropped_.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    queue_.push_back(std::move(span));
    if (queue_.size() < config_.batch_size) return true;
  }
  cv_.notify_one();
  return true;
}

void otlp_exporter::stop(std::chrono::milliseconds grace) {
  {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) return;
    if (!stopping_) {
      stopping_ = true;
      stop_deadline_ = std::chrono::steady_clock::now() + grace;
    }
  }
  cv_.notify_one();
  thread_.join();
}

void otlp_exporter::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait_for(lock, config_.interval, [&] { return stopping_ || queue_.size() >= config_.batch_size; });
    if (stopping_ && (queue_.empty() || std::chrono::steady_clock::now() >= stop_deadline_)) break;
    while (!queue_.empty()) {
      const std::size_t n = std::min(queue_.size(), config_.batch_size);
      std::vector<span_record> batch(std::make_move_iterator(queue_.begin()),
                                     std::make_move_iterator(queue_.begin() + static_cast<std::ptrdiff_t>(n)));
      queue_.erase(queue_.begin(), queue_.begin() + static_cast<std::ptrdiff_t>(n));
      lock.unlock();
      const bool ok = post_(encode_otlp_json(batch, config_.service_name));
      (ok ? exported_ : dropped_).fetch_add(n, std::memory_order_relaxed);
      lock.lock();
      if (stopping_ && std::chrono::steady_clock::now() >= stop_deadline_) break;
      if (!stopping_ && queue_.size() < config_.batch_size) break;
    }
  }
  dropped_.fetch_add(queue_.size(), std::memory_order_relaxed);
  queue_.clear();
}

}  // namespace sy::router
