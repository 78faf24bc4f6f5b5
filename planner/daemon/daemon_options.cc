#include "planner/daemon/daemon_options.h"

#include <cmath>
#include <cstdlib>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace memplan {
namespace {

std::optional<LogLevel> ParseLogLevel(const std::string& name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warning") return LogLevel::kWarning;
  if (name == "error") return LogLevel::kError;
  return std::nullopt;
}

absl::Status ParseInt(const std::string& flag, const std::string& value, int lo, int hi, int* out) {
  int parsed = 0;
  if (!absl::SimpleAtoi(value, &parsed) || parsed < lo || parsed > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " = \"", value, "\" is not an integer in [", lo, ", ", hi, "]"));
  }
  *out = parsed;
  return absl::OkStatus();
}

}  // namespace

std::string DaemonUsage() {
  return R"(memplan-planner: the memplan planning service (gRPC memplan.v1.Planner).

Usage: memplan-planner [flags]

  --listen=HOST:PORT         gRPC address (default 127.0.0.1:50051; port 0 picks a free port,
                             printed as "listening on HOST:PORT")
  --metrics=HOST:PORT        Prometheus /metrics address (default 127.0.0.1:9464; "" disables;
                             port 0 picks a free port, printed as "metrics on HOST:PORT")
  --db=PATH                  SQLite database, created when missing (default ./memplan-planner.db)
  --log-level=LEVEL          debug | info | warning | error (default info; debug logs every RPC)
  --search-threads=N         plan-search threads (default 0 = one per CPU, at most 16)
  --max-queued-searches=N    searches waiting for a thread before RESOURCE_EXHAUSTED (default 256)
  --max-rpc-threads=N        gRPC server threads (default 64)
  --shutdown-grace-seconds=S on SIGTERM/SIGINT, how long in-flight RPCs may finish (default 10)
  --help                     this text

Also served: grpc.health.v1.Health and server reflection (grpc.reflection.v1alpha).
)";
}

absl::StatusOr<DaemonOptions> ParseDaemonOptions(const std::vector<std::string>& args) {
  DaemonOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      options.help = true;
      continue;
    }
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(
          absl::StrCat("unexpected argument \"", arg, "\"; see --help"));
    }
    std::string name = arg;
    std::string value;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    } else {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat(name, " needs a value; see --help"));
      }
      value = args[++i];
    }
    if (name == "--listen") {
      if (value.empty()) return absl::InvalidArgumentError("--listen must not be empty");
      options.listen_address = value;
    } else if (name == "--metrics") {
      options.metrics_address = value;
    } else if (name == "--db") {
      if (value.empty()) return absl::InvalidArgumentError("--db must not be empty");
      options.db_path = value;
    } else if (name == "--log-level") {
      std::optional<LogLevel> level = ParseLogLevel(value);
      if (!level.has_value()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--log-level = \"", value, "\" is not a level; allowed: debug, info, warning, error"));
      }
      options.log_level = *level;
    } else if (name == "--search-threads") {
      if (auto s = ParseInt(name, value, 0, 1024, &options.search_threads); !s.ok()) return s;
    } else if (name == "--max-queued-searches") {
      if (auto s = ParseInt(name, value, 0, 1 << 20, &options.max_queued_searches); !s.ok()) {
        return s;
      }
    } else if (name == "--max-rpc-threads") {
      if (auto s = ParseInt(name, value, 2, 4096, &options.max_rpc_threads); !s.ok()) return s;
    } else if (name == "--shutdown-grace-seconds") {
      double seconds = 0;
      if (!absl::SimpleAtod(value, &seconds) || !std::isfinite(seconds) || seconds < 0 ||
          seconds > 3600) {
        return absl::InvalidArgumentError(absl::StrCat("--shutdown-grace-seconds = \"", value,
                                                       "\" is not a number in [0, 3600]"));
      }
      options.shutdown_grace_seconds = seconds;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name, "; see --help"));
    }
  }
  return options;
}

}  // namespace memplan
