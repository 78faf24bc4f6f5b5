// Test helper: a blocking HTTP/1.0 GET over a loopback TCP socket, returning the body.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace memplan::testing {

// GETs http://127.0.0.1:port/path; fails unless the status line says 200.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);

}  // namespace memplan::testing
