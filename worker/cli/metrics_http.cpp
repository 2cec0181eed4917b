#include "worker/cli/metrics_http.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace sy {

metrics_http::metrics_http(const std::string& host, int port, std::function<std::string()> render,
                           std::function<std::string()> not_ready)
    : render_(std::move(render)), not_ready_(std::move(not_ready)) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) throw std::runtime_error(std::string("metrics: socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    ::close(fd_);
    throw std::runtime_error("metrics: bad listen address '" + host + "'");
  }
  if (::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(fd_, 16) != 0) {
    const std::string err = std::strerror(errno);
    ::close(fd_);
    throw std::runtime_error("metrics: cannot listen on " + host + ":" + std::to_string(port) + ": " + err);
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
}

metrics_http::~metrics_http() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
}

std::string metrics_http::answer(const std::string& req) const {
  std::string status = "404 Not Found", body = "not found\n", type = "text/plain";
  if (req.rfind("GET /metrics", 0) == 0) {
    status = "200 OK";
    body = render_();
    type = "text/plain; version=0.0.4";
  } else if (req.rfind("GET /health", 0) == 0) {
    status = "200 OK";
    body = "ok\n";
  } else if (req.rfind("GET /ready", 0) == 0) {
    const std::string why = not_ready_();
    status = why.empty() ? "200 OK" : "503 Service Unavailable";
    body = why.empty() ? "ready\n" : "not ready: " + why + "\n";
  }
  return "HTTP/1.1 " + status + "\r\nContent-Type: " + type + "\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

// One poll loop over the listening socket and every open connection (non-blocking): a client
// that connects and sends nothing, or reads slowly, holds only its own connection — never a
// probe behind it. A connection has 2 s to send its request line and headers (8 KiB at most)
// and 2 s more to take its answer; at most k_max_conns are open (the oldest goes first).
void metrics_http::serve() {
  using clock = std::chrono::steady_clock;
  struct conn {
    int fd;
    clock::time_point deadline;
    std::string in, out;
    size_t sent = 0;
  };
  constexpr size_t k_max_conns = 64;
  constexpr auto k_limit = std::chrono::seconds(2);
  std::vector<conn> conns;
  std::vector<pollfd> fds;
  while (!stop_.load()) {
    fds.assign(1, pollfd{fd_, POLLIN, 0});
    for (const conn& c : conns) fds.push_back(pollfd{c.fd, static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
    if (::poll(fds.data(), fds.size(), 100) < 0) continue;
    const auto now = clock::now();
    for (size_t k = 0; k < conns.size(); ++k) {
      conn& c = conns[k];
      const short ev = fds[k + 1].revents;
      bool done = now > c.deadline || (ev & (POLLERR | POLLNVAL)) != 0;
      if (!done && c.out.empty() && (ev & (POLLIN | POLLHUP))) {
        char buf[2048];
        const ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
        if (n <= 0) {
          done = true;
        } else {
          c.in.append(buf, static_cast<size_t>(n));
          if (c.in.find("\r\n\r\n") != std::string::npos || c.in.size() >= 8192) {
            c.out = answer(c.in);
            c.deadline = now + k_limit;
          }
        }
      } else if (!done && !c.out.empty() && (ev & POLLOUT)) {
        const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n <= 0) {
          done = true;
        } else {
          c.sent += static_cast<size_t>(n);
          done = c.sent == c.out.size();
        }
      }
      if (done) {
        ::close(c.fd);
        c.fd = -1;
      }
    }
    std::erase_if(conns, [](const conn& c) { return c.fd < 0; });
    if (fds[0].revents & POLLIN) {
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (c >= 0) {
        if (conns.size() >= k_max_conns) {  // the oldest goes: it has waited longest
          ::close(conns.front().fd);
          conns.erase(conns.begin());
        }
        conns.push_back(conn{c, clock::now() + k_limit, {}, {}, 0});
      }
    }
  }
  for (const conn& c : conns) ::close(c.fd);
}

}  // namespace sy
