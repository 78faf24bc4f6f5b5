// A small HTTPS/1.1 server on OpenSSL for the planner's JSON endpoints (the Kubernetes admission
// webhook): POST requests with a Content-Length body up to 1 MiB, one answer per connection.
// Thread-safe; Start() returns once the port is bound, the destructor stops accepting and waits
// for connections in progress (each bounded by a 10 s socket timeout).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace memplan {

struct HttpsServerOptions {
  std::string address;        // "HOST:PORT"; port 0 picks a free port
  std::string cert_pem_file;  // server certificate (chain), PEM
  std::string key_pem_file;   // its private key, PEM
  int max_connections = 16;   // beyond this, new connections are closed at once
};

struct HttpAnswer {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

class HttpsServer {
 public:
  // Called for every well-formed request, on a connection thread: (method, path, body).
  using Handler =
      std::function<HttpAnswer(const std::string&, const std::string&, const std::string&)>;

  // UNAVAILABLE naming the address when it cannot listen; INVALID_ARGUMENT naming the file when
  // the certificate or key cannot be loaded or do not match.
  static absl::StatusOr<std::unique_ptr<HttpsServer>> Start(const HttpsServerOptions& options,
                                                            Handler handler);
  ~HttpsServer();
  HttpsServer(const HttpsServer&) = delete;
  HttpsServer& operator=(const HttpsServer&) = delete;

  int port() const { return port_; }

 private:
  struct Tls;
  HttpsServer(std::unique_ptr<Tls> tls, int listen_fd, int port, int max_connections,
              Handler handler);
  void AcceptLoop();
  void Serve(int fd);

  const std::unique_ptr<Tls> tls_;
  const int listen_fd_;
  const int port_;
  const int max_connections_;
  const Handler handler_;
  std::atomic<bool> stopping_{false};
  absl::Mutex mu_;
  int active_ ABSL_GUARDED_BY(mu_) = 0;  // connections being served
  std::thread accept_thread_;
};

}  // namespace memplan
