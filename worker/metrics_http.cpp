#include "worker/metrics_http.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

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

void metrics_http::serve() {
  while (!stop_.load()) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    std::string req;
    char buf[2048];
    // Read until the end of the headers, at most 8 KiB, within 2 s.
    for (int waited = 0; req.find("\r\n\r\n") == std::string::npos && req.size() < 8192 && waited < 2000;) {
      pollfd q{c, POLLIN, 0};
      if (::poll(&q, 1, 100) <= 0) {
        waited += 100;
        continue;
      }
      const ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) break;
      req.append(buf, static_cast<size_t>(n));
    }
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
    const std::string resp = "HTTP/1.1 " + status + "\r\nContent-Type: " + type +
                             "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
                             body;
    size_t off = 0;
    while (off < resp.size()) {
      const ssize_t n = ::send(c, resp.data() + off, resp.size() - off, MSG_NOSIGNAL);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
    ::close(c);
  }
}

}  // namespace sy
