// A bounded HTTP/1.1 server core for the planner's admission webhook (TLS, planner/webhook) and
// the /metrics endpoints (plain TCP, common/metrics_server.h): one request per connection, each
// connection on its own thread under one deadline counted from accept. Thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace memplan {

using HttpDeadline = std::chrono::steady_clock::time_point;

struct HttpRequest {
  std::string method;
  std::string path;           // as sent, query included
  std::string authorization;  // the Authorization header's value; empty when absent
  std::string body;
};

struct HttpAnswer {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// One accepted connection's bytes (plain TCP or TLS) over a non-blocking socket. Every call
// returns by `deadline`; none may raise SIGPIPE.
class HttpStream {
 public:
  virtual ~HttpStream() = default;
  // Bytes read (> 0), 0 at the end of the stream, -1 on an error or past the deadline.
  virtual ssize_t Read(char* buffer, size_t size, HttpDeadline deadline) = 0;
  virtual bool WriteAll(absl::string_view data, HttpDeadline deadline) = 0;
};

// Waits until `fd` is readable (or writable); false past the deadline or on a poll error.
bool WaitForSocket(int fd, bool for_write, HttpDeadline deadline);

// Plain TCP over `fd` (not owned).
std::unique_ptr<HttpStream> PlainHttpStream(int fd);

struct HttpServerOptions {
  std::string address;             // "HOST:PORT"; port 0 picks a free port
  std::string name = "http";       // in error messages: "webhook", "metrics"
  int max_connections = 64;        // served at once; more wait in the listen backlog
  double request_seconds = 10;     // from accept to the end of the request (TLS handshake too)
  size_t max_header_bytes = 16 << 10;  // request line + headers; above: 431
  size_t max_body_bytes = 1 << 20;     // Content-Length above: 413, the body is not read
};

class HttpServer {
 public:
  // Called once per complete request, on its connection's thread.
  using Handler = std::function<HttpAnswer(const HttpRequest&)>;
  // Wraps an accepted non-blocking socket (still owned by the server); nullptr drops the
  // connection (e.g. a TLS handshake that failed or missed the deadline).
  using StreamFactory = std::function<std::unique_ptr<HttpStream>(int fd, HttpDeadline deadline)>;

  // INVALID_ARGUMENT naming the field for options out of range; UNAVAILABLE naming the address
  // when it cannot listen.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           StreamFactory stream_factory,
                                                           Handler handler);
  // Stops accepting, cuts connections still reading or writing (at once, whatever a client
  // sends) and waits for handlers in progress.
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }

 private:
  HttpServer(const HttpServerOptions& options, int listen_fd, int port,
             StreamFactory stream_factory, Handler handler);
  void AcceptLoop();
  void Serve(int fd);
  // The answer to the request on `stream`; status 0 when the client left without one.
  HttpAnswer ReadAndHandle(HttpStream& stream, HttpDeadline deadline);

  const HttpServerOptions options_;
  const int listen_fd_;
  const int port_;
  const StreamFactory stream_factory_;
  const Handler handler_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::set<int> open_fds_ ABSL_GUARDED_BY(mu_);  // connections being served
  std::thread accept_thread_;
};

}  // namespace memplan
