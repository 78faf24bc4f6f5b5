// The options a multi-process test worker joins its Gloo group with: torchrun's variables
// (RANK, WORLD_SIZE, MASTER_ADDR, ...) read from the environment the test set for it.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "agent/dist/dist_options.h"

namespace memplan::testing {

// heartbeat_milliseconds 0 keeps DistOptions' default.
inline absl::StatusOr<DistOptions> GlooOptionsFromEnvironment(int timeout_seconds,
                                                               int heartbeat_milliseconds = 0) {
  absl::StatusOr<DistOptions> dist =
      DistOptionsFromEnvironment([](const std::string& name) -> std::optional<std::string> {
        const char* v = std::getenv(name.c_str());
        if (v == nullptr) return std::nullopt;
        return std::string(v);
      });
  if (!dist.ok()) return dist;
  dist->backend = DistBackend::kGloo;
  dist->timeout_seconds = timeout_seconds;
  if (heartbeat_milliseconds > 0) dist->heartbeat_milliseconds = heartbeat_milliseconds;
  return dist;
}

}  // namespace memplan::testing
