#include "planner/webhook/https_server.h"

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace memplan {
namespace {

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  if (code == 0) return "unknown TLS error";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

// TLS over a non-blocking socket: every SSL call that wants the socket waits for it until the
// connection's deadline. The socket BIO writes with write(2); SIGPIPE is blocked on connection
// threads (common/http_server.cc) and ignored process-wide by the daemon.
class TlsStream : public HttpStream {
 public:
  TlsStream(SSL* ssl, int fd) : ssl_(ssl), fd_(fd) {}
  ~TlsStream() override {
    // One attempt at close_notify; a peer that has gone is not waited for.
    SSL_shutdown(ssl_);
    SSL_free(ssl_);
    ERR_clear_error();
  }

  // False when the handshake failed or did not finish by the deadline.
  bool Handshake(HttpDeadline deadline) {
    while (true) {
      const int rc = SSL_accept(ssl_);
      if (rc == 1) return true;
      if (!WaitFor(rc, deadline)) return false;
    }
  }

  ssize_t Read(char* buffer, size_t size, HttpDeadline deadline) override {
    while (true) {
      const int n = SSL_read(ssl_, buffer, static_cast<int>(std::min<size_t>(size, 1 << 30)));
      if (n > 0) return n;
      if (SSL_get_error(ssl_, n) == SSL_ERROR_ZERO_RETURN) return 0;
      if (!WaitFor(n, deadline)) return Eof() ? 0 : -1;
    }
  }

  bool WriteAll(absl::string_view data, HttpDeadline deadline) override {
    while (!data.empty()) {
      const int n =
          SSL_write(ssl_, data.data(), static_cast<int>(std::min<size_t>(data.size(), 1 << 30)));
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
      } else if (!WaitFor(n, deadline)) {
        return false;
      }
    }
    return true;
  }

 private:
  // After an SSL call returned rc <= 0: waits for the socket when OpenSSL asks to; false on a
  // real error or past the deadline.
  bool WaitFor(int rc, HttpDeadline deadline) {
    const int error = SSL_get_error(ssl_, rc);
    last_error_ = error;
    if (error == SSL_ERROR_WANT_READ) return WaitForSocket(fd_, /*for_write=*/false, deadline);
    if (error == SSL_ERROR_WANT_WRITE) return WaitForSocket(fd_, /*for_write=*/true, deadline);
    ERR_clear_error();
    return false;
  }
  // The peer closed the TCP connection without close_notify.
  bool Eof() const { return last_error_ == SSL_ERROR_SYSCALL || last_error_ == SSL_ERROR_SSL; }

  SSL* const ssl_;
  const int fd_;
  int last_error_ = SSL_ERROR_NONE;
};

}  // namespace

struct HttpsServer::Tls {
  ~Tls() {
    if (ctx != nullptr) SSL_CTX_free(ctx);
  }
  SSL_CTX* ctx = nullptr;
};

absl::StatusOr<std::unique_ptr<HttpsServer>> HttpsServer::Start(const HttpsServerOptions& options,
                                                                Handler handler) {
  auto tls = std::make_shared<Tls>();
  tls->ctx = SSL_CTX_new(TLS_server_method());
  if (tls->ctx == nullptr) return absl::InternalError("SSL_CTX_new: " + OpenSslError());
  SSL_CTX_set_min_proto_version(tls->ctx, TLS1_2_VERSION);
  // A partial SSL_write is retried with the rest of the buffer (WriteAll), not the same one.
  SSL_CTX_set_mode(tls->ctx, SSL_MODE_ENABLE_PARTIAL_WRITE);
  if (SSL_CTX_use_certificate_chain_file(tls->ctx, options.cert_pem_file.c_str()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--tls-cert = \"", options.cert_pem_file,
                                                   "\": not a PEM certificate: ", OpenSslError()));
  }
  if (SSL_CTX_use_PrivateKey_file(tls->ctx, options.key_pem_file.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(tls->ctx) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls-key = \"", options.key_pem_file,
                     "\": not the PEM private key of --tls-cert: ", OpenSslError()));
  }

  HttpServerOptions http;
  http.address = options.address;
  http.name = "webhook";
  http.max_connections = options.max_connections;
  http.request_seconds = options.request_seconds;
  http.max_header_bytes = 16 << 10;
  http.max_body_bytes = 1 << 20;
  auto server = std::unique_ptr<HttpsServer>(new HttpsServer());
  server->tls_ = tls;
  absl::StatusOr<std::unique_ptr<HttpServer>> http_server = HttpServer::Start(
      http,
      [tls](int fd, HttpDeadline deadline) -> std::unique_ptr<HttpStream> {
        SSL* ssl = SSL_new(tls->ctx);
        if (ssl == nullptr) return nullptr;
        SSL_set_fd(ssl, fd);
        auto stream = std::make_unique<TlsStream>(ssl, fd);
        if (!stream->Handshake(deadline)) return nullptr;
        return stream;
      },
      [handler = std::move(handler)](const HttpRequest& request) {
        return handler(request.method, request.path, request.body);
      });
  if (!http_server.ok()) return http_server.status();
  server->server_ = *std::move(http_server);
  return server;
}

HttpsServer::~HttpsServer() = default;

int HttpsServer::port() const { return server_->port(); }

}  // namespace memplan
