#include "planner/daemon/daemon_options.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
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

bool IsLoopbackAddress(const std::string& address) {
  if (absl::StartsWith(address, "unix:") || absl::StartsWith(address, "unix-abstract:")) {
    return true;
  }
  std::string host = address;
  if (const size_t colon = address.rfind(':'); colon != std::string::npos) {
    host = address.substr(0, colon);
  }
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return std::memcmp(&v6, &in6addr_loopback, sizeof(v6)) == 0;
  }
  return false;
}

std::string DaemonUsage() {
  return R"(memplan-planner: the memplan planning service (gRPC memplan.v1.Planner).

Usage: memplan-planner [flags]

  --listen=HOST:PORT         gRPC address (default 127.0.0.1:50051; port 0 picks a free port,
                             printed as "listening on HOST:PORT")
  --metrics=HOST:PORT        Prometheus /metrics address (default 127.0.0.1:9464; "" disables;
                             port 0 picks a free port, printed as "metrics on HOST:PORT")
  --metrics-plan-series=N    newest plans that keep memplan_plan_*_peak_bytes{plan_id} series
                             (default 256; older series are dropped; [1, 100000])
  --metrics-token-file=PATH  a scrape of /metrics must send "Authorization: Bearer TOKEN", TOKEN
                             being this file's first line (default: no auth). /metrics names plan
                             ids and hardware: set it, or keep --metrics on loopback
  --db=PATH                  SQLite database, created when missing (default ./memplan-planner.db;
                             an existing empty file is refused)
  --db-check=MODE            quick (default; PRAGMA quick_check) | full (integrity_check) | off:
                             a corrupt database refuses the start, naming the file
  --db-check-interval-hours=H
                             check again every H hours while serving (default 24; 0 = at start
                             only; [0, 8760]); a failure is logged and health turns NOT_SERVING
  --db-max-plans=N           stored plans kept, newest first (default 100000; 0 = no cap;
                             [0, 1000000000]); plans with measurements are always kept
  --db-max-plan-age-days=D   plans older than D days are deleted (default 30; 0 = never;
                             [0, 36500]); measured plans are kept
  --log-level=LEVEL          debug | info | warning | error (default info; debug logs every RPC)
  --search-threads=N         plan-search threads (default 0 = one per CPU, at most 16)
  --max-queued-searches=N    searches waiting for a thread before RESOURCE_EXHAUSTED (default 256)
  --max-rpc-threads=N        threads that run RPC handlers; Plan waits there for a search thread
                             (default 16)
  --max-queued-rpcs=N        calls waiting for a handler thread before RESOURCE_EXHAUSTED
                             (default 1024; refusals: memplan_planner_rpc_refused_total)
  --max-streams-per-connection=N
                             concurrent calls per client connection; more wait in the client's
                             HTTP/2 queue (default 64)
  --shutdown-grace-seconds=S on SIGTERM/SIGINT, how long in-flight RPCs may finish (default 10)

Transport security (gRPC's own TLS):
  --tls-cert=FILE            PEM server certificate (chain); turns TLS on. Needs --tls-key
  --tls-key=FILE             PEM private key of --tls-cert
  --tls-client-ca=FILE       PEM CA for client certificates (mutual TLS); a verified client
                             certificate may call the write RPCs
  --tls-client-auth=MODE     with --tls-client-ca: require (default; every connection needs a
                             client certificate) | optional (verified when presented; read RPCs
                             work without one)
  --auth-token-file=FILE     bearer tokens for the write RPCs (SubmitTrace, SubmitHardwareProfile,
                             ReportMeasurement): one "NAME ROLE TOKEN" per line, ROLE write (all
                             three) or report (ReportMeasurement only), '#' comments. With it or
                             --tls-client-ca, a write needs a token or a verified client
                             certificate (role write); reads stay open. Refusals are counted in
                             memplan_rpc_rejected_total
  --quarantine-step-ratio=R  a reported step time outside [predicted / R, predicted x R] is
                             stored quarantined, not applied to calibration (default 3; [1.1, 1000])
  --quarantine-burst=N       reports beyond N per minute from one client (token or certificate and
                             host) are quarantined (default 20; 0 = no limit). Measurements with a
                             peak above the plan's card are always quarantined
  --webhook=HOST:PORT        serve a Kubernetes validating admission webhook (AdmissionReview JSON,
                             POST /validate) over HTTPS with --tls-cert/--tls-key: pods annotated
                             memplan.dev/model and memplan.dev/gpu are denied when the job does
                             not fit that GPU (port 0 picks a free port, printed as "webhook on
                             HOST:PORT"; default off). Each connection has 10 s from accept for
                             its request; headers above 16 KiB get 431, bodies above 1 MiB 413
  --insecure                 allow plaintext gRPC on a non-loopback --listen address (refused
                             otherwise: anyone on the network could call it)
  --help                     this text

Also served: grpc.health.v1.Health and server reflection (grpc.reflection.v1alpha).
)";
}

absl::StatusOr<DaemonOptions> ParseDaemonOptions(const std::vector<std::string>& args) {
  DaemonOptions options;
  bool client_auth_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      options.help = true;
      continue;
    }
    if (arg == "--insecure") {
      options.insecure = true;
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
    } else if (name == "--webhook") {
      options.webhook_address = value;
    } else if (name == "--metrics") {
      options.metrics_address = value;
    } else if (name == "--metrics-token-file") {
      if (value.empty()) return absl::InvalidArgumentError("--metrics-token-file must not be empty");
      options.metrics_token_file = value;
    } else if (name == "--db") {
      if (value.empty()) return absl::InvalidArgumentError("--db must not be empty");
      options.db_path = value;
    } else if (name == "--db-check") {
      if (value == "quick") {
        options.db_check = DbCheck::kQuick;
      } else if (value == "full") {
        options.db_check = DbCheck::kFull;
      } else if (value == "off") {
        options.db_check = DbCheck::kOff;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "--db-check = \"", value.substr(0, 32), "\" is not a mode; allowed: quick, full, off"));
      }
    } else if (name == "--db-check-interval-hours") {
      double hours = 0;
      if (!absl::SimpleAtod(value, &hours) || !std::isfinite(hours) || hours < 0 || hours > 8760) {
        return absl::InvalidArgumentError(absl::StrCat("--db-check-interval-hours = \"",
                                                       value.substr(0, 32),
                                                       "\" is not a number in [0, 8760]"));
      }
      options.db_check_interval_hours = hours;
    } else if (name == "--db-max-plans") {
      if (auto s = ParseInt(name, value, 0, 1000000000, &options.db_max_plans); !s.ok()) return s;
    } else if (name == "--db-max-plan-age-days") {
      if (auto s = ParseInt(name, value, 0, 36500, &options.db_max_plan_age_days); !s.ok()) {
        return s;
      }
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
      if (auto s = ParseInt(name, value, 1, 1024, &options.max_rpc_threads); !s.ok()) return s;
    } else if (name == "--max-queued-rpcs") {
      if (auto s = ParseInt(name, value, 0, 1 << 20, &options.max_queued_rpcs); !s.ok()) return s;
    } else if (name == "--max-streams-per-connection") {
      if (auto s = ParseInt(name, value, 1, 1 << 16, &options.max_streams_per_connection);
          !s.ok()) {
        return s;
      }
    } else if (name == "--shutdown-grace-seconds") {
      double seconds = 0;
      if (!absl::SimpleAtod(value, &seconds) || !std::isfinite(seconds) || seconds < 0 ||
          seconds > 3600) {
        return absl::InvalidArgumentError(absl::StrCat("--shutdown-grace-seconds = \"", value,
                                                       "\" is not a number in [0, 3600]"));
      }
      options.shutdown_grace_seconds = seconds;
    } else if (name == "--tls-cert" || name == "--tls-key" || name == "--tls-client-ca" ||
               name == "--auth-token-file") {
      if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(name, " needs a file"));
      std::string& field = name == "--tls-cert"        ? options.tls_cert_file
                           : name == "--tls-key"       ? options.tls_key_file
                           : name == "--tls-client-ca" ? options.tls_client_ca_file
                                                       : options.auth_token_file;
      field = value;
    } else if (name == "--quarantine-step-ratio") {
      double ratio = 0;
      if (!absl::SimpleAtod(value, &ratio) || !std::isfinite(ratio) || ratio < 1.1 ||
          ratio > 1000) {
        return absl::InvalidArgumentError(absl::StrCat("--quarantine-step-ratio = \"", value,
                                                       "\" is not a number in [1.1, 1000]"));
      }
      options.quarantine_step_ratio = ratio;
    } else if (name == "--metrics-plan-series") {
      if (auto s = ParseInt(name, value, 1, 100000, &options.metrics_plan_series); !s.ok()) {
        return s;
      }
    } else if (name == "--quarantine-burst") {
      if (auto s = ParseInt(name, value, 0, 1000000, &options.quarantine_burst); !s.ok()) return s;
    } else if (name == "--tls-client-auth") {
      client_auth_given = true;
      if (value == "require") {
        options.client_cert_mode = ClientCertMode::kRequire;
      } else if (value == "optional") {
        options.client_cert_mode = ClientCertMode::kOptional;
      } else {
        return absl::InvalidArgumentError(absl::StrCat(
            "--tls-client-auth = \"", value, "\" is not a mode; allowed: require, optional"));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag ", name, "; see --help"));
    }
  }
  if (options.help) return options;
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-cert and --tls-key go together (the server certificate and its private key)");
  }
  if (client_auth_given && options.tls_client_ca_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-client-auth needs --tls-client-ca (the CA client certificates are checked against)");
  }
  if (!options.tls_client_ca_file.empty() && options.tls_cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--tls-client-ca needs --tls-cert and --tls-key: client certificates are checked only "
        "over TLS");
  }
  if (!options.webhook_address.empty() && options.tls_cert_file.empty()) {
    return absl::InvalidArgumentError(
        "--webhook needs --tls-cert and --tls-key: Kubernetes calls admission webhooks over HTTPS");
  }
  if (options.insecure && !options.tls_cert_file.empty()) {
    return absl::InvalidArgumentError("--insecure contradicts --tls-cert: give one of them");
  }
  if (options.tls_cert_file.empty() && !options.insecure &&
      !IsLoopbackAddress(options.listen_address)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", options.listen_address,
        " is not a loopback address and TLS is off: every host that reaches the port could store "
        "traces and report measurements. Give --tls-cert and --tls-key (and --tls-client-ca for "
        "mutual TLS), or --insecure to serve plaintext anyway"));
  }
  return options;
}

}  // namespace memplan
