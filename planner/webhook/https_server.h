// The admission webhook's HTTPS/1.1 server: OpenSSL (TLS >= 1.2) over the bounded server core
// of common/http_server.h — one request per connection, a deadline per connection from accept
// (handshake included), headers above 16 KiB answered 431 and bodies above 1 MiB 413, a
// connection cap that idle or dripping clients can hold for at most the deadline. Thread-safe;
// Start() returns once the port is bound; the destructor cuts open connections at once.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/http_server.h"

namespace memplan {

struct HttpsServerOptions {
  std::string address;          // "HOST:PORT"; port 0 picks a free port
  std::string cert_pem_file;    // server certificate (chain), PEM
  std::string key_pem_file;     // its private key, PEM
  int max_connections = 64;     // served at once; more wait in the listen backlog
  double request_seconds = 10;  // from accept to the end of the request
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

  int port() const;

 private:
  struct Tls;
  HttpsServer() = default;

  std::shared_ptr<Tls> tls_;  // shared with the connection streams
  std::unique_ptr<HttpServer> server_;
};

}  // namespace memplan
