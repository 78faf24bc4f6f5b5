// A listening TCP socket for "HOST:PORT" (IPv4, IPv6 in brackets, or a name; port 0 picks a free
// port), shared by the HTTP endpoints of the planner and the agent. Thread-compatible.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace memplan {

struct TcpListener {
  int fd = -1;   // listening, close-on-exec; the caller owns it
  int port = 0;  // the port actually bound
};

// INVALID_ARGUMENT when `address` is not HOST:PORT or the host does not resolve; UNAVAILABLE
// "<what> address ADDRESS: cannot listen: <reason>" when binding fails.
absl::StatusOr<TcpListener> ListenTcp(const std::string& address, absl::string_view what);

}  // namespace memplan
