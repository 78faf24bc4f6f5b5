// Command-line configuration of memplan-planner: the flags, their defaults and --help text.
// Only main() reads argv; everything else receives a DaemonOptions. Thread-compatible value type.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/log.h"

namespace memplan {

struct DaemonOptions {
  std::string listen_address = "127.0.0.1:50051";  // port 0: any free port (printed)
  std::string metrics_address = "127.0.0.1:9464";  // empty: no /metrics endpoint
  std::string db_path = "./memplan-planner.db";
  LogLevel log_level = LogLevel::kInfo;
  int search_threads = 0;  // 0: one per CPU (at most 16)
  int max_queued_searches = 256;
  int max_rpc_threads = 64;            // gRPC sync-server threads
  double shutdown_grace_seconds = 10;  // how long SIGTERM waits for in-flight RPCs
  bool help = false;
};

// Accepts "--flag=value" and "--flag value". INVALID_ARGUMENT naming the flag for an unknown
// flag, a missing value or a value out of range.
absl::StatusOr<DaemonOptions> ParseDaemonOptions(const std::vector<std::string>& args);

// Usage text for --help.
std::string DaemonUsage();

}  // namespace memplan
