#include "common/tcp_listen.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace memplan {

absl::StatusOr<TcpListener> ListenTcp(const std::string& address, absl::string_view what) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " address \"", address, "\" is not HOST:PORT"));
  }
  std::string host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  const std::string port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &resolved) != 0 ||
      resolved == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " address \"", address, "\": cannot resolve the host or port"));
  }
  const int fd = socket(resolved->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  const bool bound = fd >= 0 && setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
                     bind(fd, resolved->ai_addr, resolved->ai_addrlen) == 0 && listen(fd, 64) == 0;
  const int error = errno;
  freeaddrinfo(resolved);
  if (!bound) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat(what, " address ", address, ": cannot listen: ", std::strerror(error)));
  }
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length);
  TcpListener listener;
  listener.fd = fd;
  listener.port =
      ntohs(local.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&local)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&local)->sin_port);
  return listener;
}

}  // namespace memplan
