#include "planner/webhook/https_server.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "common/tcp_listen.h"

namespace memplan {
namespace {

constexpr size_t kMaxHeaderBytes = 16 << 10;
constexpr size_t kMaxBodyBytes = 1 << 20;
constexpr int kSocketTimeoutSeconds = 10;

std::string OpenSslError() {
  const unsigned long code = ERR_get_error();
  if (code == 0) return "unknown TLS error";
  char text[256];
  ERR_error_string_n(code, text, sizeof(text));
  return text;
}

const char* StatusText(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 413:
      return "Payload Too Large";
    default:
      return "Internal Server Error";
  }
}

// Reads from `ssl` until `done` says the buffer is complete or `limit` bytes have been read.
bool ReadUntil(SSL* ssl, std::string* buffer, size_t limit,
               const std::function<bool(const std::string&)>& done) {
  char chunk[4096];
  while (!done(*buffer)) {
    if (buffer->size() >= limit) return false;
    const int n = SSL_read(ssl, chunk, sizeof(chunk));
    if (n <= 0) return false;
    buffer->append(chunk, static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

struct HttpsServer::Tls {
  ~Tls() {
    if (ctx != nullptr) SSL_CTX_free(ctx);
  }
  SSL_CTX* ctx = nullptr;
};

absl::StatusOr<std::unique_ptr<HttpsServer>> HttpsServer::Start(const HttpsServerOptions& options,
                                                                Handler handler) {
  auto tls = std::make_unique<Tls>();
  tls->ctx = SSL_CTX_new(TLS_server_method());
  if (tls->ctx == nullptr) return absl::InternalError("SSL_CTX_new: " + OpenSslError());
  SSL_CTX_set_min_proto_version(tls->ctx, TLS1_2_VERSION);
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

  ASSIGN_OR_RETURN(const TcpListener listener, ListenTcp(options.address, "webhook"));
  const int fd = listener.fd;
  const int port = listener.port;
  auto server = std::unique_ptr<HttpsServer>(
      new HttpsServer(std::move(tls), fd, port, options.max_connections, std::move(handler)));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

HttpsServer::HttpsServer(std::unique_ptr<Tls> tls, int listen_fd, int port, int max_connections,
                         Handler handler)
    : tls_(std::move(tls)),
      listen_fd_(listen_fd),
      port_(port),
      max_connections_(max_connections),
      handler_(std::move(handler)) {}

HttpsServer::~HttpsServer() {
  stopping_ = true;
  shutdown(listen_fd_, SHUT_RDWR);
  if (accept_thread_.joinable()) accept_thread_.join();
  close(listen_fd_);
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* active) { return *active == 0; }, &active_));
}

void HttpsServer::AcceptLoop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    {
      absl::MutexLock lock(&mu_);
      if (active_ >= max_connections_) {
        close(fd);
        continue;
      }
      ++active_;
    }
    // A detached thread per connection; the destructor waits for active_ to drop to 0.
    std::thread([this, fd] {
      Serve(fd);
      absl::MutexLock lock(&mu_);
      --active_;
    }).detach();
  }
}

void HttpsServer::Serve(int fd) {
  timeval timeout{kSocketTimeoutSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  SSL* ssl = SSL_new(tls_->ctx);
  SSL_set_fd(ssl, fd);
  auto finish = [&] {
    SSL_shutdown(ssl);
    SSL_free(ssl);
    close(fd);
  };
  if (SSL_accept(ssl) != 1) {
    ERR_clear_error();
    finish();
    return;
  }
  HttpAnswer answer;
  std::string buffer;
  std::string method, path, body;
  const bool headers_read = ReadUntil(ssl, &buffer, kMaxHeaderBytes, [](const std::string& b) {
    return b.find("\r\n\r\n") != std::string::npos;
  });
  if (!headers_read) {
    answer = {400, "text/plain", "malformed request\n"};
  } else {
    const size_t end = buffer.find("\r\n\r\n");
    const std::vector<std::string> lines = absl::StrSplit(buffer.substr(0, end), "\r\n");
    const std::vector<std::string> request_line = absl::StrSplit(lines[0], ' ');
    size_t content_length = 0;
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == std::string::npos) continue;
      if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(lines[i].substr(0, colon)),
                                 "content-length")) {
        absl::SimpleAtoi(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)), &content_length);
      }
    }
    body = buffer.substr(end + 4);
    if (request_line.size() != 3) {
      answer = {400, "text/plain", "malformed request line\n"};
    } else if (content_length > kMaxBodyBytes) {
      answer = {413, "text/plain", "body above 1 MiB\n"};
    } else if (!ReadUntil(ssl, &body, kMaxBodyBytes + 1, [content_length](const std::string& b) {
                 return b.size() >= content_length;
               })) {
      answer = {400, "text/plain", "body shorter than Content-Length\n"};
    } else {
      method = request_line[0];
      path = request_line[1];
      body.resize(content_length);
      answer = handler_(method, path, body);
    }
  }
  const std::string response = absl::StrCat(
      "HTTP/1.1 ", answer.status, " ", StatusText(answer.status),
      "\r\nContent-Type: ", answer.content_type, "\r\nContent-Length: ", answer.body.size(),
      "\r\nConnection: close\r\n\r\n", answer.body);
  SSL_write(ssl, response.data(), static_cast<int>(response.size()));
  finish();
}

}  // namespace memplan
