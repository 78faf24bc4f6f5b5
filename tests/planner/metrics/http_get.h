// Test helper: a blocking HTTP/1.0 GET over a loopback TCP socket, returning the body.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace memplan::testing {

// GETs http://127.0.0.1:port/path with `extra_headers` ("Name: value\r\n" lines); fails unless
// the status line says 200 (FAILED_PRECONDITION quoting it), or when no answer has come within
// `timeout_seconds` (DEADLINE_EXCEEDED).
absl::StatusOr<std::string> HttpGet(int port, const std::string& path,
                                    const std::string& extra_headers = "",
                                    int timeout_seconds = 30);

// A loopback TCP connection to `port` that sent `data` and then nothing; -1 on failure.
int ConnectAndSend(int port, const std::string& data);

}  // namespace memplan::testing
