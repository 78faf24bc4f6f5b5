#include "common/http_server.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/tcp_listen.h"

namespace memplan {
namespace {

using Clock = std::chrono::steady_clock;

// Writing an answer to a client that has gone must not cost more than this past the request's
// deadline (a handler may have used the whole request budget).
constexpr std::chrono::seconds kWriteSeconds(5);
constexpr std::chrono::seconds kLingerTime(1);

const char* StatusText(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 501:
      return "Not Implemented";
    default:
      return "Internal Server Error";
  }
}

class PlainStream : public HttpStream {
 public:
  explicit PlainStream(int fd) : fd_(fd) {}
  ssize_t Read(char* buffer, size_t size, HttpDeadline deadline) override {
    while (true) {
      const ssize_t n = recv(fd_, buffer, size, 0);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      if (!WaitForSocket(fd_, /*for_write=*/false, deadline)) return -1;
    }
  }
  bool WriteAll(absl::string_view data, HttpDeadline deadline) override {
    while (!data.empty()) {
      const ssize_t n = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n > 0) {
        data.remove_prefix(static_cast<size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!WaitForSocket(fd_, /*for_write=*/true, deadline)) return false;
      } else {
        return false;
      }
    }
    return true;
  }

 private:
  const int fd_;
};

}  // namespace

bool WaitForSocket(int fd, bool for_write, HttpDeadline deadline) {
  while (true) {
    // Rounded up: a wait cut short of the deadline (poll counts whole milliseconds) would report
    // a timeout while Clock::now() < deadline, and ReadAndHandle would then drop a client that
    // stopped sending without its 408 (one run in five of AdmissionWebhookE2ETest's
    // IdleAndDrippingClientsDoNotBlockAReview).
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return false;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    pollfd p{fd, static_cast<short>(for_write ? POLLOUT : POLLIN), 0};
    const int ready = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
    if (ready > 0) return true;  // readable, writable, or hung up: the next call says which
    if (ready < 0 && errno != EINTR) return false;
  }
}

std::unique_ptr<HttpStream> PlainHttpStream(int fd) { return std::make_unique<PlainStream>(fd); }

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const HttpServerOptions& options,
                                                             StreamFactory stream_factory,
                                                             Handler handler) {
  if (options.max_connections < 1 || options.max_connections > 4096) {
    return absl::InvalidArgumentError(absl::StrCat(options.name, " max_connections = ",
                                                   options.max_connections,
                                                   ": allowed range [1, 4096]"));
  }
  if (!(options.request_seconds > 0 && options.request_seconds <= 3600)) {
    return absl::InvalidArgumentError(absl::StrCat(options.name, " request_seconds = ",
                                                   options.request_seconds,
                                                   ": allowed range (0, 3600]"));
  }
  absl::StatusOr<TcpListener> listener = ListenTcp(options.address, options.name);
  if (!listener.ok()) return listener.status();
  auto server = std::unique_ptr<HttpServer>(new HttpServer(
      options, listener->fd, listener->port, std::move(stream_factory), std::move(handler)));
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

HttpServer::HttpServer(const HttpServerOptions& options, int listen_fd, int port,
                       StreamFactory stream_factory, Handler handler)
    : options_(options),
      listen_fd_(listen_fd),
      port_(port),
      stream_factory_(std::move(stream_factory)),
      handler_(std::move(handler)) {}

HttpServer::~HttpServer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  close(listen_fd_);
  absl::MutexLock lock(&mu_);
  // A client dripping bytes or holding a connection open must not hold the shutdown: its reads
  // and writes fail at once. A handler already running finishes.
  for (const int fd : open_fds_) shutdown(fd, SHUT_RDWR);
  mu_.Await(absl::Condition(
      +[](std::set<int>* fds) { return fds->empty(); }, &open_fds_));
}

void HttpServer::AcceptLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // [Connection cap] At the cap, connections wait in the listen backlog instead of being
      // refused; every served one ends by its deadline, so a waiting one is served within
      // request_seconds however the others behave.
      const auto can_accept = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || static_cast<int>(open_fds_.size()) < options_.max_connections;
      };
      mu_.AwaitWithTimeout(absl::Condition(&can_accept), absl::Milliseconds(200));
      if (stopping_) return;
      if (!can_accept()) continue;
    }
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    {
      absl::MutexLock lock(&mu_);
      open_fds_.insert(fd);
    }
    // Detached; the destructor waits for open_fds_ to empty.
    std::thread([this, fd] {
      // Belt and braces beside MSG_NOSIGNAL and a process-wide SIG_IGN: a write to a closed
      // socket (OpenSSL's socket BIO uses write(2)) must fail with EPIPE on this thread, not
      // kill the process.
      sigset_t pipe;
      sigemptyset(&pipe);
      sigaddset(&pipe, SIGPIPE);
      pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
      Serve(fd);
      absl::MutexLock lock(&mu_);
      open_fds_.erase(fd);
      close(fd);  // under mu_: the destructor never shuts down a reused descriptor
    }).detach();
  }
}

void HttpServer::Serve(int fd) {
  const HttpDeadline deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(options_.request_seconds));
  std::unique_ptr<HttpStream> stream = stream_factory_(fd, deadline);
  if (stream == nullptr) return;
  const HttpAnswer answer = ReadAndHandle(*stream, deadline);
  if (answer.status == 0) return;
  const bool written = stream->WriteAll(
      absl::StrCat("HTTP/1.1 ", answer.status, " ", StatusText(answer.status),
                   "\r\nContent-Type: ", answer.content_type,
                   "\r\nContent-Length: ", answer.body.size(),
                   "\r\nConnection: close\r\n\r\n", answer.body),
      std::max(deadline, Clock::now() + kWriteSeconds));
  stream.reset();
  if (!written) return;
  // [Lingering close] An answer sent before the whole request was read (431, 413) is lost when
  // close() finds unread bytes and resets the connection; so stop sending, then read and drop what
  // the client still sends, for a bounded time and size.
  shutdown(fd, SHUT_WR);
  const HttpDeadline linger_end = Clock::now() + kLingerTime;
  char sink[4096];
  for (size_t dropped = 0; dropped < options_.max_body_bytes + options_.max_header_bytes;) {
    if (!WaitForSocket(fd, /*for_write=*/false, linger_end)) break;
    const ssize_t n = recv(fd, sink, sizeof(sink), 0);
    if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) break;
    if (n > 0) dropped += static_cast<size_t>(n);
  }
}

HttpAnswer HttpServer::ReadAndHandle(HttpStream& stream, HttpDeadline deadline) {
  const auto text = [](int status, std::string body) {
    return HttpAnswer{status, "text/plain", std::move(body)};
  };
  // A client that stopped sending gets 408 when the deadline cut it, nothing when it left.
  const auto cut = [&] {
    return Clock::now() >= deadline
               ? text(408, absl::StrCat("request not complete within ", options_.request_seconds,
                                        " s\n"))
               : HttpAnswer{0, "", ""};
  };
  std::string buffer;
  char chunk[4096];
  size_t header_end = std::string::npos;
  while ((header_end = buffer.find("\r\n\r\n")) == std::string::npos) {
    if (buffer.size() > options_.max_header_bytes) {
      return text(431, absl::StrCat("request line and headers above ", options_.max_header_bytes,
                                    " bytes\n"));
    }
    const ssize_t n = stream.Read(chunk, sizeof(chunk), deadline);
    if (n <= 0) return cut();
    buffer.append(chunk, static_cast<size_t>(n));
  }
  if (header_end > options_.max_header_bytes) {
    return text(431, absl::StrCat("request line and headers above ", options_.max_header_bytes,
                                  " bytes\n"));
  }
  const std::vector<absl::string_view> lines =
      absl::StrSplit(absl::string_view(buffer).substr(0, header_end), "\r\n");
  const std::vector<absl::string_view> request_line = absl::StrSplit(lines[0], ' ');
  if (request_line.size() != 3 || !absl::StartsWith(request_line[2], "HTTP/1.")) {
    return text(400, "malformed request line; expected METHOD PATH HTTP/1.x\n");
  }
  HttpRequest request;
  request.method = std::string(request_line[0]);
  request.path = std::string(request_line[1]);
  bool has_length = false;
  size_t content_length = 0;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == absl::string_view::npos) return text(400, "malformed header line\n");
    const absl::string_view name = absl::StripAsciiWhitespace(lines[i].substr(0, colon));
    const absl::string_view value = absl::StripAsciiWhitespace(lines[i].substr(colon + 1));
    if (absl::EqualsIgnoreCase(name, "content-length")) {
      size_t length = 0;
      if (value.empty() || value.size() > 19 || !std::all_of(value.begin(), value.end(), absl::ascii_isdigit) ||
          !absl::SimpleAtoi(value, &length) || (has_length && length != content_length)) {
        return text(400, "Content-Length: expected one non-negative integer\n");
      }
      has_length = true;
      content_length = length;
    } else if (absl::EqualsIgnoreCase(name, "transfer-encoding")) {
      return text(411, "Transfer-Encoding is not supported; send a Content-Length\n");
    } else if (absl::EqualsIgnoreCase(name, "authorization")) {
      request.authorization = std::string(value);
    }
  }
  if (content_length > options_.max_body_bytes) {
    return text(413, absl::StrCat("Content-Length = ", content_length, ": allowed up to ",
                                  options_.max_body_bytes, " bytes\n"));
  }
  // Bytes after the body (a pipelined second request) are ignored: one answer per connection.
  request.body = buffer.substr(header_end + 4);
  while (request.body.size() < content_length) {
    const ssize_t n = stream.Read(chunk, sizeof(chunk), deadline);
    if (n < 0) return cut();
    if (n == 0) return text(400, "body shorter than Content-Length\n");
    request.body.append(chunk, static_cast<size_t>(n));
  }
  request.body.resize(content_length);
  return handler_(request);
}

}  // namespace memplan
