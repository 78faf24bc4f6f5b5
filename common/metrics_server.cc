#include "common/metrics_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/tcp_listen.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace memplan {
namespace {

constexpr size_t kMaxRequestBytes = 8 << 10;

void WriteAll(int fd, const std::string& data) {
  size_t written = 0;
  while (written < data.size()) {
    const ssize_t n = send(fd, data.data() + written, data.size() - written, MSG_NOSIGNAL);
    if (n <= 0) return;
    written += static_cast<size_t>(n);
  }
}

}  // namespace

// [Own /metrics server] prometheus-cpp's Exposer (civetweb 1.15 as Debian 12 builds it) did not
// start inside memplan-agent ("null context when constructing CivetServer" after binding), so
// the planner and the agent serve the registry with this small server instead.
absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& address, std::shared_ptr<prometheus::Registry> registry) {
  if (registry == nullptr) return absl::InvalidArgumentError("registry: must not be null");
  if (address.empty()) return absl::InvalidArgumentError("metrics address: must not be empty");
  absl::StatusOr<TcpListener> listener = ListenTcp(address, "metrics");
  if (!listener.ok()) return listener.status();
  auto server = std::unique_ptr<MetricsServer>(
      new MetricsServer(std::move(registry), listener->fd, listener->port));
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

MetricsServer::MetricsServer(std::shared_ptr<prometheus::Registry> registry, int listen_fd,
                             int port)
    : registry_(std::move(registry)), listen_fd_(listen_fd), port_(port) {}

MetricsServer::~MetricsServer() {
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
  close(listen_fd_);
}

int MetricsServer::port() const { return port_; }

void MetricsServer::Serve() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Answer(fd);
    close(fd);
  }
}

void MetricsServer::Answer(int fd) {
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  std::string request;
  char chunk[1024];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    const ssize_t n = recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) break;
    request.append(chunk, static_cast<size_t>(n));
  }
  const std::string path = request.substr(0, request.find(' ', 4));
  std::string status = "404 Not Found";
  std::string type = "text/plain";
  std::string body = "not found; GET /metrics\n";
  if (path == "GET /metrics" || absl::StartsWith(request, "GET /metrics?") ||
      absl::StartsWith(request, "GET /metrics ")) {
    status = "200 OK";
    type = "text/plain; version=0.0.4; charset=utf-8";
    body = prometheus::TextSerializer().Serialize(registry_->Collect());
  }
  WriteAll(fd, absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type, "\r\nContent-Length: ",
                            body.size(), "\r\nConnection: close\r\n\r\n", body));
}

}  // namespace memplan
